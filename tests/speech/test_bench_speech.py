"""`mmspec bench speech` (speech/bench.py): the quality measures, and a whole run on a tiny random
Whisper with both fast decoders, through the Python API and the CLI. Random models: only plumbing,
exactness of the strict methods and the report's shape are tested, not speed or accuracy. Bad arguments:
test_cli_errors.py."""

import json
import shutil

import pytest

from mmspec import MMSpecError
from mmspec.cli import main
from mmspec.speech.bench import REFERENCE, bench_speech, repeated_ngrams, repetition_count
from mmspec.speech.feature_drafter import WhisperFeatureDrafterModel, load_feature_drafter
from mmspec.speech.pipeline import load_fast_decoder, load_whisper
from mmspec.speech.train_fast import read_clip_folder
from mmspec.speech.wer import corpus_wer, normalise, word_errors

from .tiny_asr import make_asr_folder, make_clip_folder

ALL_METHODS = [REFERENCE, "greedy-loop", "hybrid-strict", "hybrid-relaxed", "hybrid-strict-ar", "hybrid-strict-ar-f32head",
               "hybrid-strict-ar-redraft", "hf-assisted-ar"]
LOSSLESS = ["greedy-loop", "hybrid-strict", "hybrid-strict-ar", "hybrid-strict-ar-f32head", "hybrid-strict-ar-redraft"]


def test_normalise():
    assert normalise("  Hello, World!  It's  ME... ") == "hello world it s me"
    assert normalise("«Ça va?» — oui") == "ça va oui"


def test_word_errors_and_corpus_wer():
    assert word_errors("a red circle", "A red, circle.") == (0, 3)
    assert word_errors("a red circle", "a blue circle extra") == (2, 3)
    assert word_errors("", "two words") == (2, 0)
    assert word_errors("a b", "") == (2, 2)
    assert corpus_wer(["a b c d", "e f"], ["a b c d", "e x"]) == pytest.approx(1 / 6)


def test_repetitions_beyond_the_reference():
    assert repeated_ngrams("go go go".split()) == {("go",): 2}
    assert repeated_ngrams("a b a b c".split()) == {("a", "b"): 1}
    assert repetition_count("the red circle", "the the red circle circle") == 2
    assert repetition_count("very very good", "very very good") == 0  # the reference repeats it too
    assert repetition_count("very very good", "very very very good") == 1


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    return make_asr_folder(root / "asr"), make_clip_folder(root / "clips", count=3)


@pytest.mark.slow
def test_bench_runs_every_method(folders):
    asr, clips_folder = folders
    model, processor = load_whisper("tiny", str(asr))
    clips = read_clip_folder(clips_folder)[:2]
    report = bench_speech(model, processor, clips, ctc_fast_decoder=load_fast_decoder(asr / "fast_decoder"),
                          ar_fast_decoder=load_fast_decoder(asr / "ar_fast_decoder"), repeats=1, progress=False)
    assert [r.method for r in report.rows] == ALL_METHODS
    assert len(report.notes) == 1 and "drops begin_suppress_tokens" in report.notes[0]
    for name in LOSSLESS:
        row = report.row(name)
        assert row.identical_to_greedy and report.transcripts[name] == report.transcripts[REFERENCE], name
    for row in report.rows:
        assert row.wer >= 0 and row.repetitions >= 0 and row.decoder_passes_per_utterance >= 1 and row.tau > 0
        assert 0 < row.decoder_time_s <= row.transcription_time_s and row.new_tokens > 0
    plain = report.row(REFERENCE)
    assert plain.decoder_speed_up == 1.0 and plain.transcription_speed_up == 1.0 and plain.tau == pytest.approx(1.0)
    assert report.row("hybrid-strict").drafter_forwards == 2  # one CTC pass per clip
    assert report.row("hybrid-strict-ar").drafter_forwards > 2 and report.row("hf-assisted-ar").drafter_forwards > 0
    assert report.row("hybrid-strict").alpha is not None and plain.alpha is None
    table = report.to_table()
    assert all(name in table for name in ALL_METHODS) and "lowercase, punctuation" in table
    assert {r["method"] for r in json.loads(report.to_json())["methods"]} == set(ALL_METHODS)


