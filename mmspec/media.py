"""Writing small videos with PyAV (demo assets, test fixtures, the shapes world); no external tools."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

from .errors import MMSpecError
from .optional import require

# Encoders tried in order; PyPI av wheels ship mpeg4 and libx264, some builds only libopenh264.
PREFERRED_CODECS = ("libx264", "mpeg4", "libopenh264")


def available_video_codec() -> str:
    """The first encoder from `PREFERRED_CODECS` this PyAV build has."""
    av = require("av", "vision", "writing a video")

    for name in PREFERRED_CODECS:
        try:
            av.codec.Codec(name, "w")
            return name
        except ValueError:  # av raises UnknownCodecError (a ValueError) for codecs not compiled in
            continue
    raise MMSpecError(f"this PyAV build has none of the video encoders {', '.join(PREFERRED_CODECS)}")


def write_video(path: str | Path, frames: np.ndarray, fps: int = 8, codec: str | None = None) -> Path:
    """Encode uint8 frames [T, H, W, 3] into a video file (e.g. `clip.mp4`); returns the path.

    Odd heights or widths are padded by repeating the last row / column (yuv420p needs even sides).
    """
    av = require("av", "vision", "writing a video")

    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or frames.shape[0] == 0:
        raise MMSpecError(f"frames must be a non-empty [T, H, W, 3] uint8 array, got {frames.dtype} {frames.shape}")
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec or available_video_codec(), rate=Fraction(int(fps), 1))
        stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
        stream.pix_fmt = "yuv420p"
        # High bit rate: decoded pixels should stay close to the originals (tests read them back).
        stream.bit_rate = 4_000_000
        for array in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        container.mux(stream.encode())  # flush the encoder
    return path


def write_audio(path: str | Path, samples: np.ndarray, sampling_rate: int = 16_000) -> Path:
    """Write mono float samples in [-1, 1] with PyAV; the codec follows the suffix (.flac, .wav, .ogg, .mp3)."""
    av = require("av", "speech", "writing audio")

    path = Path(path)
    codecs = {".flac": "flac", ".wav": "pcm_s16le", ".ogg": "libvorbis", ".mp3": "libmp3lame"}
    if path.suffix.lower() not in codecs:
        raise MMSpecError(f"cannot write audio as {path.suffix!r}; use one of {', '.join(codecs)}")
    pcm = (np.clip(np.asarray(samples, dtype=np.float32), -1, 1) * 32767).astype(np.int16)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codecs[path.suffix.lower()], rate=sampling_rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate = sampling_rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path


ANIMATED_SUFFIXES = {".gif", ".webp", ".png", ".apng"}


def is_animated_image(path: str | Path) -> bool:
    """Whether `path` is an image file with several frames (an animated GIF, WebP or PNG); reads the header only."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if path.suffix.lower() not in ANIMATED_SUFFIXES or not path.is_file():
        return False
    try:
        with Image.open(path) as image:
            return bool(getattr(image, "is_animated", False)) and getattr(image, "n_frames", 1) > 1
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return False
