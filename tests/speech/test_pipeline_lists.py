"""TranscriptionPipeline takes lists of recordings: a list in, a list of outputs out (in order).

batch_size=1 decodes them one by one (every method); a larger batch_size needs a Whisper target
that decodes batches (`WhisperTarget.decodes_batches`) and a drafter that does: each recording of a
batched list equals the recording alone; without them, one line refuses it.
"""

import pytest

from mmspec import MMSpecError
from mmspec.speech.target import WhisperTarget

from .test_pipeline import asr_folder, clip, pipe, speechy, write_wav  # noqa: F401 - fixtures and helpers

RATE = 16_000


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recordings")
    files = [write_wav(folder / f"take-{i}.wav", speechy(0.6 + 0.2 * i, seed=i)) for i in range(3)]
    return [str(files[0]), {"array": speechy(0.9, seed=7), "sampling_rate": RATE}, speechy(2.5, seed=3), str(files[2])]


def alone(pipe, recordings, method):  # noqa: F811
    return [pipe(r, sampling_rate=RATE if not isinstance(r, (str, dict)) else None, method=method, progress_bar=False)
            for r in recordings]


def same(a, b):
    assert a.text == b.text and [c.tokens for c in a.chunks] == [c.tokens for c in b.chunks]
    assert a.stats.new_tokens == b.stats.new_tokens and a.decoder_passes == b.decoder_passes


@pytest.mark.parametrize("method", ["ar", "hybrid"])
def test_a_list_gives_each_recordings_own_transcript(pipe, recordings, method):  # noqa: F811
    rates = [None, None, RATE, None]
    outs = pipe(recordings, sampling_rate=rates, method=method, progress_bar=False)
    assert isinstance(outs, list) and len(outs) == len(recordings)
    for out, lone in zip(outs, alone(pipe, recordings, method)):
        same(out, lone)
    assert len(outs[2].chunks) > 1  # the long one is windowed as alone
    assert len({o.text for o in outs}) > 1  # the control: items differ, so a mix-up would show


def test_batches_refused_when_whisper_does_not_batch(pipe, recordings, monkeypatch):  # noqa: F811
    monkeypatch.setattr(WhisperTarget, "decodes_batches", False)
    with pytest.raises(MMSpecError, match=r"batch_size=2: the model \(WhisperTarget over WhisperForConditionalGeneration\) "
                                          r"decodes one sequence at a time; use batch_size=1$"):
        pipe(recordings, sampling_rate=[None, None, RATE, None], method="ar", batch_size=2, progress_bar=False)
    assert pipe.batching_methods() == []


def test_a_drafter_that_cannot_batch_is_named(pipe, recordings, monkeypatch):  # noqa: F811
    from mmspec.speech.hybrid import HybridDrafter

    monkeypatch.setattr(HybridDrafter, "drafts_batches", False)
    with pytest.raises(MMSpecError, match=r"batch_size=3: method 'hybrid' drafts one sequence at a time \(HybridDrafter\); "
                                          r"use batch_size=1 or a method that batches \(ar\)$"):
        pipe(recordings, sampling_rate=[None, None, RATE, None], method="hybrid", batch_size=3, progress_bar=False)


@pytest.mark.skipif(not WhisperTarget.decodes_batches, reason="WhisperTarget.decodes_batches is False: batches not wired yet")
@pytest.mark.parametrize("method", ["ar", "hybrid"])
@pytest.mark.parametrize("batch_size", [2, 3])
def test_batched_list_equals_each_alone(pipe, recordings, method, batch_size):  # noqa: F811
    if method not in pipe.batching_methods():
        pytest.skip(f"method {method!r} does not batch yet")
    outs = pipe(recordings, sampling_rate=[None, None, RATE, None], method=method, batch_size=batch_size, progress_bar=False)
    for out, lone in zip(outs, alone(pipe, recordings, method)):
        assert out.text == lone.text and [c.tokens for c in out.chunks] == [c.tokens for c in lone.chunks]
        assert [(c.start_s, c.end_s) for c in out.chunks] == [(c.start_s, c.end_s) for c in lone.chunks]
        assert out.stats.new_tokens == lone.stats.new_tokens and out.segments == lone.segments
    assert len({o.text for o in outs}) > 1  # the control: items differ, so a mix-up would show


def test_bad_list_calls(pipe, recordings, clip):  # noqa: F811
    with pytest.raises(MMSpecError, match="batch_size must be an integer >= 1"):
        pipe(recordings, batch_size=0, progress_bar=False)
    with pytest.raises(MMSpecError, match="got 2 sampling_rates for 4 inputs"):
        pipe(recordings, sampling_rate=[RATE, RATE], progress_bar=False)
    with pytest.raises(MMSpecError, match="sampling_rate is a list"):
        pipe(str(clip), sampling_rate=[RATE], progress_bar=False)
    with pytest.raises(MMSpecError, match="the list of audio is empty"):
        pipe([], progress_bar=False)
    with pytest.raises(MMSpecError, match="callback_on_round follows one sequence"):
        pipe(recordings, batch_size=2, callback_on_round=lambda *a: None, progress_bar=False)
