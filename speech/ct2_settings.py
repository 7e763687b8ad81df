"""The fields of a CTranslate2 Whisper folder's config.json, checked before they are used: a JSON object whose
token-id lists hold integers and whose alignment heads are [layer, head] pairs; anything else is one error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import MMSpecError

ID_LISTS = ("suppress_ids", "suppress_ids_begin", "lang_ids")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checked_settings(settings: Any, path: Path) -> dict[str, Any]:
    """`settings` (config.json's content) if well formed; MMSpecError naming the bad field otherwise."""
    if not isinstance(settings, dict):
        raise MMSpecError(f"{str(path)!r} must hold a JSON object (CTranslate2's settings), got a {type(settings).__name__}")
    for name in ID_LISTS:
        if name in settings and not (isinstance(settings[name], list) and all(_is_int(t) and t >= 0 for t in settings[name])):
            raise MMSpecError(f"{str(path)!r}: {name!r} must be a list of token ids (integers >= 0), got {settings[name]!r}")
    heads = settings.get("alignment_heads", [])
    if not isinstance(heads, list) or not all(isinstance(h, list) and len(h) == 2 and all(_is_int(x) and x >= 0 for x in h)
                                              for h in heads):
        raise MMSpecError(f"{str(path)!r}: 'alignment_heads' must be a list of [layer, head] integer pairs, got {heads!r}")
    return settings
