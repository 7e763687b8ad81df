"""Folder mode with --batch-size: files decoded N at a time give the lines a one-by-one run gives; a file
that fails to load is an error line and its batch-mates still decode together; resumable as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmspec.cli import folder_runs, main
from mmspec.decoding import SpeculativeDecoder
from mmspec.errors import MMSpecError

from .test_folder_mode import audio_folder, caption, folder, lines  # noqa: F401 - the fixture: five videos and a corrupt one

KEPT = ("file", "text", "method", "model", "notes", "error")  # stats differ: a batch counts its rounds per row


def records(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k in KEPT} for line in lines(path)]


@pytest.fixture
def batch_rows(monkeypatch):
    """The number of rows of every decode call."""
    rows, generate = [], SpeculativeDecoder.generate

    def spy(self, input_ids, **kwargs):
        rows.append(input_ids.shape[0])
        return generate(self, input_ids, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", spy)
    return rows


@pytest.fixture(scope="module")
def one_by_one(folder, tmp_path_factory):  # noqa: F811
    found = {}
    for method in ("text", "ar"):
        out = tmp_path_factory.mktemp(f"one-by-one-{method}") / "captions.jsonl"
        assert caption(folder, out, "--method", method) == 2
        found[method] = out
    return found


@pytest.mark.slow
@pytest.mark.parametrize("method", ["text", "ar"])
def test_batches_give_the_one_by_one_lines(folder, one_by_one, method, tmp_path, batch_rows):  # noqa: F811
    out = tmp_path / "captions.jsonl"
    assert caption(folder, out, "--method", method, "--batch-size", "3") == 2
    assert records(out) == records(one_by_one[method])
    # clip00-02 in one batch; clip02b fails to load, so clip03 and clip04 still decode together
    assert batch_rows == [3, 2]
    broken = json.loads(lines(out)[3])
    assert broken["file"] == "clip02b.mp4" and "cannot read video" in broken["error"]
    assert len({r["text"] for r in records(out) if "text" in r}) > 1  # the control: captions differ, so a mix-up shows


def test_batched_runs_resume(folder, one_by_one, tmp_path, batch_rows):  # noqa: F811
    out = tmp_path / "captions.jsonl"
    kept = lines(one_by_one["text"])[:2]
    out.write_text("\n".join(kept) + "\n")
    assert caption(folder, out, "--method", "text", "--batch-size", "2") == 2
    assert lines(out)[:2] == kept and records(out) == records(one_by_one["text"])
    assert batch_rows == [1, 2]  # clip02 + clip02b (fails to load, so clip02 decodes alone), then clip03 + clip04
    assert caption(folder, out, "--method", "text", "--batch-size", "2") == 2 and lines(out)[:2] == kept


def test_a_method_that_cannot_batch_fails_before_any_file(folder, tmp_path, capsys, monkeypatch):  # noqa: F811
    from mmspec.vision.sparse_to_dense import SparseToDenseDrafter

    monkeypatch.setattr(SparseToDenseDrafter, "drafts_batches", False)
    out = tmp_path / "captions.jsonl"
    assert caption(folder, out, "--method", "std", "--batch-size", "2") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mmspec: error")]
    assert err == ["mmspec: error: batch_size=2: method 'std' drafts one sequence at a time (SparseToDenseDrafter); "
                   "use batch_size=1 or a method that batches (ar, text" + err[0].split("(ar, text", 1)[1]]
    assert not out.exists()


def test_a_batch_that_fails_whole_runs_file_by_file(tmp_path):
    files = []
    for name in ("a.txt", "b.txt", "c.txt"):
        files.append(tmp_path / name)
        files[-1].write_text(name)
    run = folder_runs.FolderRun(files, tmp_path / "out.jsonl", retry_failed=False)
    calls = []

    def records_for(paths):
        calls.append([p.name for p in paths])
        if len(paths) > 1:
            raise RuntimeError("the batch broke")
        return [{"n": 1}]

    def record_for(path):
        if path.name == "b.txt":
            raise MMSpecError("b is bad")
        return {"alone": path.read_text()}

    assert run.run(record_for, batch_size=2, records_for=records_for) == 2
    assert calls == [["a.txt", "b.txt"], ["c.txt"]]
    written = [json.loads(line) for line in lines(tmp_path / "out.jsonl")]
    assert [r.pop("source")["path"] for r in written] == [str(f.resolve()) for f in files]  # what identifies each file
    assert written == [{"file": "a.txt", "alone": "a.txt", "error": None}, {"file": "b.txt", "error": "b is bad"},
                       {"file": "c.txt", "n": 1, "error": None}]


@pytest.mark.slow
@pytest.mark.parametrize("batching", [True, False])
def test_transcribe_batches_follow_the_target(tmp_path, capsys, monkeypatch, batching):
    from mmspec.speech.target import WhisperTarget

    if not batching:
        monkeypatch.setattr(WhisperTarget, "decodes_batches", False)
    elif not WhisperTarget.decodes_batches:
        pytest.skip("Whisper targets do not decode batches")
    folder = audio_folder(tmp_path)
    argv = ["transcribe", str(folder), "--model", "whisper-tiny.en", "--threads", "1", "--method", "ar"]
    one = tmp_path / "one.jsonl"
    assert main([*argv, "--out", str(one)]) == 2
    batched = tmp_path / "batched.jsonl"
    code = main([*argv, "--out", str(batched), "--batch-size", "2"])
    if not WhisperTarget.decodes_batches:
        assert code == 2 and not batched.exists()
        assert "mmspec: error: batch_size=2: the model (WhisperTarget over WhisperForConditionalGeneration) decodes one " \
               "sequence at a time; use batch_size=1" in capsys.readouterr().err
        return
    keep = ("file", "text", "segments", "error")
    assert [{k: r.get(k) for k in keep} for r in map(json.loads, lines(batched))] == \
           [{k: r.get(k) for k in keep} for r in map(json.loads, lines(one))]
