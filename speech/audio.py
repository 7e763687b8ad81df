"""Reading audio into float32 mono arrays at the model's rate, with one clear `MMSpecError` for bad input.

Any file FFmpeg (PyAV) can read works: wav, flac, mp3, ogg/opus, m4a, and the audio track of a
video. Channels are mixed down to mono and the signal is resampled with PyAV's own
`AudioResampler` (FFmpeg's swresample), so files and in-memory arrays take the same path.

Silence is not an error here: `is_silent` tells it apart, and the caller decides (a silent clip
may legitimately transcribe to nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MMSpecError
from ..optional import require

DEFAULT_SAMPLING_RATE = 16_000
AudioSource = str | Path | np.ndarray | Any  # also a torch tensor, or {"array": ..., "sampling_rate": ...}


def load_audio(
    source: AudioSource,
    sampling_rate: int = DEFAULT_SAMPLING_RATE,
    *,
    source_sampling_rate: int | None = None,
) -> np.ndarray:
    """Decode `source` into a 1-D float32 array of mono samples in [-1, 1] at `sampling_rate` Hz.

    Args:
        source: a path to any audio (or video) file PyAV reads; a numpy array (or torch tensor) of
            samples: 1-D mono, or 2-D [channels, samples] / [samples, channels] (the shorter axis is
            taken as the channels); integer arrays are scaled from their full range, float arrays
            are taken as in [-1, 1] (whole-number floats in int16's range are scaled as int16; other
            floats beyond +-2 are refused); or a dict as `datasets`' Audio feature gives it,
            `{"array": samples, "sampling_rate": rate}` (transformers' `"raw"` for `"array"` too;
            a dict with only a `"path"` reads that file).
        sampling_rate: the rate to return (the model's rate: 16 kHz for Whisper).
        source_sampling_rate: the rate of an array `source` (required for arrays; a dict carries its own).

    Raises:
        MMSpecError: missing, empty, corrupt or non-audio file; an array without its rate; no samples.
    """
    if not isinstance(sampling_rate, int) or sampling_rate <= 0:
        raise MMSpecError(f"sampling_rate must be a positive integer, got {sampling_rate!r}")
    if isinstance(source, dict):
        source, source_sampling_rate = _from_dict(source, source_sampling_rate)
    if _is_tensor(source):
        source = source.detach().cpu().float().numpy() if source.is_floating_point() else source.detach().cpu().numpy()
    if isinstance(source, np.ndarray):
        if source_sampling_rate is None:
            raise MMSpecError("an audio array needs its rate: pass source_sampling_rate=... (samples per second)")
        return _resample_array(_mono_float(source), int(source_sampling_rate), sampling_rate)
    if isinstance(source, (str, Path)):
        return _decode_file(_existing_file(source), sampling_rate)
    raise MMSpecError("audio must be a file path, an array of samples (with its sampling rate) or a dict "
                      f'{{"array": ..., "sampling_rate": ...}}, got {type(source).__name__}')


def _from_dict(source: dict[str, Any], rate: int | None) -> tuple[Any, int | None]:
    """(samples or path, rate) from `{"array" | "raw": samples, "sampling_rate": rate}` or `{"path": file}`."""
    samples = source.get("array", source.get("raw"))
    if samples is None:
        if source.get("path"):
            return source["path"], rate
        raise MMSpecError(f'an audio dict needs "array" (the samples) and "sampling_rate", got keys {sorted(source)}')
    given = source.get("sampling_rate")
    if given is None:
        if rate is None:
            raise MMSpecError('an audio dict needs "sampling_rate" (samples per second) beside "array"')
        given = rate
    if rate is not None and int(rate) != int(given):
        raise MMSpecError(f"the audio dict says {given} Hz but sampling_rate={rate} was passed: pass one")
    if isinstance(samples, (list, tuple)):
        samples = np.asarray(samples, dtype=np.float32)
    return samples, int(given)


def _is_tensor(source: Any) -> bool:
    """A torch tensor, without importing torch here (the speech adapter has it loaded already when one is passed)."""
    return type(source).__module__.startswith("torch") and hasattr(source, "detach")


def is_silent(audio: np.ndarray, threshold: float = 1e-3) -> bool:
    """True when the clip's RMS amplitude is below `threshold` (1e-3 is -60 dBFS), or it has no samples."""
    if audio.size == 0:
        return True
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))
    return rms < threshold


