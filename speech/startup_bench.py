"""`mmspec bench speech --startup`: a one-off transcription as a whole process, mmspec's CLI against a Python script
doing the same with faster-whisper.

Each row starts a fresh Python process that imports its library, loads the model and transcribes one short
held-out clip (the one closest to `CLIP_SECONDS`), then exits; the rows alternate, `repeats` times. Measured: the
process's wall time (start to exit) and its CPU time (the child's user + system time, every thread).

  mmspec            `mmspec transcribe CLIP --threads T [--model M] [--compute-type C]`: the CLI's defaults (hybrid
                    strict with the shipped fast decoder); its own start-up line (import, load) is kept as well
  faster-whisper-<float32|int8>
                    `python -c SCRIPT`: `from faster_whisper import WhisperModel`; `WhisperModel(folder,
                    device="cpu", compute_type=C, cpu_threads=T)`; `transcribe(CLIP, beam_size=1)` (greedy, as mmspec
                    decodes; otherwise faster-whisper's defaults); print the text

Both read the same model folder (a CTranslate2 folder, as whisper-tiny.en). The faster-whisper rows run when
faster_whisper imports.
"""

from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..bench.harness import TableReport, span
from ..errors import MMSpecError
from .train_fast import Clip

CLIP_SECONDS = 5.0
PEER_COMPUTE_TYPES = ("float32", "int8")
FASTER_WHISPER_SCRIPT = """\
import sys
from faster_whisper import WhisperModel
folder, clip, compute_type, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
model = WhisperModel(folder, device="cpu", compute_type=compute_type, cpu_threads=threads)
segments, _ = model.transcribe(clip, beam_size=1)
print(" ".join(s.text.strip() for s in segments))
"""
STARTUP_LINE = re.compile(r"start-up ([0-9.]+) s \(import ([0-9.]+) s, load ([0-9.]+) s")


def closest_clip(clips: list[Clip], seconds: float = CLIP_SECONDS) -> Clip:
    """The clip whose length is closest to `seconds` (the first of equals)."""
    from .audio import DEFAULT_SAMPLING_RATE, load_audio

    if not clips:
        raise MMSpecError("no clips to time a start-up with")
    lengths = [load_audio(c.path).shape[0] / DEFAULT_SAMPLING_RATE for c in clips]
    return clips[min(range(len(clips)), key=lambda i: abs(lengths[i] - seconds))]


def mmspec_command(clip: Path, threads: int, model: str | None = None, compute_type: str | None = None) -> list[str]:
    """`mmspec transcribe CLIP` as a user types it (the console script beside this Python, else `python -m mmspec`)."""
    script = Path(sys.executable).parent / "mmspec"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "mmspec"]
    command += ["transcribe", str(clip), "--threads", str(threads)]
    if model is not None:
        command += ["--model", model]
    if compute_type is not None:
        command += ["--compute-type", compute_type]
    return command


def faster_whisper_command(folder: str | Path, clip: Path, compute_type: str, threads: int) -> list[str]:
    if compute_type not in PEER_COMPUTE_TYPES:
        raise ValueError(f"faster-whisper compute types here: {', '.join(PEER_COMPUTE_TYPES)}; got {compute_type!r}")
    return [sys.executable, "-c", FASTER_WHISPER_SCRIPT, str(folder), str(clip), compute_type, str(threads)]


@dataclass
class ProcessRun:
    wall_time: float
    cpu_time: float
    text: str
    startup: tuple[float, float, float] | None  # mmspec's own line: (start-up, import, load) seconds


