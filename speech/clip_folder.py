"""A folder of clips with their transcripts (`metadata.jsonl`), read and checked without torch: training and the
speech bench read it, and the CLI checks it before it imports torch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import MMSpecError

METADATA_FILE = "metadata.jsonl"


@dataclass
class Clip:
    """One line of metadata.jsonl: an audio file and its reference transcript."""

    path: Path
    text: str


def read_clip_folder(folder: str | Path) -> list[Clip]:
    """The clips listed in `folder/metadata.jsonl`, checked: one clear `MMSpecError` for any problem."""
    root = Path(folder)
    if not root.exists():
        raise MMSpecError(f"data folder {str(root)!r} does not exist")
    if not root.is_dir():
        raise MMSpecError(f"{str(root)!r} is not a folder; --data needs a folder holding {METADATA_FILE}")
    metadata = root / METADATA_FILE
    if not metadata.is_file():
        raise MMSpecError(f"{str(root)!r} has no {METADATA_FILE} (one JSON object per line: "
                          '{"file": "clip_00001.wav", "text": "the transcript"})')
    clips: list[Clip] = []
    try:
        lines = metadata.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise MMSpecError(f"cannot read {str(metadata)!r}: {error}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{METADATA_FILE} line {number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise MMSpecError(f"{where} is not valid JSON: {line[:80]!r}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str) or not isinstance(entry.get("text"), str):
            raise MMSpecError(f'{where} needs string fields "file" and "text", got {line[:80]!r}')
        path = root / entry["file"]
        if not path.is_file():
            raise MMSpecError(f"{where}: audio file {entry['file']!r} not found in {str(root)!r}")
        clips.append(Clip(path=path, text=entry["text"]))
    if not clips:
        raise MMSpecError(f"{str(metadata)!r} lists no clips")
    return clips
