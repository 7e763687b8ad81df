"""The windows of one long recording decode as a batch (`decoder_batch_size`): each window's tokens are those of
greedy decoding of that window alone, so the chunks, segments and text equal one-window-at-a-time decoding, with
fewer decoder forwards."""

import pytest
import torch

from mmspec.speech.audio import load_audio
from mmspec.speech.pipeline import DECODER_BATCH, TranscriptionPipeline

from .conftest import MAX_NEW
from .test_long_audio_packing import bursts, ending_folder, greedy_on_states, planned  # noqa: F401 - fixtures
from .tiny_asr import make_asr_folder


@pytest.fixture(scope="module")
def ar_folder(tmp_path_factory):
    """A toy with an AR fast decoder (in a batch it drafts whole hypotheses)."""
    return make_asr_folder(tmp_path_factory.mktemp("ar-asr"), ctc=False, ar=True)


def decoder_forwards(pipe, call):
    count = 0

    def hook(*_):
        nonlocal count
        count += 1

    handle = pipe.model.get_decoder().register_forward_hook(hook)
    try:
        out = call()
    finally:
        handle.remove()
    return out, count


@pytest.mark.parametrize(("kind", "compute_type"), [("ctc", "float32"), ("ar", "float32"), ("ar", "int8")])
@pytest.mark.parametrize("method", ["ar", "hybrid"])
def test_batched_windows_equal_windows_alone(ending_folder, ar_folder, bursts, kind, compute_type, method):  # noqa: F811
    pipe = TranscriptionPipeline.from_pretrained(ending_folder if kind == "ctc" else ar_folder, fast_decoder=kind,
                                                 compute_type=compute_type)
    assert pipe.decoder_batch_size == DECODER_BATCH > 1 and pipe.window_batch_size(method) == DECODER_BATCH
    samples = load_audio(bursts)
    _, windows = planned(pipe, samples, 0)
    assert len(windows) > 2
    run = lambda: pipe(bursts, method=method, pack_seconds=0, max_new_tokens=MAX_NEW, progress_bar=False)  # noqa: E731
    batched, batched_forwards = decoder_forwards(pipe, run)
    pipe.decoder_batch_size = 1
    alone, alone_forwards = decoder_forwards(pipe, run)
    assert [c.tokens for c in batched.chunks] == [c.tokens for c in alone.chunks]
    assert batched.segments == alone.segments and batched.text == alone.text
    assert [(c.start_s, c.end_s) for c in batched.chunks] == [(c.start_s, c.end_s) for c in alone.chunks]
    assert batched_forwards < alone_forwards  # a forward serves several windows
    # the rows of a batch share its time: the chunks' times add up to no more than the call's
    assert sum(c.stats.total_time for c in batched.chunks) + batched.encoder_time_s <= batched.total_time_s
    size = pipe.encoder_batch_size
    states = torch.cat([pipe.encode([w.samples(samples) for w in windows[k:k + size]])[0] for k in range(0, len(windows), size)])
    assert [c.tokens for c in batched.chunks] == [greedy_on_states(pipe, states[i:i + 1]) for i in range(len(windows))]


def test_a_redrafting_ar_fast_decoder_decodes_window_by_window(ar_folder):
    pipe = TranscriptionPipeline.from_pretrained(ar_folder, fast_decoder="ar")
    pipe.fast_decoder.config.draft_redraft = True  # as whisper-tiny.en's shipped one
    assert pipe.window_batch_size("hybrid") == 1 and pipe.window_batch_size("ar") == DECODER_BATCH


def test_a_round_callback_decodes_window_by_window(ending_folder, bursts):  # noqa: F811
    pipe = TranscriptionPipeline.from_pretrained(ending_folder)
    seen = []
    out = pipe(bursts, method="hybrid", pack_seconds=0, max_new_tokens=MAX_NEW, progress_bar=False,
               callback_on_round=lambda index, info: seen.append(info.chunk))
    assert sorted(set(seen)) == list(range(len(out.chunks)))  # every window reported as its own chunk
    assert pipe.window_batch_size("hybrid", pipe.round_reporter(print)) == 1


def test_decoder_batches_are_not_capped_by_encoder_batches(ending_folder, bursts):  # noqa: F811
    """Windows encoded one at a time still decode `decoder_batch_size` at a time, with the tokens of each alone."""
    pipe = TranscriptionPipeline.from_pretrained(ending_folder)
    pipe.encoder_batch_size = 1
    run = lambda: pipe(bursts, method="ar", pack_seconds=0, max_new_tokens=MAX_NEW, progress_bar=False)  # noqa: E731
    batched, batched_forwards = decoder_forwards(pipe, run)
    pipe.decoder_batch_size = 1
    alone, alone_forwards = decoder_forwards(pipe, run)
    assert len(alone.chunks) > 2
    assert [c.tokens for c in batched.chunks] == [c.tokens for c in alone.chunks] and batched.text == alone.text
    assert batched_forwards < alone_forwards


def test_hybrid_strict_with_timestamps_decodes_as_batched_greedy_when_its_drafter_cannot_batch(ar_folder, bursts):  # noqa: F811
    """A re-drafting AR fast decoder drafts one window at a time; with timestamps and several windows hybrid strict then
    decodes the windows as batched greedy (its tokens by definition), and says so."""
    pipe = TranscriptionPipeline.from_pretrained(ar_folder, fast_decoder="ar")
    pipe.fast_decoder.config.draft_redraft = True
    settings = dict(pack_seconds=0, max_new_tokens=MAX_NEW, progress_bar=False)
    hybrid, hybrid_forwards = decoder_forwards(pipe, lambda: pipe(bursts, method="hybrid", timestamps=True, **settings))
    greedy = pipe(bursts, method="ar", timestamps=True, **settings)
    assert len(hybrid.chunks) > 2
    assert hybrid.method == "ar" and "batched greedy" in hybrid.note and hybrid.stats.method == "ar"
    assert [c.tokens for c in hybrid.chunks] == [c.tokens for c in greedy.chunks] and hybrid.text == greedy.text
    pipe.decoder_batch_size = 1  # greedy cannot batch either: hybrid strict itself, window by window
    one_by_one, one_by_one_forwards = decoder_forwards(pipe, lambda: pipe(bursts, method="hybrid", timestamps=True, **settings))
    assert one_by_one.method == "hybrid" and one_by_one.note is None
    assert [c.tokens for c in one_by_one.chunks] == [c.tokens for c in hybrid.chunks]
    pipe.decoder_batch_size = DECODER_BATCH
    plain = pipe(bursts, method="hybrid", **settings)  # without timestamps: hybrid strict as before
    assert plain.method == "hybrid" and plain.note is None
    assert hybrid_forwards < one_by_one_forwards  # a forward served several windows
    clip = load_audio(bursts)[: int(16000 * pipe.chunk_seconds * 0.9)]  # one window: hybrid strict itself
    short = pipe(clip, sampling_rate=16000, method="hybrid", timestamps=True, max_new_tokens=MAX_NEW, progress_bar=False,
                 silence_threshold=None)
    assert len(short.chunks) == 1 and short.method == "hybrid" and short.note is None
