"""`mmspec bench speech --long-audio-minutes N` (or `--long-audio FILE`): one long recording through mmspec's
long-audio path and through faster-whisper's own long-form paths, interleaved.

The recording: `--long-audio FILE` (its reference transcript from FILE's `.txt` sibling when there is one, else no
WER), or one built deterministically (`build_long_audio`) from the held-out clips: each clip in turn, followed by a
pause from `PAUSES_S` in turn, the clips cycled until N minutes are filled; the reference is the clips' texts joined.
It is written as 16-bit PCM WAV, and every row reads that file.

Rows (each a whole transcription of the file, wall and CPU time):
  mmspec-hybrid     `TranscriptionPipeline(file)` exactly as `mmspec transcribe FILE` calls it (the model's default
                    method, hybrid strict when a fast decoder ships; speech regions packed into windows of up to
                    30 s, windows encoded in batches: `speech/long_audio.py`), at the bench's compute type
  mmspec-greedy     the same with method "ar" (plain greedy); "identical" tells whether mmspec-hybrid's text equals it
  mmspec-hybrid-timestamps, mmspec-greedy-timestamps
                    the same two decoding with Whisper's timestamp tokens (`mmspec transcribe FILE --timestamps`, as
                    `generate(return_timestamps=True)`); "identical" compares these two
  mmspec-previous-text
                    the default method with `condition_on_previous_text=True` (`mmspec transcribe FILE
                    --condition-on-previous-text`): each window's prompt starts with the text before it, as
                    faster-whisper's long form does; windows decoded in order, each greedy given its prompt
  faster-whisper-<float32|int8>
                    `WhisperModel(folder, device="cpu", compute_type, cpu_threads=threads, num_workers=1)
                    .transcribe(file, **LONG_FORM_SETTINGS)`: its sequential long-form path as a user runs it, with
                    its VAD filter (Silero, faster-whisper's default `VadOptions`) and greedy decoding (beam_size 1,
                    best_of 1); every other setting is faster-whisper's default (timestamps on, which its 30 s
                    seeking relies on; conditioning on the previous text; temperature fallback)
  faster-whisper-batched-<float32|int8>
                    `BatchedInferencePipeline(model).transcribe(file, **BATCHED_SETTINGS)`: its batched path (VAD
                    chunks packed into 30 s windows, encoded and decoded `batch_size` at a time, no timestamps by
                    default), greedy as above

The faster-whisper rows run when faster_whisper imports and the model is a CTranslate2 folder (as whisper-tiny.en).
The mmspec rows also report their wall time by part (`MmspecRow`, `PARTS`): encoder, decoder prefill, drafting,
verification passes, and the rest (reading the file, speech regions, features, Python between the parts).
Before timing, every row transcribes one short clip once (its first-call costs). Times are medians over `repeats`
interleaved repetitions (each repetition runs every row once, in order).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import wave
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..bench.harness import TableReport, quiet_transformers, span
from ..errors import MMSpecError
from .audio import DEFAULT_SAMPLING_RATE, load_audio
from .train_fast import Clip
from .wer import NORMALISATION, corpus_wer

PAUSES_S = (0.7, 1.5, 0.9, 3.0, 1.2, 0.6, 2.2)  # between clips, in turn: short turns, breaths, a longer pause
LONG_FORM_SETTINGS: dict[str, Any] = {"beam_size": 1, "best_of": 1, "vad_filter": True}
BATCHED_SETTINGS: dict[str, Any] = {"beam_size": 1, "best_of": 1, "batch_size": 8}
PEER_COMPUTE_TYPES = ("float32", "int8")


@dataclass
class LongAudio:
    """A long recording and where its pieces lie: `spans` are the clips' [start, end) in samples."""

    samples: np.ndarray
    reference: str | None
    spans: list[tuple[int, int]] = field(default_factory=list)


