"""The varied speech recipe: text sources, disjoint splits, voices per split, resumable folders."""

import importlib.util
import itertools
import json

import pytest

from mmspec.speech.recipes import speech_data, varied_speech

needs_espeak = pytest.mark.skipif(not speech_data.espeak_available(), reason="espeak-ng is not installed")
needs_sources = pytest.mark.skipif(
    importlib.util.find_spec("essential_generators") is None or importlib.util.find_spec("hibari") is None,
    reason="the recipe's packages (essential-generators, hibari-tts) are not installed",
)


@pytest.fixture(autouse=True)
def small_toy_pool(monkeypatch):
    monkeypatch.setattr(varied_speech, "TOY_POOL", 2000)  # the shipped 200k takes seconds per stream


def test_docstring_sentences_are_plain_prose():
    sentences = varied_speech.docstring_sentences()
    assert len(sentences) > 1000
    assert len(set(sentences)) == len(sentences)
    for sentence in sentences:
        assert varied_speech.PLAIN_SENTENCE.match(sentence)
        assert 4 <= len(sentence.split()) <= 24


def test_split_of_is_a_function_of_the_words():
    assert varied_speech.split_of("Return the value.") == varied_speech.split_of("return  the VALUE!")
    splits = [varied_speech.split_of(s) for s in varied_speech.docstring_sentences()]
    assert 0.05 < splits.count("heldout") / len(splits) < 0.15


@pytest.mark.slow
@needs_sources
def test_streams_keep_the_splits_apart_and_replay():
    train = list(itertools.islice(varied_speech.sentence_stream("train", 0), 300))
    assert train == list(itertools.islice(varied_speech.sentence_stream("train", 0), 300))
    assert {source for source, _ in train} == set(varied_speech.SOURCES)
    held = list(itertools.islice(varied_speech.sentence_stream("heldout", 0), 300))
    for source, sentence in train + held:
        if source != "toy":  # the toy's sentences are split by speech_data's own seeds
            assert varied_speech.split_of(sentence) == ("train" if (source, sentence) in train else "heldout")
    assert not {s for _, s in train if _ != "toy"} & {s for _, s in held if _ != "toy"}


@needs_sources
def test_markov_sentences_come_from_the_chain():
    import random

    first = [varied_speech.markov_sentence(random.Random(3), 12) for _ in range(2)]
    assert first[0] == first[1] and first[0].endswith(".") and first[0][0].isupper()
    assert 4 <= len(first[0].split()) <= 12
    assert all(ch.isalpha() or ch in " ,'-." for ch in first[0])


@pytest.mark.slow
@needs_espeak
@needs_sources
def test_build_resumes_where_it_stopped(tmp_path):
    whole = varied_speech.build(tmp_path / "whole", 9, "heldout", seed=1)
    varied_speech.build(tmp_path / "parts", 5, "heldout", seed=1)
    parts = varied_speech.build(tmp_path / "parts", 4, "heldout", seed=1)
    rows = [json.loads(line) for line in (parts / "metadata.jsonl").read_text().splitlines()]
    assert rows == [json.loads(line) for line in (whole / "metadata.jsonl").read_text().splitlines()]
    assert len(rows) == 9 and all((parts / r["file"]).read_bytes() == (whole / r["file"]).read_bytes() for r in rows)
    for row in rows:  # held-out clips never use a training voice variant
        assert row["voice"] == "hibari-heart" or any(row["voice"].endswith(v) for v in varied_speech.HELDOUT_VARIANTS)
        assert 0.5 <= row["seconds"] <= 20.0
