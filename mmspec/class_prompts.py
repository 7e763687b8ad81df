"""A class-conditional image model's prompt -> its class id, from the class names alone (torch-free): the image
pipelines read prompts with it, and the CLI refuses an unknown class with it before torch is imported."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .errors import MMSpecError


def class_id_from_prompt(name: str, class_names: Sequence[str], synonyms: Mapping[str, str]) -> int:
    """A class name (case and spacing ignored), else free text holding the words of exactly one class name in any
    order ("a big red ball" -> "red circle"), after `synonyms` ({"ball": "circle", ...}) are applied to its words."""
    wanted = " ".join(name.lower().split())
    for i, known in enumerate(class_names):
        if " ".join(known.lower().split()) == wanted:
            return i
    words = {synonyms.get(w, w) for w in re.findall(r"[a-z0-9]+", wanted)}
    matches = [i for i, known in enumerate(class_names) if set(re.findall(r"[a-z0-9]+", known.lower())) <= words]
    if len(matches) == 1:
        return matches[0]
    shown = ", ".join(repr(n) for n in class_names[:12]) + (", ..." if len(class_names) > 12 else "")
    if matches:
        raise MMSpecError(f"{name!r} names {len(matches)} classes ({', '.join(repr(class_names[i]) for i in matches[:4])}"
                          f"{', ...' if len(matches) > 4 else ''}): name one")
    raise MMSpecError(f"unknown class {name!r}; known classes: {shown}")