def build_long_audio(clips: list[Clip], seconds: float, sampling_rate: int = DEFAULT_SAMPLING_RATE) -> LongAudio:
    """The clips in turn with the pauses of `PAUSES_S` in turn between them, cycled until `seconds` are filled (the last
    clip whole); the reference is their texts joined. The same clips and length always give the same samples."""
    if not clips:
        raise MMSpecError("no clips to build a long recording from")
    if not seconds > 0:
        raise MMSpecError(f"the long recording must last more than 0 minutes, got {seconds / 60:g}")
    loaded = [load_audio(clip.path, sampling_rate) for clip in clips]
    pieces, spans, texts, position, index = [], [], [], 0, 0
    while position < seconds * sampling_rate:
        clip = loaded[index % len(loaded)]
        pause = np.zeros(int(round(PAUSES_S[index % len(PAUSES_S)] * sampling_rate)), np.float32)
        spans.append((position, position + clip.shape[0]))
        texts.append(clips[index % len(clips)].text.strip())
        pieces += [clip, pause]
        position += clip.shape[0] + pause.shape[0]
        index += 1
    return LongAudio(np.concatenate(pieces), " ".join(texts), spans)


def write_wav(path: Path, samples: np.ndarray, sampling_rate: int = DEFAULT_SAMPLING_RATE) -> Path:
    """16-bit PCM mono WAV (what every row reads)."""
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(sampling_rate)
        handle.writeframes((np.clip(samples, -1.0, 1.0) * 32767).astype(np.int16).tobytes())
    return path


def user_long_audio(path: str | Path) -> tuple[Path, str | None]:
    """A user's recording and its reference (the `.txt` beside it), or None when there is none."""
    audio = Path(path)
    if not audio.is_file():
        raise MMSpecError(f"--long-audio {str(path)!r} is not a file")
    text = audio.with_suffix(".txt")
    return audio, text.read_text(encoding="utf-8").strip() if text.is_file() else None


# --- rows -----------------------------------------------------------------------------------------

Transcribe = Callable[[Path], tuple[str, int]]  # file -> (text, segments)


PARTS = ("encoder", "prefill", "drafting", "verification", "rest")


class MmspecRow:
    """The transcription pipeline as `mmspec transcribe FILE` calls it (method None: the pipeline's default); `parts`
    holds the last call's wall time split by part (seconds): the encoder's forwards, the decoder's prefills, drafting,
    verification passes, and the rest of the call (reading the file, speech regions, features, Python between)."""

    def __init__(self, pipe: Any, method: str | None, condition_on_previous_text: bool = False,
                 timestamps: bool = False) -> None:
        self.pipe, self.method, self.condition, self.timestamps = pipe, method, condition_on_previous_text, timestamps
        self.parts: dict[str, float] = {}
        self.note: str | None = None  # the last call's note (e.g. how hybrid strict decoded the windows)

    def __call__(self, path: Path) -> tuple[str, int]:
        out = self.pipe(str(path), method=self.method, progress_bar=False, condition_on_previous_text=self.condition,
                        **({"timestamps": True} if self.timestamps else {}))
        self.parts = output_parts(out)
        self.note = getattr(out, "note", None)
        return out.text, len(out.segments)


def output_parts(out: Any) -> dict[str, float]:
    """A transcription's wall time by part (`PARTS`), from its output's timings; the rest is what they leave."""
    timed = {"encoder": out.encoder_time_s, "prefill": out.stats.prefill_time, "drafting": out.stats.draft_time,
             "verification": out.stats.verify_time}
    return {**timed, "rest": max(0.0, out.total_time_s - sum(timed.values()))}


def mmspec_row(pipe: Any, method: str | None) -> MmspecRow:
    """The transcription pipeline as `mmspec transcribe FILE` calls it (method None: the pipeline's default)."""
    return MmspecRow(pipe, method)


def peer_model_kwargs(compute_type: str, threads: int) -> dict[str, Any]:
    if compute_type not in PEER_COMPUTE_TYPES:
        raise ValueError(f"faster-whisper compute types here: {', '.join(PEER_COMPUTE_TYPES)}; got {compute_type!r}")
    return {"device": "cpu", "compute_type": compute_type, "cpu_threads": threads, "num_workers": 1}


def faster_whisper_rows(folder: str | Path, threads: int) -> dict[str, Transcribe]:
    """faster-whisper's sequential long-form path and its batched path, at float32 and int8 (see the module docstring)."""
    from ..optional import require

    faster_whisper = require("faster_whisper", "peers", "the faster-whisper long-audio rows")
    rows: dict[str, Transcribe] = {}
    for compute_type in PEER_COMPUTE_TYPES:
        model = faster_whisper.WhisperModel(str(folder), **peer_model_kwargs(compute_type, threads))
        rows[f"faster-whisper-{compute_type}"] = _peer(model.transcribe, LONG_FORM_SETTINGS)
        batched = faster_whisper.BatchedInferencePipeline(model)
        rows[f"faster-whisper-batched-{compute_type}"] = _peer(batched.transcribe, BATCHED_SETTINGS)
    return rows


