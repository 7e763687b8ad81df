"""Test-fixture videos whose frames are checkable; the writer itself lives in `mmspec.media`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..media import available_video_codec, write_video  # noqa: F401 (re-exported)


def test_video_frames(num_frames: int = 16, height: int = 64, width: int = 64) -> np.ndarray:
    """Frames whose flat grey level encodes the frame index (level 8 + 15 * i), so sampling is checkable."""
    levels = (8 + 15 * np.arange(num_frames)) % 256
    return np.broadcast_to(levels[:, None, None, None], (num_frames, height, width, 3)).astype(np.uint8)


test_video_frames.__test__ = False  # a helper, not a pytest test


def write_test_video(path: str | Path, num_frames: int = 16, height: int = 64, width: int = 64, fps: int = 8) -> Path:
    """Write `test_video_frames(...)` to `path`: frame i has grey level 8 + 15 * i."""
    return write_video(path, test_video_frames(num_frames, height, width), fps=fps)


write_test_video.__test__ = False