def split_chunks(audio: np.ndarray, chunk_seconds: float = 30.0, sampling_rate: int = DEFAULT_SAMPLING_RATE) -> list[np.ndarray]:
    """Cut a long clip into consecutive chunks of at most `chunk_seconds` (the last may be shorter).

    Whisper-style encoders read a fixed window (30 s for Whisper; shorter for the toy model):
    each chunk is transcribed on its own and the texts are joined.
    """
    if not chunk_seconds > 0:
        raise MMSpecError(f"chunk_seconds must be > 0, got {chunk_seconds}")
    size = int(round(chunk_seconds * sampling_rate))
    if size < 1:
        raise MMSpecError(f"chunks of {chunk_seconds} s at {sampling_rate} Hz hold no samples")
    return [audio[start : start + size] for start in range(0, audio.shape[0], size)]


def _existing_file(source: str | Path) -> Path:
    path = Path(source)
    if not path.exists():
        raise MMSpecError(f"audio file {str(path)!r} does not exist")
    if path.is_dir():
        raise MMSpecError(f"{str(path)!r} is a folder, not an audio file")
    if not path.is_file():  # /dev/zero would read forever, and stat() says 0 bytes
        raise MMSpecError(f"{str(path)!r} is not a regular file (a device, pipe or socket)")
    if path.stat().st_size == 0:
        raise MMSpecError(f"audio file {str(path)!r} is empty (0 bytes)")
    return path


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _decode_file(path: Path, sampling_rate: int) -> np.ndarray:
    av = require("av", "speech", "decoding audio")  # FFmpeg's libraries load only when needed
    try:
        container = av.open(str(path))
    except Exception as err:  # av.error.InvalidDataError, FileNotFoundError, ...: all "cannot read"
        raise MMSpecError(f"cannot read audio {str(path)!r}: not a readable audio file ({_reason(err)})") from err
    try:
        with container:
            if not container.streams.audio:
                raise MMSpecError(f"{str(path)!r} has no audio track")
            stream = container.streams.audio[0]
            _check_rate(stream.sample_rate, path)
            # Planar float at the target rate, original channel layout; channels are then averaged
            # (FFmpeg's own downmix would scale a stereo signal by 1/sqrt(2) instead).
            resampler = av.AudioResampler(format="fltp", rate=sampling_rate)
            buffer = _SampleBuffer(_expected_samples(container, stream, sampling_rate))
            for frame in container.decode(stream):
                frame.pts = None  # let the resampler count samples itself (robust to odd timestamps)
                buffer.extend(_frames_to_arrays(resampler.resample(frame)))
            buffer.extend(_frames_to_arrays(resampler.resample(None)))  # flush the resampler's delay
    except MMSpecError:
        raise
    except Exception as err:  # av.FFmpegError, codec errors, truncated files
        raise MMSpecError(f"cannot read audio {str(path)!r}: {_reason(err)}") from err
    audio = buffer.samples()
    if audio.size == 0:
        raise MMSpecError(f"audio {str(path)!r} holds no samples")
    return _peak_in_range(_finite(audio, str(path)), str(path))


MIN_FILE_RATE = 1000  # Hz; below any real recording: a header claiming less would blow a small file up at 16 kHz


def _check_rate(rate: int | None, path: Path) -> None:
    if rate and rate < MIN_FILE_RATE:  # 0 or None: the container does not say
        raise MMSpecError(f"audio {str(path)!r} says it is sampled at {rate} Hz (below {MIN_FILE_RATE} Hz): "
                          "a broken header, not a recording")


