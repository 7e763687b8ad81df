"""Cheap checks that a single input file can be read, run before any model loads.

A verb given one empty or corrupt file should refuse it at once, not after importing torch and loading a
model. These probes read only the file's header and its first frame (PyAV for video and audio, PIL for
images; neither imports torch) and fail with the messages the full readers (`mmspec.vision.inputs`,
`mmspec.speech.audio`) give for the same file. A file that passes may still fail in the full reader
(damage past the first frame); that reader's error then stands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import MMSpecError
from ..media import ANIMATED_SUFFIXES, is_animated_image  # noqa: F401 - the probes test as the readers do
from ..optional import require


def _reason(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _non_empty(path: Path, empty: str) -> None:
    if path.is_file() and path.stat().st_size == 0:
        raise MMSpecError(empty)


def probe_image(path: str | Path) -> None:
    """MMSpecError unless PIL can open and decode the still image at `path`."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    _non_empty(path, f"image file is empty: {str(path)!r}")
    try:
        with Image.open(path) as image:
            image.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as err:
        raise MMSpecError(f"cannot read image {str(path)!r}: not a readable image file ({_reason(err)})") from err


def probe_animated_image(path: str | Path) -> None:
    """MMSpecError unless PIL can open the animated image at `path` and decode its first frame."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        with Image.open(path) as image:
            image.seek(0)
            image.load()
    except (UnidentifiedImageError, OSError, ValueError, EOFError, Image.DecompressionBombError) as err:
        raise MMSpecError(f"cannot read animated image {str(path)!r}: {_reason(err)}") from err


def probe_video(path: str | Path) -> None:
    """MMSpecError unless `path` holds a video stream that yields a frame."""
    path = Path(path)
    _non_empty(path, f"video file is empty: {str(path)!r}")
    av = require("av", "vision", "decoding a video")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MMSpecError(f"{str(path)!r} has no video stream (is it an audio or image file?)")
            if _first_frame(container, container.streams.video[0]) is None:
                raise MMSpecError(f"video {str(path)!r} has no frames")
    except MMSpecError:
        raise
    except Exception as err:  # av.FFmpegError, OSError, codec errors: all mean "cannot read this video"
        raise MMSpecError(f"cannot read video {str(path)!r}: {_reason(err)}") from err


def probe_audio(path: str | Path) -> None:
    """MMSpecError unless `path` holds an audio track that yields samples."""
    path = Path(path)
    _non_empty(path, f"audio file {str(path)!r} is empty (0 bytes)")
    av = require("av", "speech", "decoding audio")
    try:
        container = av.open(str(path))
    except Exception as err:  # av.error.InvalidDataError and the like: "cannot read"
        raise MMSpecError(f"cannot read audio {str(path)!r}: not a readable audio file ({_reason(err)})") from err
    try:
        with container:
            if not container.streams.audio:
                raise MMSpecError(f"{str(path)!r} has no audio track")
            if _first_frame(container, container.streams.audio[0]) is None:
                raise MMSpecError(f"audio {str(path)!r} holds no samples")
    except MMSpecError:
        raise
    except Exception as err:  # codec errors, truncated files
        raise MMSpecError(f"cannot read audio {str(path)!r}: {_reason(err)}") from err


def _first_frame(container: Any, stream: Any) -> Any:
    for frame in container.decode(stream):
        return frame
    return None

