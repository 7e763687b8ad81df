"""Cheap checks that a single input file can be read, run before any model loads.

A verb given one empty or corrupt file should refuse it at once, not after importing torch and loading a
model. These probes read only the file's header and its first frame (PyAV for video and audio, PIL for
images; neither imports torch) and fail with the messages the full readers (`mmspec.vision.inputs`,
`mmspec.speech.audio`) give for the same file. A file that passes may still fail in the full reader
(damage past the first frame); that reader's error then stands.
"""

from __future__ import annotations

from collections.abc import Callable
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
            stream = container.streams.audio[0]
            if _first_frame(container, stream) is None:
                raise MMSpecError(f"audio {str(path)!r} holds no samples")
            rate, seconds = stream.sample_rate, _claimed_seconds(container, stream, av.time_base)
    except MMSpecError:
        raise
    except Exception as err:  # codec errors, truncated files
        raise MMSpecError(f"cannot read audio {str(path)!r}: {_reason(err)}") from err
    _probe_audio_content(path, rate, seconds)


MIN_AUDIO_S = 0.2  # mmspec.speech.pipeline.MIN_AUDIO_S (a test keeps them equal)
WHOLE_READ_S = 120.0  # a file that says it is this short (or does not say, and is small) is decoded whole here
WHOLE_READ_BYTES = 16 << 20


def _claimed_seconds(container: Any, stream: Any, time_base: int) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    return container.duration / time_base if container.duration is not None else None


def _probe_audio_content(path: Path, rate: int | None, seconds: float | None) -> None:
    """What only the samples tell (a header claiming an absurd rate, float samples far outside [-1, 1], NaN, a
    clip too short for speech), with the full reader's messages: a short file is decoded whole (milliseconds),
    a long one only has its rate checked (the transcription reads it once, later)."""
    from ..speech.audio import DEFAULT_SAMPLING_RATE, MIN_FILE_RATE, load_audio

    short = seconds <= WHOLE_READ_S if seconds is not None else path.stat().st_size <= WHOLE_READ_BYTES
    if not short and not (rate and rate < MIN_FILE_RATE):
        return
    samples = load_audio(path, DEFAULT_SAMPLING_RATE)  # refuses a broken rate before decoding anything
    duration = samples.shape[0] / DEFAULT_SAMPLING_RATE
    if duration < MIN_AUDIO_S:  # as mmspec.speech.pipeline.check_duration says it
        raise MMSpecError(f"audio {str(path)!r} lasts {duration:.2f} s: too short to hold speech (at least {MIN_AUDIO_S} s)")


def _first_frame(container: Any, stream: Any) -> Any:
    for frame in container.decode(stream):
        return frame
    return None



def any_readable(files: list[Path], probe: Callable[[Path], None]) -> bool:
    """Whether some file passes `probe` (stops at the first that does): when none does, a folder run needs no model."""
    for path in files:
        try:
            probe(path)
        except MMSpecError:
            continue
        return True
    return False


def refusal(probe: Callable[[Path], None]) -> Callable[[Path], Any]:
    """A folder run's per-file step when no file was readable: the file's probe error (read again, as it is now)."""

    def step(path: Path) -> Any:
        probe(path)
        raise MMSpecError(f"{str(path)!r} changed while mmspec read it: run again")

    return step
