"""The Bench tab shows what the CLI said about a measurement: the spread warning of rows measured under load,
and no tau / alpha for rows that verify no drafts (VAR / MAR image rows, whose "tau" is tokens per forward)."""

from __future__ import annotations

import math

import pytest

from mmspec.bench.harness import run_benchmark
from mmspec.bench.results import latest_results, recording
from mmspec.stats import SpecStats

pytest.importorskip("gradio")


def bench(path, noisy: bool) -> None:
    calls = {"n": 0}

    def slow_sometimes(item: int) -> tuple[list[int], SpecStats]:
        calls["n"] += 1
        if noisy and calls["n"] % 2:
            sum(range(300000))  # a busy moment: wall times spread
        return [item], SpecStats(new_tokens=1014, target_forwards=1)  # no drafts: "tau" would be 1014

    def drafted(item: int) -> tuple[list[int], SpecStats]:
        return [item], SpecStats(new_tokens=3, target_forwards=2, drafted=4, accepted=2, rounds=2)

    with recording("image", "mmspec bench image", path=path):
        run_benchmark("t", {"ar": slow_sometimes, "code": slow_sometimes, "sd": drafted}, [1, 2], reference="ar",
                      repeats=4, warmup=0, progress=False)


def test_the_record_keeps_the_warnings_and_drops_tau_without_drafts(tmp_path):
    path = tmp_path / "results.jsonl"
    bench(path, noisy=True)
    record = latest_results(path)["image"]
    rows = {row["method"]: row for row in record["methods"]}
    assert rows["code"]["tau"] is None and rows["code"]["alpha"] is None
    assert rows["sd"]["tau"] is not None and rows["sd"]["alpha"] is not None
    assert "warnings" in record


def test_the_tab_shows_the_spread_warning_and_a_blank_tau(tmp_path, monkeypatch):
    from mmspec.bench.results import RESULTS_ENV
    from mmspec.demo.bench_tab import read

    path = tmp_path / "results.jsonl"
    bench(path, noisy=True)
    record = latest_results(path)["image"]
    record_warnings = record["warnings"] or ["wall times spread by more than"]
    if not record["warnings"]:  # the machine was steady after all: plant the CLI's warning
        import json

        path.write_text(json.dumps({**record, "warnings": record_warnings}) + "\n")
    monkeypatch.setenv(RESULTS_ENV, str(path))
    notes, table, *_ = read()
    assert "spread" in notes
    tau = table[table["method"] == "code"]["tau"].iloc[0]
    assert tau is None or math.isnan(tau)


def test_batched_image_rows_show_tau_per_image(tmp_path, monkeypatch):
    """A batched image call counts each target forward once for all its images: the tab divides by the images a call
    (as one image's tau reads), while a text bench's batch rows, already counted per row, are left as they are."""
    from mmspec.bench.results import RESULTS_ENV
    from mmspec.demo.bench_tab import read

    def batch_of_four(item: int) -> tuple[list[int], SpecStats]:  # 4 images x 16 tokens in 8 shared target forwards
        return [item], SpecStats(new_tokens=64, target_forwards=8, drafted=40, accepted=30, rounds=8)

    path = tmp_path / "results.jsonl"
    for modality in ("image", "text"):
        with recording(modality, f"mmspec bench {modality} --batch-size 4", path=path):
            run_benchmark("t", {"ar": batch_of_four, "cspd k=4": batch_of_four}, [1, 2], reference="ar", repeats=1,
                          warmup=0, progress=False, settings={"batch_size": 4})
    assert latest_results(path)["image"]["settings"]["batch_size"] == 4
    monkeypatch.setenv(RESULTS_ENV, str(path))
    notes, table, *_ = read()
    taus = {(row["modality"], row["method"]): row["tau"] for _, row in table.iterrows()}
    assert taus[("image", "cspd k=4")] == 2.0  # 16 tokens of one image per 8 forwards; 8.0 counted the batch
    assert taus[("text", "cspd k=4")] == 8.0
    assert "tau per image" in notes


@pytest.mark.parametrize("line", [
    '{"modality": "image", "methods": [{"method": "sd", "tau": "fast", "speed_up": "x", "alpha": [1]}]}',
    '{"modality": "image", "settings": [4], "methods": [{"method": "sd", "tau": 8}]}',
    '{"modality": "image", "settings": {"batch_size": "4"}, "methods": [{"method": "sd", "tau": 8}]}',
    '{"modality": "image", "methods": [5, {"method": "sd", "tau": 8}]}',
    '{"modality": "image", "warnings": "busy machine", "methods": [{"method": "sd", "tau": 8}]}',
])
def test_a_malformed_results_line_still_shows_what_it_can(tmp_path, monkeypatch, line):
    """A hand-edited or foreign results file: blank cells for what is not a number, never an error in the page."""
    from mmspec.bench.results import RESULTS_ENV
    from mmspec.demo.bench_tab import read

    path = tmp_path / "results.jsonl"
    path.write_text(line + "\n")
    monkeypatch.setenv(RESULTS_ENV, str(path))
    _notes, table, *_ = read()
    assert list(table["method"]) == ["sd"]
