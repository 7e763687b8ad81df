"""Reading images and videos into arrays, with one clear `MMSpecError` for any bad file or array.

An image is a file path, a PIL image, or an HxWx3 uint8 array / tensor. A video is a file path,
frames [T, H, W, 3] uint8 as an array or tensor (a tensor may also be [T, 3, H, W], torchvision's
order), or a list of frames (PIL images or HxWx3 uint8 arrays / tensors) of one size.

Videos are decoded with PyAV. Frames are chosen before any is decoded: a cheap demux pass reads
every frame's timestamp (no decoding), then each chosen frame is reached by seeking to the key frame
before it and decoding forward, and only the chosen frames are converted to RGB; memory holds the
chosen frames, whatever the video's length or rate. An animated GIF, WebP or PNG is a video too
(PIL reads its frames and their durations).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ..errors import MMSpecError
from ..media import is_animated_image
from ..optional import require

ImageSource = str | Path | Image.Image | np.ndarray | torch.Tensor
VideoSource = str | Path | np.ndarray | torch.Tensor | Sequence[Image.Image | np.ndarray | torch.Tensor]


def load_image(source: ImageSource) -> Image.Image:
    """An RGB PIL image from a file path, a PIL image, or an HxWx3 uint8 array / tensor (a tensor may be 3xHxW)."""
    if isinstance(source, Image.Image):
        return source.convert("RGB")
    if isinstance(source, (np.ndarray, torch.Tensor)):
        return _image_from_array(source)
    if isinstance(source, (str, Path)):
        path = _existing_file(source, "image")
        try:
            with Image.open(path) as image:
                return image.convert("RGB")  # convert() reads the pixels, so errors surface here
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as err:
            raise MMSpecError(f"cannot read image {str(path)!r}: not a readable image file ({_reason(err)})") from err
    raise MMSpecError(f"an image must be a path, a PIL image or an HxWx3 uint8 array, got {type(source).__name__}")


def _image_from_array(array: np.ndarray | torch.Tensor) -> Image.Image:
    if isinstance(array, torch.Tensor):
        if array.dim() == 3 and array.shape[0] == 3 and array.shape[-1] != 3:
            array = array.permute(1, 2, 0)  # [3, H, W] (torchvision's order) -> [H, W, 3]
        array = array.detach().cpu().numpy()
    if array.ndim != 3 or array.shape[2] != 3:
        raise MMSpecError(f"an image array must be HxWx3 (channels last), got shape {tuple(array.shape)}")
    if array.dtype != np.uint8:
        raise MMSpecError(f"an image array must be uint8 (0-255), got {array.dtype}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise MMSpecError(f"an image array must not be empty, got shape {tuple(array.shape)}")
    return Image.fromarray(np.ascontiguousarray(array))


def load_frames(source: VideoSource, num_frames: int | None = 8, fps: float | None = None) -> np.ndarray:
    """Video frames [T, H, W, 3] uint8 from any video form (see the module docstring).

    A file is decoded with `load_video(path, num_frames, fps)`; frames given in memory are checked and
    used as they are (an array already in that form is returned unchanged).
    """
    if isinstance(source, (str, Path)):
        return load_video(source, num_frames=num_frames, fps=fps)
    if isinstance(source, (np.ndarray, torch.Tensor)):
        return _frames_from_array(source)
    if isinstance(source, (list, tuple)):
        if not source:
            raise MMSpecError("the list of video frames is empty")
        frames = [np.asarray(_frame(item, i)) for i, item in enumerate(source)]
        sizes = sorted({frame.shape for frame in frames})
        if len(sizes) > 1:
            raise MMSpecError(f"video frames must all have one size, got {', '.join(str(s) for s in sizes)}")
        return np.stack(frames)
    raise MMSpecError("a video must be a file path, a [T, H, W, 3] uint8 array or tensor, or a list of frames "
                      f"(PIL images or HxWx3 arrays), got {type(source).__name__}")


def _frame(item: Any, index: int) -> Image.Image:
    if not isinstance(item, (Image.Image, np.ndarray, torch.Tensor)):
        raise MMSpecError(f"video frame {index} must be a PIL image or an HxWx3 uint8 array, got {type(item).__name__}")
    try:
        return load_image(item)
    except MMSpecError as error:
        raise MMSpecError(f"video frame {index}: {error}") from None


def _frames_from_array(array: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(array, torch.Tensor):
        if array.dim() == 4 and array.shape[1] == 3 and array.shape[-1] != 3:
            array = array.permute(0, 2, 3, 1)  # [T, 3, H, W] -> [T, H, W, 3]
        array = array.detach().cpu().numpy()
    if array.ndim != 4 or array.shape[-1] != 3:
        raise MMSpecError(f"video frames must be [T, H, W, 3] (channels last), got shape {tuple(array.shape)}")
    if array.dtype != np.uint8:
        raise MMSpecError(f"video frames must be uint8 (0-255), got {array.dtype}")
    if 0 in array.shape:
        raise MMSpecError(f"video frames must not be empty, got shape {tuple(array.shape)}")
    return array


def load_video(path: str | Path, num_frames: int | None = 8, fps: float | None = None) -> np.ndarray:
    """Decode a video into RGB frames [T, H, W, 3] uint8.

    Args:
        path: any video file FFmpeg (PyAV) can read.
        num_frames: how many frames to return, spread uniformly from the first frame to the last
            (frames repeat if the video is shorter). With `fps`, an upper bound on the count.
            None with no `fps`: every frame.
        fps: sample at this rate (frames per second of video time) instead.
    """
    if num_frames is not None and num_frames < 1:
        raise MMSpecError(f"num_frames must be >= 1 (or None for all frames), got {num_frames}")
    if fps is not None and not (math.isfinite(fps) and fps > 0):
        raise MMSpecError(f"fps must be a finite number > 0, got {fps}")
    path = _existing_file(path, "video")
    if is_animated_image(path):
        return _load_animated(path, num_frames, fps)
    try:
        times = _frame_times(path)
        if not times:
            raise MMSpecError(f"video {str(path)!r} has no frames")
        wanted = _choose_frames(times, num_frames, fps)
        frames = _decode_indices(path, wanted, times)
    except MMSpecError:
        raise
    except Exception as err:  # av.FFmpegError, OSError, codec errors: all mean "cannot read this video"
        raise MMSpecError(f"cannot read video {str(path)!r}: {_reason(err)}") from err
    if not frames:
        raise MMSpecError(f"video {str(path)!r} has no frames")
    return np.stack(frames)


def _choose_frames(times: list[float | None], num_frames: int | None, fps: float | None) -> list[int]:
    """Indices (presentation order) of the frames to keep: every 1/fps seconds (the first frame at or after
    each tick), capped at `num_frames` spread uniformly; without fps, `num_frames` spread uniformly."""
    if fps is None:
        return list(range(len(times))) if num_frames is None else _uniform_indices(len(times), num_frames)
    rate = _nominal_rate(times)
    # Frames without timestamps (some raw streams) are placed by their index at the nominal rate.
    placed = [t if t is not None else i / rate for i, t in enumerate(times)]
    chosen, start, next_tick = [], placed[0], 0.0
    for index, time in enumerate(placed):
        if time - start >= next_tick - 1e-6:
            chosen.append(index)
            next_tick = math.floor((time - start) * fps + 1e-6) / fps + 1.0 / fps
    if num_frames is not None and len(chosen) > num_frames:
        chosen = [chosen[i] for i in _uniform_indices(len(chosen), num_frames)]
    return chosen


def _nominal_rate(times: list[float | None]) -> float:
    known = [t for t in times if t is not None]
    if len(known) >= 2 and known[-1] > known[0]:
        return (len(known) - 1) / (known[-1] - known[0])
    return 25.0


def _uniform_indices(total: int, count: int) -> list[int]:
    """`count` indices into `total` items, evenly spaced from the first to the last."""
    return np.linspace(0, total - 1, count).round().astype(int).tolist()


def _open_video(path: Path) -> tuple[Any, Any]:
    av = require("av", "vision", "decoding a video")  # FFmpeg's libraries load only when needed
    container = av.open(str(path))
    if not container.streams.video:
        container.close()
        raise MMSpecError(f"{str(path)!r} has no video stream (is it an audio or image file?)")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    return container, stream


def _frame_times(path: Path) -> list[float | None]:
    """Presentation times (seconds) of the frames of the first video stream, in presentation order, read by
    demuxing alone (one packet per frame, no decoding); None for frames without a timestamp."""
    container, stream = _open_video(path)
    with container:
        stamps = [packet.pts for packet in container.demux(stream) if packet.size > 0]
    base = float(stream.time_base) if stream.time_base else None
    if base is None or any(stamp is None for stamp in stamps):
        return [None] * len(stamps)
    return [stamp * base for stamp in sorted(stamps)]


def _decode_indices(path: Path, wanted: list[int], times: list[float | None]) -> list[np.ndarray]:
    """The frames at `wanted` (presentation order, repeats allowed): seek to each one's key frame and decode
    forward when timestamps allow, else one pass over the stream; only the wanted frames become RGB."""
    av = require("av", "vision", "decoding a video")  # FFmpeg's libraries load only when needed
    if all(t is not None for t in times):
        try:
            found = _decode_by_seeking(path, sorted(set(wanted)), times)
            return [found[i] for i in wanted]
        except (KeyError, av.FFmpegError):
            pass  # a stream whose seeking or timestamps cannot be trusted: read it from the start
    return _decode_in_one_pass(path, wanted)


def _decode_by_seeking(path: Path, wanted: list[int], times: list[float]) -> dict[int, np.ndarray]:
    found: dict[int, np.ndarray] = {}
    container, stream = _open_video(path)
    with container:
        base = float(stream.time_base)
        for index in wanted:
            target = times[index]
            # To the key frame at or before the target, then decode forward to it.
            container.seek(round(target / base), stream=stream, backward=True, any_frame=False)
            for frame in container.decode(stream):
                if frame.pts is None:
                    raise KeyError(index)
                position = frame.pts * base
                if position >= target - 1e-6:
                    found[index] = frame.to_ndarray(format="rgb24")
                    break
    return found


def _decode_in_one_pass(path: Path, wanted: list[int]) -> list[np.ndarray]:
    """The frames at `wanted`, decoded in one pass from the start."""
    wanted_set = set(wanted)
    last = max(wanted)
    found: dict[int, np.ndarray] = {}
    decoded = 0
    container, stream = _open_video(path)
    with container:
        for index, frame in enumerate(container.decode(stream)):
            decoded = index + 1
            if index in wanted_set:
                found[index] = frame.to_ndarray(format="rgb24")
            if index >= last:
                break
    if len(found) < len(wanted_set):
        if decoded == 0:
            return []
        # Fewer frames decoded than packets demuxed (a damaged stream): spread over the frames that exist.
        return _decode_in_one_pass(path, _uniform_indices(decoded, len(wanted)))
    return [found[i] for i in wanted]



def _load_animated(path: Path, num_frames: int | None, fps: float | None) -> np.ndarray:
    """The frames of an animated image, chosen like a video's (its frame durations give the times)."""
    try:
        with Image.open(path) as image:
            times, elapsed = [], 0.0
            for index in range(image.n_frames):
                image.seek(index)
                times.append(elapsed)
                elapsed += float(image.info.get("duration") or 100) / 1000  # GIF's default: 100 ms
            frames = []
            for index in _choose_frames(times, num_frames, fps):
                image.seek(index)
                frames.append(np.asarray(image.convert("RGB")))
    except (UnidentifiedImageError, OSError, ValueError, EOFError, Image.DecompressionBombError) as err:
        raise MMSpecError(f"cannot read animated image {str(path)!r}: {_reason(err)}") from err
    return np.stack(frames)


def _existing_file(path: str | Path, kind: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise MMSpecError(f"{kind} file not found: {str(path)!r}")
    if not path.is_file():
        raise MMSpecError(f"{kind} path is not a file: {str(path)!r}")
    if path.stat().st_size == 0:
        raise MMSpecError(f"{kind} file is empty: {str(path)!r}")
    return path


def _reason(err: BaseException) -> str:
    """A short, single-line reason from a library exception."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return text or type(err).__name__
