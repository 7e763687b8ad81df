"""`mmspec bench speech --batch-size`: plain batched Whisper generate vs mmspec's methods that batch, per batch size,
on a tiny random Whisper (only the report's shape and identical outputs are tested, not speed)."""

import json

import pytest

from mmspec.cli import main
from mmspec.speech.target import WhisperTarget

from .test_bench_speech import folders  # noqa: F401 - fixture: tiny Whisper with both fast decoders, and clips


def bench(folders, capsys, *extra):  # noqa: F811
    asr, clips_folder = folders
    code = main(["bench", "speech", "--model", str(asr), "--data", str(clips_folder), "--n", "3", "--repeats", "1",
                 "--threads", "1", "--batch-size", "1,2", *extra])
    return code, capsys.readouterr()


@pytest.mark.skipif(not WhisperTarget.decodes_batches, reason="Whisper targets do not decode batches")
def test_json_shape_and_identical_rows(folders, capsys):  # noqa: F811
    code, captured = bench(folders, capsys, "--json")
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert set(result["batch_sizes"]) == {"1", "2"}
    for size, report in result["batch_sizes"].items():
        methods = {m["method"]: m for m in report["methods"]}
        assert "plain-batched" in methods and "greedy-loop" in methods and "hybrid-strict" in methods
        assert report["reference"] == "plain-batched" and report["settings"]["batch_size"] == int(size)
        assert all(m["identical_to_reference"] for m in methods.values()), methods
        assert len({m["new_tokens"] for m in methods.values()}) == 1  # every method committed the same tokens
        assert all(m["tokens_per_second"] > 0 for m in methods.values())
    # The AR fast decoder's drafter is named when it does not batch (it is not silently left out).
    refused = result["batch_sizes"]["1"]["settings"]["not_batching"]
    assert all(": " in line for line in refused)
    names = {m["method"] for m in result["batch_sizes"]["1"]["methods"]}
    assert ("hybrid-strict-ar" in names) != any(line.startswith("hybrid-strict-ar:") for line in refused)


def test_nothing_that_batches_is_one_line(folders, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setattr(WhisperTarget, "decodes_batches", False)
    code, captured = bench(folders, capsys)
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in captured.err
    assert lines[0].startswith("mmspec: error: --batch-size: no speech method decodes batches yet (greedy-loop: the model")
    assert lines[0].endswith("run bench speech without --batch-size")
