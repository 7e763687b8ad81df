"""Audio files whose samples or header are out of bounds are refused in one line, like the same array would be."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from mmspec.errors import MMSpecError
from mmspec.speech.audio import load_audio

from .test_pipeline import speechy


def write_float_wav(path: Path, samples: np.ndarray, rate: int = 16000) -> Path:
    """A mono 32-bit IEEE float WAV (format tag 3), written by hand: the stdlib `wave` writes integers only."""
    data = samples.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE"
                     + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)
    return path


def test_a_float_wav_in_range_loads(tmp_path):
    samples = speechy(0.5)
    loaded = load_audio(write_float_wav(tmp_path / "ok.wav", samples))
    assert np.allclose(loaded[: samples.shape[0]], samples, atol=1e-4)


@pytest.mark.parametrize("peak", [3.0, 1000.0])
def test_a_float_wav_far_outside_minus_one_to_one_is_refused_like_the_array(tmp_path, peak):
    samples = speechy(0.5) / 0.5 * peak
    with pytest.raises(MMSpecError, match="must lie in"):
        load_audio(samples, source_sampling_rate=16000)
    with pytest.raises(MMSpecError, match="must lie in"):
        load_audio(write_float_wav(tmp_path / "loud.wav", samples))


def test_a_header_claiming_an_absurd_rate_is_refused(tmp_path):
    path = write_float_wav(tmp_path / "slow.wav", speechy(0.5)[:10000], rate=1)
    with pytest.raises(MMSpecError, match="1 Hz"):
        load_audio(path)


def test_a_device_file_is_not_read_as_audio():
    with pytest.raises(MMSpecError, match="not a regular file"):
        load_audio("/dev/zero")
