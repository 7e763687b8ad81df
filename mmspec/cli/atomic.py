"""Write an output file atomically: into a temporary file beside it, then rename over it.

A run killed half way (Ctrl-C, out of memory, a full disk) leaves the old file or none, never a
partial one; the rename is atomic on one filesystem (POSIX `rename`, `os.replace`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..batch_files import output_mode
from ..errors import MMSpecError


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(temporary_path)` (a file in the same folder, with the same suffix), then rename it to `path`."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".partial{path.suffix}")
    os.close(handle)
    temporary_path = Path(temporary)
    try:
        write(temporary_path)
        os.chmod(temporary_path, output_mode(path))
        os.replace(temporary_path, path)
    except OSError as error:
        raise MMSpecError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
    finally:
        temporary_path.unlink(missing_ok=True)
    return path