def _peer(transcribe: Callable[..., Any], settings: dict[str, Any]) -> Transcribe:
    def run(path: Path) -> tuple[str, int]:
        segments, _ = transcribe(str(path), **settings)
        segments = list(segments)  # a lazy generator: the decoding happens here
        return " ".join(s.text.strip() for s in segments if s.text.strip()), len(segments)

    return run


# --- the report -----------------------------------------------------------------------------------

@dataclass
class LongAudioRow:
    system: str
    wer: float | None
    wall_time_s: float
    cpu_time_s: float
    segments: int
    wall_times_s: list[float]
    identical_to_greedy: bool | None  # mmspec-hybrid[-timestamps]'s text against mmspec-greedy[-timestamps]'s; else None
    text: str = ""
    parts_s: dict[str, float] = field(default_factory=dict)  # mmspec rows: median wall seconds by part (`PARTS`)


@dataclass
class LongAudioReport(TableReport):
    title: str
    rows: list[LongAudioRow]
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def row(self, system: str) -> LongAudioRow:
        return next(r for r in self.rows if r.system == system)

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "settings": self.settings, "notes": self.notes,
                "rows": [{k: v for k, v in asdict(r).items() if k != "text"} for r in self.rows]}

    def to_table(self) -> str:
        header = f"{'system':<30} {'WER':>6} {'wall s':>8} {'min-max s':>17} {'CPU s':>8} {'segments':>8}  identical"
        lines = self.table_head(header)
        for r in self.rows:
            wer = f"{r.wer:.1%}" if r.wer is not None else "-"
            same = "-" if r.identical_to_greedy is None else ("yes" if r.identical_to_greedy else "NO")
            lines.append(f"{r.system:<30} {wer:>6} {r.wall_time_s:>8.2f} {span(r.wall_times_s):>17} {r.cpu_time_s:>8.2f} "
                         f"{r.segments:>8}  {same}")
        for r in self.rows:
            if r.parts_s:
                lines.append(f"{r.system} by part, wall s: " + ", ".join(f"{k} {v:.2f}" for k, v in r.parts_s.items()))
        lines.append(f"(WER after normalising: {NORMALISATION}; times are medians over interleaved repetitions of one whole "
                     "transcription of the file; identical = mmspec-hybrid's text equals mmspec-greedy's, and the same for "
                     "their -timestamps rows; rest = reading "
                     "the file, speech regions, features and Python between the parts)")
        lines.append(", ".join(f"{k}={v}" for k, v in self.settings.items() if k != "normalisation"))
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


def bench_long_audio(rows: dict[str, Transcribe], path: Path, reference: str | None, *, warm_up: Path | None,
                     repeats: int = 3, title: str = "bench speech: long audio", settings: dict[str, Any] | None = None,
                     notes: list[str] | None = None, progress: bool = True) -> LongAudioReport:
    """Run every row on `path` `repeats` times, interleaved (each repetition runs every row once), after one untimed
    call each on `warm_up`; WER against `reference` (None: not measured)."""
    if repeats < 1:
        raise MMSpecError(f"repeats must be >= 1, got {repeats}")
    if warm_up is not None:
        for run in rows.values():
            run(warm_up)
    walls: dict[str, list[float]] = {name: [] for name in rows}
    cpus: dict[str, list[float]] = {name: [] for name in rows}
    texts: dict[str, tuple[str, int]] = {}
    parts: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
    for repeat in range(repeats):
        for name, run in rows.items():
            wall, cpu = time.perf_counter(), time.process_time()
            texts[name] = run(path)
            walls[name].append(time.perf_counter() - wall)
            cpus[name].append(time.process_time() - cpu)
            if isinstance(run, MmspecRow):
                parts[name].append(run.parts)
            if progress:
                print(f"long audio: repetition {repeat + 1}/{repeats}, {name}: {walls[name][-1]:.1f} s", file=sys.stderr,
                      flush=True)
    pairs = {"mmspec-hybrid": "mmspec-greedy", "mmspec-hybrid-timestamps": "mmspec-greedy-timestamps"}

    def identical(name: str, text: str) -> bool | None:
        greedy = texts.get(pairs.get(name, ""), (None, 0))[0]
        return None if greedy is None else text == greedy

    report_rows = [LongAudioRow(
        system=name,
        wer=corpus_wer([reference], [text]) if reference is not None else None,
        wall_time_s=statistics.median(walls[name]),
        cpu_time_s=statistics.median(cpus[name]),
        segments=segments,
        wall_times_s=walls[name],
        identical_to_greedy=identical(name, text),
        text=text,
        parts_s={k: statistics.median(p[k] for p in parts[name]) for k in PARTS} if parts[name] else {},
    ) for name, (text, segments) in texts.items()]
    row_notes = [f"{name}: {run.note}" for name, run in rows.items() if isinstance(run, MmspecRow) and run.note]
    return LongAudioReport(title, report_rows, {**(settings or {}), "repeats": repeats, "normalisation": NORMALISATION},
                           [*(notes or []), *row_notes])