def _peak_in_range(audio: np.ndarray, what: str) -> np.ndarray:
    """A float file's samples far outside [-1, 1] are refused, as the same array is (`_float_scale`)."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak > FLOAT_PEAK_LIMIT:
        raise MMSpecError(f"float audio samples must lie in [-1, 1], those of {what} reach {peak:.4g}")
    return audio


class _SampleBuffer:
    """Decoded samples written into one preallocated array (sized from the container's duration, grown by half
    when that was short): a long file is held once at the model's rate, not as a list of pieces plus their
    concatenation."""

    def __init__(self, expected: int) -> None:
        self.data = np.empty(max(expected, 1 << 16), dtype=np.float32)
        self.size = 0

    def extend(self, arrays: list[np.ndarray]) -> None:
        for array in arrays:
            end = self.size + array.shape[0]
            if end > self.data.shape[0]:
                grown = np.empty(max(end, self.data.shape[0] * 3 // 2), dtype=np.float32)
                grown[: self.size] = self.data[: self.size]
                self.data = grown
            self.data[self.size : end] = array
            self.size = end

    def samples(self) -> np.ndarray:
        return self.data[: self.size]


def _expected_samples(container: Any, stream: Any, sampling_rate: int) -> int:
    """Samples at `sampling_rate` the container says it holds (plus 1 %), or 0 when it does not say."""
    av = require("av", "speech", "decoding audio")  # FFmpeg's libraries load only when needed
    seconds = None
    if stream.duration is not None and stream.time_base is not None:
        seconds = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        seconds = container.duration / av.time_base
    return int(seconds * sampling_rate * 1.01) + sampling_rate if seconds and seconds > 0 else 0


def _frames_to_arrays(frames: Any) -> list[np.ndarray]:
    if frames is None:
        return []
    if not isinstance(frames, (list, tuple)):
        frames = [frames]
    # Planar float: to_ndarray() is [channels, samples]; packed mono float is [1, samples].
    return [frame.to_ndarray().astype(np.float32, copy=False).mean(axis=0) for frame in frames]


def _mono_float(array: np.ndarray) -> np.ndarray:
    if array.ndim == 2:
        channel_axis = 0 if array.shape[0] <= array.shape[1] else 1
        array = _to_float(array).mean(axis=channel_axis)
    elif array.ndim == 1:
        array = _to_float(array)
    else:
        raise MMSpecError(f"an audio array must be 1-D (mono) or 2-D (channels x samples), got shape {tuple(array.shape)}")
    if array.size == 0:
        raise MMSpecError("the audio array holds no samples")
    return _finite(np.ascontiguousarray(array, dtype=np.float32), "the audio array")


def _to_float(array: np.ndarray) -> np.ndarray:
    if np.issubdtype(array.dtype, np.floating):
        return _float_scale(array.astype(np.float32, copy=False))
    if np.issubdtype(array.dtype, np.signedinteger):
        return array.astype(np.float32) / float(-np.iinfo(array.dtype).min)
    if np.issubdtype(array.dtype, np.unsignedinteger):
        half = (float(np.iinfo(array.dtype).max) + 1.0) / 2.0
        return (array.astype(np.float32) - half) / half
    raise MMSpecError(f"audio samples must be numbers, got dtype {array.dtype}")


INT16_SCALE = 32768.0
FLOAT_PEAK_LIMIT = 2.0  # float audio is in [-1, 1]; resampling and mixing may overshoot a little, never 2x


def _float_scale(array: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1]. Whole numbers within int16's range (a waveform read as int16 and cast to float,
    values in the thousands) are scaled from int16's full range; any other peak above 2 is refused, since
    Whisper would transcribe clipped noise into made-up text."""
    if array.size == 0 or not np.isfinite(array).all():
        return array  # `_mono_float` and `_finite` say what is wrong
    peak = float(np.max(np.abs(array)))
    if peak <= FLOAT_PEAK_LIMIT:
        return array
    if peak <= INT16_SCALE and np.array_equal(array, np.round(array)):
        return array / np.float32(INT16_SCALE)
    raise MMSpecError(f"float audio samples must lie in [-1, 1], these reach {peak:.4g}: scale them "
                      "(e.g. divide int16-range samples by 32768) or pass the integer array itself")


def _finite(audio: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(audio).all():
        raise MMSpecError(f"{what} contains NaN or infinite samples")
    return audio


def _resample_array(audio: np.ndarray, source_rate: int, rate: int) -> np.ndarray:
    av = require("av", "speech", "resampling audio")  # FFmpeg's libraries load only when needed
    if source_rate <= 0:
        raise MMSpecError(f"source_sampling_rate must be > 0, got {source_rate}")
    if source_rate == rate:
        return audio
    frame = av.AudioFrame.from_ndarray(audio[None, :], format="flt", layout="mono")
    frame.sample_rate = source_rate
    resampler = av.AudioResampler(format="fltp", layout="mono", rate=rate)
    pieces = _frames_to_arrays(resampler.resample(frame)) + _frames_to_arrays(resampler.resample(None))
    out = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    if out.size == 0:
        raise MMSpecError(f"the audio array is too short to resample from {source_rate} Hz to {rate} Hz")
    return out
