"""The bench harness and the command line: right fields, honest identity check, clear errors."""

import json

import pytest
import torch

from mmspec.bench.harness import run_benchmark
from mmspec.bench.text import bench_text, inert_layer_pair
from mmspec.cli import main
from mmspec.stats import SpecStats


def test_bench_text_reports_every_method(target, small_drafter):
    prompts = [torch.tensor([[1, 5, 9, 12]]), torch.tensor([[1, 7, 7, 3, 2]])]
    report = bench_text(target, small_drafter, prompts, max_new_tokens=12, num_draft_tokens=3, repeats=1, progress=False,
                        include_compiled=False)
    rows = {row["method"]: row for row in report.to_dict()["methods"]}
    assert set(rows) == {"plain-greedy", "mmspec-fixed", "mmspec-heuristic", "mmspec-adaptive", "mmspec-prompt-lookup",
                         "hf-assisted-constant", "hf-assisted-heuristic"}
    assert all(row["identical_to_reference"] for row in rows.values())
    assert rows["plain-greedy"]["tau"] == 1.0 and rows["plain-greedy"]["target_forwards"] == 24
    for name in ("mmspec-fixed", "hf-assisted-constant"):
        assert rows[name]["new_tokens"] == 24 and rows[name]["target_forwards"] >= 1
    assert "speed-up" in report.to_table()


def test_bench_text_static_compiled_generate_matches_eager(target, small_drafter):
    """The generate-static-compiled row: transformers' generate with a static cache and a compiled forward,
    compiled in the warm-up, with the same tokens as eager generate (the harness's identity check)."""
    import torch._dynamo

    prompts = [torch.tensor([[1, 5, 9, 12]]), torch.tensor([[1, 7, 7, 3, 2, 8]])]
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    report = bench_text(target, small_drafter, prompts, max_new_tokens=10, num_draft_tokens=3, repeats=1, progress=False,
                        policies=(), include_lookup=False, include_assisted=False)
    rows = {row["method"]: row for row in report.to_dict()["methods"]}
    assert set(rows) == {"plain-greedy", "generate-static-compiled"}
    compiled = rows["generate-static-compiled"]
    assert compiled["identical_to_reference"] and compiled["new_tokens"] == 20 and compiled["target_forwards"] == 20
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs_before  # compiled, not run eagerly


def test_cli_bench_text_includes_the_compiled_baseline_unless_told(monkeypatch, capsys):
    import mmspec.bench.text as bench_text_module
    from mmspec.zoo import entries

    if "shapes-caption-lm" not in {e.name for e in entries()}:
        pytest.skip("needs the zoo")
    seen = []

    def fake_bench(target, drafter, prompts, **options):
        seen.append(options["include_compiled"])
        return run_benchmark("t", {"a": lambda item: ([1], SpecStats(new_tokens=1))}, [0], reference="a", repeats=1,
                             warmup=0, progress=False)

    monkeypatch.setattr(bench_text_module, "bench_text", fake_bench)
    for flags, expected in (([], True), (["--no-compiled-baseline"], False)):
        assert main(["bench", "text", "--num-samples", "1", "--json", *flags]) == 0
        assert seen[-1] is expected
    capsys.readouterr()


def test_identity_check_catches_a_wrong_method():
    def reference(item):
        return [1, 2, 3], SpecStats(new_tokens=3, target_forwards=3)

    def wrong(item):
        return [1, 2, 4], SpecStats(new_tokens=3, target_forwards=1)

    report = run_benchmark("t", {"plain": reference, "wrong": wrong}, [0, 1], reference="plain", repeats=2, progress=False)
    wrong_row = next(r for r in report.results if r.name == "wrong")
    assert not wrong_row.identical and wrong_row.mismatches == 2
    assert "NO (2)" in report.to_table()


def test_each_repetition_sums_the_time_the_calls_report_as_their_own():
    """generation_times: per repetition, the calls' own `total_time` summed (an image pipeline's token generation
    without its decoder), beside the wall time the harness measures around each call."""
    def method(item):
        return [item], SpecStats(new_tokens=1, target_forwards=1, total_time=0.25 * (item + 1))

    report = run_benchmark("t", {"a": method}, [0, 1, 2], reference="a", repeats=2, warmup=0, progress=False)
    result = report.results[0]
    assert result.generation_times == [1.5, 1.5] and result.median_generation_time == 1.5
    assert report.to_dict()["methods"][0]["generation_time_median_s"] == 1.5


def test_methods_are_interleaved_input_by_input_in_a_rotating_order():
    """A busy spell of the machine must fall on every method alike: each input goes through every method before
    the next input, and no method always runs first."""
    calls = []

    def method(name):
        def run(item):
            calls.append((name, item))
            return [item], SpecStats(new_tokens=1, target_forwards=1)
        return run

    names = ["a", "b", "c"]
    report = run_benchmark("t", {n: method(n) for n in names}, [0, 1, 2, 3], reference="a", repeats=2, warmup=0,
                           progress=False)
    assert len(calls) == 2 * 3 * 4
    blocks = [calls[i:i + 3] for i in range(0, len(calls), 3)]
    for block, item in zip(blocks, [0, 1, 2, 3] * 2):
        assert sorted(block) == [(n, item) for n in names]  # one input at a time, every method on it
    assert {block[0][0] for block in blocks} == set(names)  # the first place rotates
    assert all(r.identical and len(r.wall_times) == 2 for r in report.results)