def run_long_audio_bench(model_name: str, *, minutes: float | None = None, audio: str | Path | None = None,
                         data: str | Path | None = None, repeats: int = 3, compute_type: str | None = None,
                         feature_padding: str | None = None,
                         peers: bool = True, progress: bool = True) -> LongAudioReport:
    """Load the pipeline (and faster-whisper on the same folder), build or read the long recording, bench it."""
    from .bench import default_heldout
    from .ctranslate2 import is_ct2_whisper_folder
    from .models import fast_decoder_root, speech_model_path
    from .peers import MISSING, faster_whisper_available
    from .pipeline import TranscriptionPipeline
    from .train_fast import read_clip_folder

    if (minutes is None) == (audio is None):
        raise MMSpecError("give the long recording's length (--long-audio-minutes N) or a file (--long-audio FILE), one of them")
    path = speech_model_path(model_name)
    folder = Path(data) if data is not None else default_heldout(str(fast_decoder_root(model_name, path)))
    clips = read_clip_folder(folder)
    threads = torch.get_num_threads()
    with quiet_transformers():
        pipe = TranscriptionPipeline.from_pretrained(
            model_name, compute_type=compute_type, **({} if feature_padding is None else {"feature_padding": feature_padding}))
    rows: dict[str, Transcribe] = {"mmspec-hybrid": mmspec_row(pipe, None)} if pipe.default_method == "hybrid" else {}
    rows["mmspec-greedy"] = mmspec_row(pipe, "ar")
    if "mmspec-hybrid" in rows:
        rows["mmspec-hybrid-timestamps"] = MmspecRow(pipe, None, timestamps=True)
    rows["mmspec-greedy-timestamps"] = MmspecRow(pipe, "ar", timestamps=True)
    notes = [] if "mmspec-hybrid" in rows else [f"{model_name!r} has no fast decoder: mmspec runs greedy only"]
    if pipe.previous_text_token() is not None:
        rows["mmspec-previous-text"] = MmspecRow(pipe, None, condition_on_previous_text=True)
    if not peers:
        pass
    elif not faster_whisper_available():
        notes.append(MISSING)
    elif not is_ct2_whisper_folder(path):
        notes.append(f"{path} is not a CTranslate2 folder, which faster-whisper reads: the faster-whisper rows were not run")
    else:
        rows.update(faster_whisper_rows(path, threads))
    settings = {"model": model_name, "compute_type": pipe.compute_type, "feature_padding": pipe.feature_padding, "threads": threads,
                "faster_whisper_long_form": dict(LONG_FORM_SETTINGS), "faster_whisper_batched": dict(BATCHED_SETTINGS)}
    with tempfile.TemporaryDirectory(prefix="mmspec-long-audio-") as scratch:
        if audio is not None:
            file, reference = user_long_audio(audio)
            settings["file"] = str(file)
        else:
            built = build_long_audio(clips, float(minutes) * 60)  # type: ignore[arg-type]  # minutes is set here
            file, reference = write_wav(Path(scratch) / "long.wav", built.samples), built.reference
            settings.update(minutes=round(built.samples.shape[0] / DEFAULT_SAMPLING_RATE / 60, 2), clips_placed=len(built.spans),
                            pauses_s=list(PAUSES_S), clips_from=str(folder))
        if reference is None:
            notes.append(f"no reference transcript ({Path(file).with_suffix('.txt')}): WER not measured")
        title = f"bench speech, long audio: {model_name} on {Path(file).name}"
        return bench_long_audio(rows, Path(file), reference, warm_up=clips[0].path, repeats=repeats, title=title,
                                settings=settings, notes=notes, progress=progress)
