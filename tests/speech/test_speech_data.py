"""The toy ASR's data: sentence streams, espeak-ng synthesis, dataset folders, WER normalisation."""

import json

import numpy as np
import pytest

from mmspec import MMSpecError
from mmspec.speech.recipes import speech_data
from mmspec.speech.wer import normalise, word_errors

needs_espeak = pytest.mark.skipif(not speech_data.espeak_available(), reason="espeak-ng is not installed")


def test_sentence_streams_are_seeded_and_disjoint():
    train = speech_data.sentences(40, "train")
    assert train == speech_data.sentences(40, "train")
    assert not set(train) & set(speech_data.sentences(40, "heldout"))
    assert any(s.startswith("in ") for s in train)  # shapes captions are in the mix


def test_unknown_split_is_a_clear_error():
    with pytest.raises(MMSpecError, match="unknown split"):
        speech_data.sentences(3, "dev")


@needs_espeak
def test_synthesised_dataset_folder(tmp_path):
    folder = speech_data.build_dataset(tmp_path / "d", 3, "heldout", max_seconds=10)
    rows = speech_data.read_metadata(folder)
    assert len(rows) == 3
    from mmspec.speech import load_audio
    audio = load_audio(rows[0]["path"], sampling_rate=16_000)
    assert abs(len(audio) / 16_000 - rows[0]["seconds"]) < 0.01
    assert np.abs(audio).max() > 0.05  # speech, not silence


def test_bad_metadata_is_a_clear_error(tmp_path):
    with pytest.raises(MMSpecError, match="no metadata.jsonl"):
        speech_data.read_metadata(tmp_path)
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file": "a.wav"}) + "\n")
    with pytest.raises(MMSpecError, match="'file' and 'text'"):
        speech_data.read_metadata(tmp_path)


def test_word_errors_after_normalisation():
    assert normalise("In the video, a RED disc!") == "in the video a red disc"
    assert word_errors("the red disc moves.", "The red disc moves") == (0, 4)
    assert word_errors("the red disc moves", "the blue disc moves left") == (2, 4)
    assert word_errors("a b c", "") == (3, 3)
