"""Reading images and videos into arrays, with one clear `MMSpecError` for any bad file or array.

An image is a file path, a PIL image, or an HxWx3 uint8 array / tensor. A video is a file path,
frames [T, H, W, 3] uint8 as an array or tensor (a tensor may also be [T, 3, H, W], torchvision's
order), or a list of frames (PIL images or HxWx3 uint8 arrays / tensors) of one size.

Videos are decoded with PyAV. Frames are chosen in two passes: a cheap demux pass counts the
frames (no decoding), then one decoding pass converts only the chosen frames to RGB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import av
import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ..errors import MMSpecError

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
    if fps is not None and not fps > 0:
        raise MMSpecError(f"fps must be > 0, got {fps}")
    path = _existing_file(path, "video")
    try:
        if fps is not None:
            frames = _decode_at_rate(path, fps)
            if num_frames is not None and len(frames) > num_frames:
                frames = [frames[i] for i in _uniform_indices(len(frames), num_frames)]
        else:
            total = _count_frames(path)
            if total == 0:
                raise MMSpecError(f"video {str(path)!r} has no frames")
            wanted = list(range(total)) if num_frames is None else _uniform_indices(total, num_frames)
            frames = _decode_indices(path, wanted)
    except MMSpecError:
        raise
    except Exception as err:  # av.FFmpegError, OSError, codec errors: all mean "cannot read this video"
        raise MMSpecError(f"cannot read video {str(path)!r}: {_reason(err)}") from err
    if not frames:
        raise MMSpecError(f"video {str(path)!r} has no frames")
    return np.stack(frames)


def _uniform_indices(total: int, count: int) -> list[int]:
    """`count` indices into `total` items, evenly spaced from the first to the last."""
    return np.linspace(0, total - 1, count).round().astype(int).tolist()


def _open_video(path: Path) -> tuple[Any, Any]:
    container = av.open(str(path))
    if not container.streams.video:
        container.close()
        raise MMSpecError(f"{str(path)!r} has no video stream (is it an audio or image file?)")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    return container, stream


def _count_frames(path: Path) -> int:
    """Frames in the first video stream, counted by demuxing (each video packet is one frame)."""
    container, stream = _open_video(path)
    with container:
        count = sum(1 for packet in container.demux(stream) if packet.size > 0)
    return count


def _decode_indices(path: Path, wanted: list[int]) -> list[np.ndarray]:
    """The frames at `wanted` (presentation order, repeats allowed), decoded in one pass."""
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
        return _decode_indices(path, _uniform_indices(decoded, len(wanted)))
    return [found[i] for i in wanted]


def _decode_at_rate(path: Path, fps: float) -> list[np.ndarray]:
    """One frame per 1/fps seconds of video time: the first frame at or after each tick."""
    frames: list[np.ndarray] = []
    container, stream = _open_video(path)
    with container:
        start: float | None = None
        next_tick = 0.0
        rate = float(stream.average_rate or stream.guessed_rate or fps)
        for index, frame in enumerate(container.decode(stream)):
            # Frames without timestamps (some raw streams) are placed by their index at the nominal rate.
            time = frame.time if frame.time is not None else index / rate
            start = time if start is None else start
            if time - start >= next_tick - 1e-6:
                frames.append(frame.to_ndarray(format="rgb24"))
                while next_tick <= time - start + 1e-6:
                    next_tick += 1.0 / fps
    return frames


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
