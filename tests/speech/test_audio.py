"""Audio loading: every PyAV-readable container, mono mix, resampling, and one clear error for bad input."""

import wave

import av
import numpy as np
import pytest

from mmspec import MMSpecError
from mmspec.speech.audio import is_silent, load_audio, split_chunks


def tone(rate, seconds=1.0, amplitude=0.5, freq=440.0):
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def write_wav(path, samples, rate, channels=1):
    data = (np.clip(samples, -1, 1) * 32767).astype(np.int16)
    if channels > 1:
        data = np.repeat(data[:, None], channels, axis=1)
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(channels)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(data.tobytes())
    return path


def write_with_pyav(path, samples, rate, fmt, codec, video=False):
    container = av.open(str(path), "w", format=fmt)
    if video:
        vstream = container.add_stream("mpeg4", rate=10)
        vstream.width, vstream.height, vstream.pix_fmt = 32, 32, "yuv420p"
    astream = container.add_stream(codec, rate=rate) if samples is not None else None
    if astream is not None:
        astream.layout = "mono"
    if video:
        for _ in range(5):
            frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
            for packet in vstream.encode(frame):
                container.mux(packet)
        for packet in vstream.encode(None):
            container.mux(packet)
    if astream is not None:
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
        frame.sample_rate = rate
        for item in (frame, None):
            for packet in astream.encode(item):
                container.mux(packet)
    container.close()
    return path


def test_wav_stereo_resampled_to_16k(tmp_path):
    path = write_wav(tmp_path / "tone.wav", tone(22050), 22050, channels=2)
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(audio.shape[0] - 16000) <= 32
    assert 0.45 < np.abs(audio).max() < 0.55  # channels averaged, not summed or panned


@pytest.mark.parametrize("fmt, codec, ext", [("flac", "flac", "flac"), ("mp3", "libmp3lame", "mp3")])
def test_compressed_formats(tmp_path, fmt, codec, ext):
    if codec not in av.codecs_available:
        pytest.skip(f"{codec} encoder not in this FFmpeg build")
    path = write_with_pyav(tmp_path / f"tone.{ext}", tone(24000), 24000, fmt, codec)
    audio = load_audio(path, sampling_rate=8000)
    assert abs(audio.shape[0] - 8000) < 1200  # mp3 adds encoder padding
    assert np.abs(audio).max() > 0.3


def test_audio_track_of_a_video(tmp_path):
    path = write_with_pyav(tmp_path / "clip.mp4", tone(16000, 0.5), 16000, "mp4", "aac", video=True)
    audio = load_audio(path)
    assert audio.shape[0] > 7000 and not is_silent(audio)


def test_array_input_needs_its_rate_and_is_resampled():
    samples = tone(48000)
    with pytest.raises(MMSpecError, match="source_sampling_rate"):
        load_audio(samples)
    audio = load_audio(samples, source_sampling_rate=48000)
    assert abs(audio.shape[0] - 16000) <= 32
    same = load_audio(samples[:1600], source_sampling_rate=16000)
    np.testing.assert_array_equal(same, samples[:1600])
    stereo_int = (np.stack([samples, samples]) * 32767).astype(np.int16)
    mono = load_audio(stereo_int, source_sampling_rate=48000)
    assert 0.45 < np.abs(mono).max() < 0.55


@pytest.mark.parametrize("case", ["missing", "empty", "corrupt", "text", "folder", "video_without_audio"])
def test_bad_files_raise_one_clear_error(tmp_path, case):
    path = tmp_path / "input.wav"
    if case == "empty":
        path.write_bytes(b"")
    elif case == "corrupt":
        path.write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(range(200)))
    elif case == "text":
        path = tmp_path / "notes.txt"
        path.write_text("this is not audio\n" * 20)
    elif case == "folder":
        path = tmp_path
    elif case == "video_without_audio":
        path = write_with_pyav(tmp_path / "silent.mp4", None, 16000, "mp4", None, video=True)
    with pytest.raises(MMSpecError):
        load_audio(path)


def test_zero_samples_and_bad_arrays():
    with pytest.raises(MMSpecError, match="no samples"):
        load_audio(np.zeros(0, np.float32), source_sampling_rate=16000)
    with pytest.raises(MMSpecError):
        load_audio(np.zeros((2, 2, 2), np.float32), source_sampling_rate=16000)
    with pytest.raises(MMSpecError, match="NaN"):
        load_audio(np.array([0.0, np.nan], np.float32), source_sampling_rate=16000)
    with pytest.raises(MMSpecError):
        load_audio(12345)


def test_wav_with_no_frames(tmp_path):
    path = write_wav(tmp_path / "zero.wav", np.zeros(0, np.float32), 16000)
    with pytest.raises(MMSpecError):
        load_audio(path)


def test_is_silent_and_split_chunks():
    assert is_silent(np.zeros(16000, np.float32))
    assert is_silent(np.zeros(0, np.float32))
    assert is_silent(np.full(100, 1e-4, np.float32))
    assert not is_silent(tone(16000))
    audio = np.arange(70, dtype=np.float32)
    chunks = split_chunks(audio, chunk_seconds=3.0, sampling_rate=10)
    assert [c.shape[0] for c in chunks] == [30, 30, 10]
    np.testing.assert_array_equal(np.concatenate(chunks), audio)
    assert split_chunks(np.zeros(0, np.float32), 30.0) == []
    with pytest.raises(MMSpecError):
        split_chunks(audio, chunk_seconds=0)
