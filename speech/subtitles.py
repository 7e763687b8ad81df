"""Transcripts as files: plain text, JSON, SubRip (.srt) and WebVTT (.vtt), written atomically.

SRT: numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, the text, a blank line. WebVTT: a `WEBVTT`
header line and a blank line, then cues timed `HH:MM:SS.mmm --> HH:MM:SS.mmm`. Cue text never holds
an empty line (it would end the cue) and, in VTT, never the `-->` arrow. Segments without text are
left out; times are clamped so that every cue ends after it starts.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..batch_files import output_mode
from ..errors import MMSpecError

FORMATS = ("txt", "json", "srt", "vtt")


@dataclass(frozen=True)
class Segment:
    """A stretch of the audio and what was said in it (times in seconds)."""

    start_s: float
    end_s: float
    text: str


def timestamp(seconds: float, separator: str) -> str:
    milliseconds = max(0, int(round(seconds * 1000)))
    hours, rest = divmod(milliseconds, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _cues(segments: Iterable[Segment]) -> list[tuple[float, float, str]]:
    cues = []
    for segment in segments:
        text = " ".join(segment.text.split())  # one line: no blank line can end the cue early
        if not text:
            continue
        start = max(segment.start_s, cues[-1][1] if cues else 0.0)
        end = max(segment.end_s, start + 0.001)
        cues.append((start, end, text))
    return cues


def to_srt(segments: Iterable[Segment]) -> str:
    blocks = [f"{i}\n{timestamp(s, ',')} --> {timestamp(e, ',')}\n{text}\n" for i, (s, e, text) in enumerate(_cues(segments), 1)]
    return "\n".join(blocks)


def to_vtt(segments: Iterable[Segment]) -> str:
    blocks = [f"{timestamp(s, '.')} --> {timestamp(e, '.')}\n{text.replace('-->', '->')}\n" for s, e, text in _cues(segments)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def to_txt(segments: Iterable[Segment]) -> str:
    lines = [" ".join(s.text.split()) for s in segments]
    return "".join(f"{line}\n" for line in lines if line)


def to_json(segments: Iterable[Segment], **fields: Any) -> str:
    segments = list(segments)
    body = {**fields, "segments": [{"start": round(s.start_s, 3), "end": round(s.end_s, 3), "text": s.text} for s in segments]}
    return json.dumps(body, indent=2, ensure_ascii=False) + "\n"


def render(segments: Iterable[Segment], fmt: str, **fields: Any) -> str:
    """The transcript in `fmt` (txt, json, srt, vtt); `fields` go into the JSON object beside the segments."""
    if fmt == "txt":
        return to_txt(segments)
    if fmt == "json":
        return to_json(segments, **fields)
    if fmt == "srt":
        return to_srt(segments)
    if fmt == "vtt":
        return to_vtt(segments)
    raise MMSpecError(f"unknown output format {fmt!r}; choose from {', '.join(FORMATS)}")


def write_atomically(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: never a half-written file."""
    path = Path(path)
    if path.is_dir():
        raise MMSpecError(f"{str(path)!r} is a folder, not an output file")
    if not path.parent.is_dir():
        raise MMSpecError(f"cannot write {str(path)!r}: the folder {str(path.parent)!r} does not exist")
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, output_mode(path))  # not mkstemp's 0600
        os.replace(temporary, path)
    except OSError as error:
        raise MMSpecError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path
