"""The bench results file: one line per bench command, the latest per modality read back."""

from __future__ import annotations

import argparse
import json

import pytest

from mmspec.bench.harness import run_benchmark
from mmspec.bench.results import RESULTS_ENV, latest_results, recording, results_path
from mmspec.cli.bench_record import run_verb
from mmspec.stats import SpecStats


def trivial_bench(title: str = "t") -> None:
    def method(item: int) -> tuple[list[int], SpecStats]:
        return [item], SpecStats(new_tokens=1, target_forwards=1)

    run_benchmark(title, {"ref": method, "fast": method}, [1, 2], reference="ref", repeats=1, warmup=0, progress=False)


def test_a_bench_command_appends_one_line(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(path))
    args = argparse.Namespace(command="bench", modality="speech", func=lambda _args: trivial_bench() or 0)
    assert run_verb(args, ["bench", "speech", "--repeats", "1"]) == 0
    (line,) = path.read_text().splitlines()
    record = json.loads(line)
    assert record["modality"] == "speech" and record["command"] == "mmspec bench speech --repeats 1"
    assert [row["method"] for row in record["methods"]] == ["ref", "fast"]
    assert record["reference"] == "ref" and record["methods"][0]["speed_up"] == pytest.approx(1.0)


def test_nothing_is_written_outside_a_bench_command_or_when_it_fails(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(path))
    trivial_bench()  # a library call: no record
    run_verb(argparse.Namespace(command="zoo", func=lambda _args: trivial_bench() or 0), ["zoo"])
    with pytest.raises(RuntimeError):
        with recording("vision", "mmspec bench vision"):
            trivial_bench()
            raise RuntimeError("the bench failed")
    assert not path.exists()
    # Control: the same bench inside a recording is written.
    with recording("vision", "mmspec bench vision"):
        trivial_bench()
    assert path.exists()


def test_the_latest_line_per_modality_wins_and_bad_lines_are_skipped(tmp_path):
    path = tmp_path / "results.jsonl"
    for modality, title in (("vision", "old"), ("speech", "s"), ("vision", "new")):
        with recording(modality, f"mmspec bench {modality}", path=path):
            trivial_bench(title)
    with path.open("a") as handle:
        handle.write("not json\n{\"modality\": 3}\n")
    latest = latest_results(path)
    assert set(latest) == {"vision", "speech"} and latest["vision"]["titles"] == ["new"]


def test_where_results_go(monkeypatch, tmp_path):
    monkeypatch.setenv(RESULTS_ENV, "")
    assert results_path() is None
    monkeypatch.delenv(RESULTS_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert results_path() == tmp_path / "mmspec" / "bench-results.jsonl"
