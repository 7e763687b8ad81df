"""Writing small videos with PyAV: test fixtures and demo assets, no external tools needed."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from ..errors import MMSpecError

# Encoders tried in order; PyPI av wheels ship mpeg4 and libx264, some builds only libopenh264.
PREFERRED_CODECS = ("mpeg4", "libx264", "libopenh264")


def available_video_codec() -> str:
    """The first encoder from `PREFERRED_CODECS` this PyAV build has."""
    for name in PREFERRED_CODECS:
        try:
            av.codec.Codec(name, "w")
            return name
        except Exception:  # av raises UnknownCodecError (a ValueError) for codecs not compiled in
            continue
    raise MMSpecError(f"this PyAV build has none of the video encoders {', '.join(PREFERRED_CODECS)}")


def write_video(path: str | Path, frames: np.ndarray, fps: int = 8, codec: str | None = None) -> Path:
    """Encode frames [T, H, W, 3] uint8 (H and W even, as yuv420p needs) into an .mp4 file."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or frames.shape[0] == 0:
        raise MMSpecError(f"frames must be a non-empty [T, H, W, 3] uint8 array, got {frames.dtype} {frames.shape}")
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise MMSpecError(f"frame height and width must be even for yuv420p, got {frames.shape[1]}x{frames.shape[2]}")
    path = Path(path)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec or available_video_codec(), rate=Fraction(fps))
        stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
        stream.pix_fmt = "yuv420p"
        # High bit rate: the point of a test video is that decoded pixels stay close to the originals.
        stream.bit_rate = 4_000_000
        for array in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        container.mux(stream.encode())  # flush the encoder
    return path


def test_video_frames(num_frames: int = 16, height: int = 64, width: int = 64) -> np.ndarray:
    """Frames whose flat grey level encodes the frame index (level 8 + 15 * i), so sampling is checkable."""
    levels = (8 + 15 * np.arange(num_frames)) % 256
    return np.broadcast_to(levels[:, None, None, None], (num_frames, height, width, 3)).astype(np.uint8)


test_video_frames.__test__ = False  # a helper, not a pytest test


def write_test_video(path: str | Path, num_frames: int = 16, height: int = 64, width: int = 64, fps: int = 8) -> Path:
    """Write `test_video_frames(...)` to `path`: frame i has grey level 8 + 15 * i."""
    return write_video(path, test_video_frames(num_frames, height, width), fps=fps)


write_test_video.__test__ = False
