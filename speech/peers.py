"""faster-whisper (CTranslate2) as a peer in `mmspec bench speech`: the engine CPU users run today.

Rows `faster-whisper-float32` and `faster-whisper-int8` transcribe the bench's clips from their files with
faster-whisper's own `WhisperModel.transcribe`, on the folder mmspec reads the model from (a CTranslate2
Whisper folder, as the zoo's whisper-tiny.en), with `cpu_threads` = the bench's thread count, interleaved
with mmspec's rows. Greedy, exactly as mmspec decodes (`GREEDY_SETTINGS`): one beam, one candidate, one
temperature and no fallback (no compression-ratio, log-probability or no-speech thresholds), no conditioning
on previous text, no timestamps, no VAD, no word timestamps.

Optional: only when `faster_whisper` imports (`pip install mmspec[peers]`); otherwise the rows are skipped
with one note. CTranslate2 may use a thread beside its compute threads (its CPU time can exceed its wall time).

Parts: `encoder_time` is CTranslate2's `encode` (timed by a subclass of `WhisperModel` overriding `encode`,
no patching); `decoder_time` is the rest of a call after the log-mel features (decoding, detokenising, Python),
since faster-whisper decodes inside one `generate` call that cannot be split further from outside.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmspec.optional import require

PEER_COMPUTE_TYPES = ("float32", "int8")
PEER_PREFIX = "faster-whisper-"
# Greedy decoding as mmspec does it; every setting that would differ from plain greedy is turned off.
GREEDY_SETTINGS: dict[str, Any] = {
    "beam_size": 1,
    "best_of": 1,
    "temperature": [0.0],
    "compression_ratio_threshold": None,
    "log_prob_threshold": None,
    "no_speech_threshold": None,
    "condition_on_previous_text": False,
    "without_timestamps": True,
    "vad_filter": False,
    "word_timestamps": False,
}
MISSING = "faster-whisper is not installed (pip install mmspec[peers]): the faster-whisper rows were not run"


def faster_whisper_available() -> bool:
    return importlib.util.find_spec("faster_whisper") is not None


def transcribe_kwargs(language: str | None = None) -> dict[str, Any]:
    """The keyword arguments every peer call passes to `WhisperModel.transcribe`."""
    return {**GREEDY_SETTINGS, "language": language}


def model_kwargs(compute_type: str, threads: int) -> dict[str, Any]:
    """The keyword arguments of the peer's `WhisperModel`: CPU, the compute type, the bench's threads, one worker."""
    if compute_type not in PEER_COMPUTE_TYPES:
        raise ValueError(f"faster-whisper peer compute types: {', '.join(PEER_COMPUTE_TYPES)}; got {compute_type!r}")
    return {"device": "cpu", "compute_type": compute_type, "cpu_threads": threads, "num_workers": 1}


class _TimedCall:
    """A callable run through, with the moment its last call returned (other attributes are the wrapped object's)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.returned = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self._inner(*args, **kwargs)
        self.returned = time.perf_counter()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def timed_whisper_model(folder: str | Path, compute_type: str, threads: int) -> Any:
    """faster-whisper's `WhisperModel` on `folder`, recording the time its `encode` calls take."""
    WhisperModel = require("faster_whisper", "peers", "the faster-whisper bench rows").WhisperModel

    class TimedWhisperModel(WhisperModel):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.encoder_time = 0.0
            self.feature_extractor = _TimedCall(self.feature_extractor)

        def encode(self, features: Any) -> Any:
            start = time.perf_counter()
            out = super().encode(features)
            self.encoder_time += time.perf_counter() - start
            return out

    return TimedWhisperModel(str(folder), **model_kwargs(compute_type, threads))


@dataclass
class PeerCall:
    """One transcription by a peer: its tokens (end-of-text appended, as mmspec's rows return them), text and parts."""

    tokens: list[int]
    text: str
    wall_time: float
    cpu_time: float
    encoder_time: float
    decoder_time: float


class FasterWhisperPeer:
    """One faster-whisper row: a loaded `WhisperModel` at `compute_type` that transcribes a file greedily."""

    def __init__(self, folder: str | Path, compute_type: str, threads: int, end_of_text: int,
                 language: str | None = None) -> None:
        self.name = PEER_PREFIX + compute_type
        self.compute_type, self.threads, self.end_of_text, self.language = compute_type, threads, end_of_text, language
        self.model = timed_whisper_model(folder, compute_type, threads)

    def transcribe(self, path: str | Path) -> PeerCall:
        self.model.encoder_time = 0.0
        start, cpu = time.perf_counter(), time.process_time()
        segments, _ = self.model.transcribe(str(path), **transcribe_kwargs(self.language))
        segments = list(segments)  # a lazy generator: the decoding happens here
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        tokens = [t for s in segments for t in s.tokens] + [self.end_of_text]
        text = "".join(s.text for s in segments).strip()
        features_done = max(self.model.feature_extractor.returned - start, 0.0)
        encoder = self.model.encoder_time
        return PeerCall(tokens, text, wall, cpu, encoder, max(wall - features_done - encoder, 0.0))
