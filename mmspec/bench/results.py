"""The results file the benches append to, and the demo's Bench tab reads.

Every `mmspec bench <modality>` run appends one JSON line: when, which modality, the command, and per
method its measured speed-up over the bench's reference (median wall time), tau, alpha and whether
its outputs matched the reference. The file is `$MMSPEC_BENCH_RESULTS` if set (empty: record
nothing), else `~/.cache/mmspec/bench-results.jsonl`.

The harness reports each finished side-by-side run (`note_report`); the CLI opens `recording(...)`
around a bench command and writes the line when the command succeeds. Outside `recording` nothing is
written, so library calls and tests of `run_benchmark` leave no trace.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from ..errors import MMSpecError

RESULTS_ENV = "MMSPEC_BENCH_RESULTS"

_open: list[dict[str, Any]] = []  # the record being filled by the bench command now running (at most one)


def results_path() -> Path | None:
    """Where bench results go: `$MMSPEC_BENCH_RESULTS` (empty: nowhere), else the user cache."""
    chosen = os.environ.get(RESULTS_ENV)
    if chosen is not None:
        return Path(chosen).expanduser() if chosen.strip() else None
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "mmspec" / "bench-results.jsonl"


@contextmanager
def recording(modality: str, command: str, path: Path | None = None) -> Iterator[None]:
    """Collect the reports of the benches run inside the block; append them as one line when it ends without error."""
    record: dict[str, Any] = {"modality": modality, "command": command, "methods": [], "titles": []}
    _open.append(record)
    try:
        yield
    finally:
        _open.remove(record)
    target = path or results_path()
    if target is None or not record["methods"]:
        return
    record["time"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
    except OSError as error:
        raise MMSpecError(f"cannot write the bench results file {target}: {error.strerror or error}") from None


def note_report(report: Any) -> None:
    """Called by the harness with each finished `BenchReport`; kept only inside `recording`."""
    if not _open:
        return
    record = _open[-1]
    data = report.to_dict()
    record["titles"].append(data["title"])
    record.setdefault("reference", data["reference"])
    record.setdefault("settings", data.get("settings") or {})  # e.g. an image bench's images per call (batch_size)
    record.setdefault("warnings", []).extend(data.get("warnings", []))  # e.g. the spread warning the CLI printed
    for row in data["methods"]:
        verified = bool(row.get("drafted", 1))  # no drafts verified (VAR / MAR rows): tau and alpha mean nothing
        record["methods"].append({
            "method": row["method"], "speed_up": row["speed_up"], "tau": row["tau"] if verified else None,
            "alpha": row["alpha"] if verified else None, "wall_time_median_s": row["wall_time_median_s"],
            "wall_time_spread": row.get("wall_time_spread"), "identical_to_reference": row["identical_to_reference"],
        })


def latest_results(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The newest record per modality in the results file ({} when there is none yet); bad lines are skipped."""
    source = path or results_path()
    if source is None or not source.is_file():
        return {}
    latest: dict[str, dict[str, Any]] = {}
    for line in source.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("modality"), str) and isinstance(record.get("methods"), list):
            latest[record["modality"]] = record
    return latest
