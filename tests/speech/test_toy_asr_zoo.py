"""The zoo ASR model (shapes-whisper-asr) transcribes the shipped clips offline, strictly losslessly.

Skips when the zoo folder has no weights (see its zoo_card.json for the rebuild commands).
"""

import json

import pytest

from mmspec.cli import main
from mmspec.zoo import MODELS_DIR

FOLDER = MODELS_DIR / "shapes-whisper-asr"
pytestmark = pytest.mark.skipif(not (FOLDER / "model.safetensors").is_file(), reason=f"no weights in {FOLDER}")


def clips(n=3):
    rows = [json.loads(line) for line in (FOLDER / "heldout" / "metadata.jsonl").read_text().splitlines()]
    return [(FOLDER / "heldout" / r["file"], r["text"]) for r in rows[:n]]


def test_hybrid_strict_equals_plain_greedy():
    from mmspec.speech.pipeline import TranscriptionPipeline

    pipe = TranscriptionPipeline.from_pretrained("shapes-whisper-asr")
    for path, _ in clips():
        plain = pipe(audio=str(path), method="ar")
        hybrid = pipe(audio=str(path), method="hybrid", mode="strict")
        assert hybrid.text == plain.text
        assert hybrid.stats.target_forwards < plain.stats.target_forwards


def test_transcribe_cli_json(capsys):
    path, _ = clips(1)[0]
    assert main(["transcribe", str(path), "--model", "shapes-whisper-asr", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["text"] and report["method"] == "hybrid"


def test_transcribe_cli_corrupt_file(tmp_path, capsys):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF....WAVEfmt garbage")
    assert main(["transcribe", str(bad)]) == 2
    assert "mmspec: error:" in capsys.readouterr().err