def run_process(command: list[str]) -> ProcessRun:
    """Run `command` to its end; one clear error when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise MMSpecError(f"{' '.join(command[:3])} ... exited with status {done.returncode}: {tail}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    match = STARTUP_LINE.search(done.stderr)
    startup = tuple(float(g) for g in match.groups()) if match else None
    return ProcessRun(wall, cpu, done.stdout.strip(), startup)  # type: ignore[arg-type]  # three floats


@dataclass
class StartupRow:
    system: str
    wall_time_s: float
    cpu_time_s: float
    wall_times_s: list[float]
    text: str
    startup_s: float | None = None  # mmspec's own start-up line, medians
    import_s: float | None = None
    load_s: float | None = None


@dataclass
class StartupReport(TableReport):
    title: str
    rows: list[StartupRow]
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def row(self, system: str) -> StartupRow:
        return next(r for r in self.rows if r.system == system)

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "settings": self.settings, "notes": self.notes, "rows": [asdict(r) for r in self.rows]}

    def to_table(self) -> str:
        header = f"{'system':<24} {'wall s':>8} {'min-max s':>15} {'CPU s':>8}  {'own start-up line':<34} text"
        lines = self.table_head(header)
        for r in self.rows:
            own = (f"start-up {r.startup_s:.2f} (import {r.import_s:.2f}, load {r.load_s:.2f})"
                   if r.startup_s is not None else "-")
            lines.append(f"{r.system:<24} {r.wall_time_s:>8.2f} {span(r.wall_times_s):>15} {r.cpu_time_s:>8.2f}  "
                         f"{own:<34} {r.text[:60]}")
        lines.append("(one fresh process per call: import, load, transcribe one clip, exit; medians over interleaved "
                     "repetitions; CPU s = the process's user + system time)")
        lines.append(", ".join(f"{k}={v}" for k, v in self.settings.items()))
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


def bench_startup(commands: dict[str, list[str]], repeats: int = 3, title: str = "bench speech: start-up",
                  settings: dict[str, Any] | None = None, notes: list[str] | None = None,
                  progress: bool = True) -> StartupReport:
    """Run every command `repeats` times, alternating (each repetition runs every command once, in order)."""
    if repeats < 1:
        raise MMSpecError(f"repeats must be >= 1, got {repeats}")
    runs: dict[str, list[ProcessRun]] = {name: [] for name in commands}
    for repeat in range(repeats):
        for name, command in commands.items():
            runs[name].append(run_process(command))
            if progress:
                print(f"start-up: repetition {repeat + 1}/{repeats}, {name}: {runs[name][-1].wall_time:.1f} s",
                      file=sys.stderr, flush=True)
    rows = []
    for name, done in runs.items():
        own = [r.startup for r in done if r.startup is not None]
        medians = [statistics.median(values) for values in zip(*own)] if own else [None, None, None]
        rows.append(StartupRow(name, statistics.median(r.wall_time for r in done), statistics.median(r.cpu_time for r in done),
                               [r.wall_time for r in done], done[-1].text, *medians))
    return StartupReport(title, rows, {**(settings or {}), "repeats": repeats}, list(notes or []))


def run_startup_bench(model_name: str | None, *, data: str | Path | None = None, repeats: int = 3,
                      compute_type: str | None = None, threads: int | None = None, peers: bool = True,
                      progress: bool = True) -> StartupReport:
    """Pick the clip, make the commands (mmspec's CLI; faster-whisper's script on the same folder), bench them."""
    from .bench import default_heldout
    from .ctranslate2 import is_ct2_whisper_folder
    from .models import DEFAULT_ASR_MODEL, fast_decoder_root, speech_model_path
    from .peers import MISSING, faster_whisper_available
    from .train_fast import read_clip_folder

    name = model_name or DEFAULT_ASR_MODEL
    path = speech_model_path(name)
    clips = read_clip_folder(Path(data) if data is not None else default_heldout(str(fast_decoder_root(name, path))))
    clip = closest_clip(clips)
    if threads is None:
        import torch

        threads = torch.get_num_threads()  # what mmspec would use unasked; both rows get the same number
    commands = {"mmspec": mmspec_command(clip.path, threads, model_name, compute_type)}
    notes = []
    if not peers:
        pass
    elif not faster_whisper_available():
        notes.append(MISSING)
    elif not is_ct2_whisper_folder(path):
        notes.append(f"{path} is not a CTranslate2 folder, which faster-whisper reads: the faster-whisper rows were not run")
    else:
        for ct in PEER_COMPUTE_TYPES:
            commands[f"faster-whisper-{ct}"] = faster_whisper_command(path, clip.path, ct, threads)
    settings = {"model": name, "clip": clip.path.name, "threads": threads, "compute_type": compute_type or "float32"}
    return bench_startup(commands, repeats, title=f"bench speech, start-up: {name}, one clip ({clip.path.name})",
                         settings=settings, notes=notes, progress=progress)