def test_inert_pair_agrees_on_every_token(target):
    inert_target, drafter = inert_layer_pair(target, drafter_layers=1)
    ids = torch.tensor([[1, 4, 9, 16]])
    with torch.inference_mode():
        torch.testing.assert_close(inert_target(ids).logits, drafter(ids).logits)


def test_bench_text_runs_mmspec_rows_on_the_lean_drafter_path_and_still_counts_transformers_rows(target, monkeypatch):
    # The forward counters of transformers' rows must not stay hooked on the drafter: a hooked Llama drafter steps
    # through transformers' forward instead of mmspec's lean one, which would measure a path users do not run.
    from mmspec.kernels.lean_llama import LeanCausalLM

    lean_steps = []
    lean_forward = LeanCausalLM.forward
    monkeypatch.setattr(LeanCausalLM, "forward", lambda self, *a, **k: lean_steps.append(1) or lean_forward(self, *a, **k))
    inert_target, drafter = inert_layer_pair(target, drafter_layers=1)
    report = bench_text(inert_target, drafter, [torch.tensor([[1, 5, 9, 12]])], max_new_tokens=12, num_draft_tokens=3,
                        repeats=1, progress=False, policies=("fixed",), include_lookup=False, include_compiled=False)
    rows = {row["method"]: row for row in report.to_dict()["methods"]}
    assert lean_steps  # the mmspec row drafted through the lean forward
    for name in ("mmspec-fixed", "hf-assisted-constant"):  # transformers' rows still counted through the hooks
        assert rows[name]["drafter_forwards"] > 0 and rows[name]["target_forwards"] > 0 and rows[name]["identical_to_reference"]
    assert rows["plain-greedy"]["target_forwards"] == 12
    assert not drafter._forward_hooks and not inert_target._forward_hooks  # nothing left hooked after the bench


def test_cli_unknown_model_is_one_clear_error(capsys):
    code = main(["bench", "text", "--model", "no-such-model", "--drafter", "no-such-drafter", "--num-prompts", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("mmspec: error: cannot load the target 'no-such-model'")
    assert "Traceback" not in err


def test_cli_missing_prompts_file(capsys, tmp_path):
    from mmspec.zoo import entries

    if not entries():
        pytest.skip("needs the zoo")
    code = main(["bench", "text", "--prompts", str(tmp_path / "missing.txt")])
    assert code == 2 and "argument --prompts: file not found" in capsys.readouterr().err


def test_cli_zoo_list_json(capsys):
    assert main(["zoo", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    for entry in listed:
        assert {"name", "params", "file_size_bytes", "trained_on", "quality", "rebuild_command"} <= set(entry)


def test_cli_zoo_list_shows_every_run_of_a_model_built_in_several(capsys, monkeypatch, tmp_path):
    from mmspec import zoo

    card = {"architecture": "Llama", "role": "target", "params": 1e6, "trained_on": "last run", "quality": {},
            "train_wall_time_s": 60.0, "rebuild_command": "python -m last",
            "earlier_training": [{"train_wall_time_s": 120.0}, {"train_wall_time_s": 180.0}],
            "rebuild_steps": ["python -m first", "python -m second", "python -m last"]}
    single = {**card, "earlier_training": [], "rebuild_steps": None}
    monkeypatch.setattr(zoo, "entries", lambda: [zoo.ZooEntry("built-in-three", tmp_path, card),
                                                 zoo.ZooEntry("built-in-one", tmp_path, single)])
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    three, one = out.split("built-in-one")
    assert "training runs: 3 in all, 6.0 min together" in three
    assert three.index("python -m first") < three.index("python -m second") < three.index("python -m last")
    assert "training runs" not in one and "rebuild: python -m last" in one


def test_bench_table_shows_the_spread_and_warns_when_it_is_wide():
    from mmspec.bench.harness import BenchReport, MethodResult
    from mmspec.stats import SpecStats

    steady = MethodResult("greedy-loop", SpecStats(method="greedy-loop"), wall_times=[1.0, 1.02, 0.99])
    noisy = MethodResult("fixed k=5", SpecStats(method="fixed k=5"), wall_times=[0.5, 1.4, 0.6])
    report = BenchReport("t", "greedy-loop", [steady, noisy], {})
    table = report.to_table()
    assert "0.990-1.020" in table and "0.500-1.400" in table
    (warning,) = [line for line in table.splitlines() if line.startswith("warning:")]
    assert "for fixed k=5 (150%)" in warning and "greedy-loop" not in warning
    assert report.to_dict()["methods"][1]["wall_time_max_s"] == 1.4 and len(report.to_dict()["warnings"]) == 1
    calm = BenchReport("t", "greedy-loop", [steady], {})  # a failing control: no warning when the spread is narrow
    assert "warning" not in calm.to_table() and calm.to_dict()["warnings"] == []


def test_zoo_sizes_count_subfolders(tmp_path, monkeypatch):
    import mmspec.zoo as zoo

    folder = tmp_path / "toy"
    (folder / "msd").mkdir(parents=True)
    (folder / "zoo_card.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    (folder / "msd" / "model.safetensors").write_bytes(b"y" * 1000)  # a drafter shipped with the model
    monkeypatch.setattr(zoo, "MODELS_DIR", tmp_path)
    (entry,) = zoo.entries()
    assert entry.file_size_bytes == 2 + 100 + 1000