def test_cli_bench_speech_json(folders, capsys):
    asr, clips_folder = folders
    code = main(["bench", "speech", "--model", str(asr), "--data", str(clips_folder), "--n", "1", "--repeats", "1",
                 "--threads", "1", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert [m["method"] for m in result["methods"]] == ALL_METHODS and result["settings"]["clips"] == 1
    assert {"wer", "repetitions", "decoder_passes_per_utterance", "tau", "decoder_time_s", "transcription_time_s",
            "decoder_speed_up", "transcription_speed_up", "identical_to_greedy"} <= set(result["methods"][0])
    assert "lowercase" in result["settings"]["normalisation"]


def test_cli_bench_speech_feature_padding(folders, capsys, monkeypatch):
    asr, clips_folder = folders
    base = ["bench", "speech", "--model", str(asr), "--data", str(clips_folder), "--n", "2", "--repeats", "1", "--threads", "1"]
    code = main([*base, "--feature-padding", "log-mel", "--rows", "greedy-loop,hybrid-strict-ar", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["settings"]["feature_padding"] == "log-mel"
    assert all(m["identical_to_greedy"] for m in result["methods"])
    from mmspec.speech import bench_batches

    paddings = []
    real = bench_batches.clip_features
    monkeypatch.setattr(bench_batches, "clip_features", lambda *a: paddings.append(a[2]) or real(*a))
    code = main([*base, "--feature-padding", "audio", "--batch-size", "2"])
    assert code == 0, capsys.readouterr().err
    assert paddings and set(paddings) == {"audio"}  # the batched rows read the features the flag asks for


def test_default_heldout_folder_and_missing_fast_decoders(folders, tmp_path, capsys):
    asr, clips_folder = folders
    model_dir = tmp_path / "model"
    shutil.copytree(asr, model_dir, ignore=shutil.ignore_patterns("*fast_decoder"))
    code = main(["bench", "speech", "--model", str(model_dir), "--n", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "no --data given" in err and "heldout/metadata.jsonl is missing" in err and "pass --data DIR" in err
    shutil.copytree(clips_folder, model_dir / "heldout")
    code = main(["bench", "speech", "--model", str(model_dir), "--n", "1", "--repeats", "1", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert [m["method"] for m in result["methods"]] == [REFERENCE, "greedy-loop"]
    assert [n.split(" (")[0] for n in result["notes"]][:2] == ["no CTC fast decoder", "no AR fast decoder"]
    assert "faster-whisper rows were not run" in result["notes"][2]  # a transformers folder: no peer rows
    assert str(model_dir / "heldout") in result["title"]


def test_bench_refuses_nothing_to_run(folders):
    asr, _ = folders
    model, processor = load_whisper("tiny", str(asr))
    with pytest.raises(MMSpecError, match="no clips"):
        bench_speech(model, processor, [])


def test_bench_chain_rows(folders):
    asr, clips_folder = folders
    model, processor = load_whisper("tiny", str(asr))
    clips = read_clip_folder(clips_folder)[:2]
    ar = load_fast_decoder(asr / "ar_fast_decoder")
    report = bench_speech(model, processor, clips, ar_fast_decoder=ar, chain_tokens=(2, 5), repeats=1, progress=False)
    for name in ("hybrid-strict-ar-chain2", "hybrid-strict-ar-chain5"):
        assert report.row(name).identical_to_greedy and report.transcripts[name] == report.transcripts[REFERENCE]
    with pytest.raises(MMSpecError, match="pass --ar-fast-decoder or --feature-drafter"):
        bench_speech(model, processor, clips, chain_tokens=(2,), repeats=1, progress=False)
    with pytest.raises(MMSpecError, match="chain lengths must be >= 1"):
        bench_speech(model, processor, clips, ar_fast_decoder=ar, chain_tokens=(0,), repeats=1, progress=False)


@pytest.mark.slow
def test_bench_feature_drafter_rows(folders, tmp_path, capsys):
    asr, clips_folder = folders
    model, processor = load_whisper("tiny", str(asr))
    clips = read_clip_folder(clips_folder)[:2]
    WhisperFeatureDrafterModel.for_target(model, draft_tokens=4).half().save_pretrained(tmp_path / "fd")  # as shipped
    report = bench_speech(model, processor, clips, feature_drafter=load_feature_drafter(tmp_path / "fd"), repeats=1,
                          progress=False)
    row = report.row("feature-chain4")  # the drafter's own draft_tokens when no --chain
    assert row.identical_to_greedy and row.drafter_forwards > 0
    assert main(["bench", "speech", "--model", str(asr), "--data", str(clips_folder), "--n", "1", "--repeats", "1",
                 "--threads", "1", "--feature-drafter", str(tmp_path / "fd"), "--chain", "2", "--json"]) == 0
    methods = [r["method"] for r in json.loads(capsys.readouterr().out)["methods"]]
    assert "feature-chain2" in methods
