"""Limits on what the page accepts, and the one clear message a bad upload gets."""

from __future__ import annotations

from pathlib import Path

from ..errors import MMSpecError

MAX_UPLOAD_MB = 20
MAX_AUDIO_SECONDS = 120
LIMITS_NOTE = (f"Uploads up to {MAX_UPLOAD_MB} MB; audio up to {MAX_AUDIO_SECONDS} s; "
               "a video is read as a few frames sampled uniformly.")


def checked_upload(path: str | None, kind: str) -> str:
    """The uploaded file's path, or one clear error: nothing uploaded, empty file, or over the size limit.
    Whether the content is a readable video / audio is the pipeline's to say (it raises `MMSpecError`)."""
    if not path:
        raise MMSpecError(f"no {kind} given: upload one (or pick the sample)")
    file = Path(path)
    if not file.is_file():
        raise MMSpecError(f"the uploaded {kind} is gone from the server's temporary folder: upload it again")
    size = file.stat().st_size
    if size == 0:
        raise MMSpecError(f"the uploaded {kind} {file.name!r} is empty (0 bytes)")
    if size > MAX_UPLOAD_MB * 1024 * 1024:
        raise MMSpecError(f"the uploaded {kind} is {size / 2**20:.1f} MB; the limit is {MAX_UPLOAD_MB} MB")
    return str(file)


def check_audio_length(path: str) -> None:
    """Refuse audio longer than `MAX_AUDIO_SECONDS` (from the container's header; unreadable files are left
    to the pipeline, whose error names the problem)."""
    try:
        import av

        with av.open(path) as container:
            seconds = container.duration / 1e6 if container.duration else None
    except Exception:  # noqa: BLE001 - not readable here: the pipeline reports it clearly
        return
    if seconds is not None and seconds > MAX_AUDIO_SECONDS:
        raise MMSpecError(f"the audio is {seconds:.0f} s long; the limit is {MAX_AUDIO_SECONDS} s")


def page_message(error: BaseException, path: str | None = None) -> str:
    """The error as the page shows it: the server's temporary path of an upload replaced by the file's name."""
    text = str(error)
    return text.replace(path, Path(path).name) if path else text
