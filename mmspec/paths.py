"""Paths read from a file (a model card, distillation metadata) stay inside the folder that holds that file:
an absolute path, a `..` or a symbolic link out of it is refused, so a crafted folder cannot make mmspec
open files elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import MMSpecError


def inside(folder: Path, name: Any, what: str) -> Path:
    """`folder / name` resolved; MMSpecError unless `name` is a non-empty relative path that stays in `folder`."""
    if not isinstance(name, str) or not name:
        raise MMSpecError(f"{what}: expected a path inside {str(folder)!r}, got {name!r}")
    base = folder.resolve()
    path = (folder / name).resolve()
    if path != base and base not in path.parents:
        raise MMSpecError(f"{what} {name!r} lies outside {str(folder)!r}: a path it names must stay inside that folder")
    return path
