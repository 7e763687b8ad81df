"""The transcription pipeline and `mmspec transcribe` on a tiny random Whisper with an offline-built processor.

The model folder holds a tiny random Whisper (tiny_whisper.py), a real `WhisperProcessor` (a
`WhisperFeatureExtractor` whose 1 s window makes the 64 frames the tiny encoder reads, and a
`WhisperTokenizer` built offline from a byte-level vocabulary with Whisper's special tokens at the
tiny model's ids) and a random `CTCFastDecoder` in `fast_decoder/`. Random models: only exactness
(hybrid strict and ar equal Whisper's greedy `generate`) and plumbing are tested, not accuracy.
"""

import json
import wave

import numpy as np
import pytest
import torch
from tokenizers import pre_tokenizers
from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer
from transformers.modeling_outputs import BaseModelOutput

from mmspec import MMSpecError
from mmspec.cli import main
from mmspec.speech import CTCFastDecoder, load_audio
from mmspec.speech.pipeline import FAST_DECODER_FOLDER, TranscriptionPipeline

from .tiny_whisper import BLANK, EOT, NUM_FRAMES, NUM_MEL_BINS, VOCAB, tiny_whisper

RATE = 16_000
HOP = RATE // NUM_FRAMES  # 250 samples per frame: a 1 s window gives the encoder's 64 frames
SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|fr|>", "<|translate|>", "<|transcribe|>",
            "<|notimestamps|>", "<|startofprev|>", "<|startoflm|>", "<|nospeech|>"]
MAX_NEW = 24


def tiny_processor() -> WhisperProcessor:
    """A WhisperProcessor for the tiny model, built without the Hub."""
    ordinary = list("abcdefg") + ["Ġ"]  # id 7 (BLANK) is the byte-level space, like Whisper's 220
    for char in list("hijklmnopqrstuvwxyz") + sorted(pre_tokenizers.ByteLevel.alphabet()):
        if len(ordinary) == EOT:
            break
        if char not in ordinary:
            ordinary.append(char)
    vocab = {char: i for i, char in enumerate(ordinary)}
    vocab.update({token: EOT + i for i, token in enumerate(SPECIALS)})
    assert vocab["Ġ"] == BLANK and len(vocab) == VOCAB
    tokenizer = WhisperTokenizer(vocab=vocab, merges=[], extra_special_tokens=SPECIALS[1:])
    extractor = WhisperFeatureExtractor(feature_size=NUM_MEL_BINS, sampling_rate=RATE, hop_length=HOP, chunk_length=1)
    return WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer)


def write_wav(path, samples, rate=RATE):
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())
    return path


def speechy(seconds, seed=0, rate=RATE):
    """A chirp with noise bursts: not speech, but it moves the random model's transcript around."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    chirp = 0.3 * np.sin(2 * np.pi * (200 + 300 * t + 50 * seed) * t)
    return (chirp + 0.2 * rng.standard_normal(t.shape) * (np.sin(7 * t) > 0)).astype(np.float32)


@pytest.fixture(scope="module")
def asr_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-asr")
    whisper = tiny_whisper()
    whisper.save_pretrained(folder)
    tiny_processor().save_pretrained(folder)
    torch.manual_seed(0)
    head = CTCFastDecoder.for_target(whisper, hidden_size=32, intermediate_size=64, num_attention_heads=4, upsample=2)
    head.head.bias.data[head.blank_id] = -5.0  # mostly non-blank frames: a long, mostly wrong draft to correct
    head.save_pretrained(folder / FAST_DECODER_FOLDER)
    return folder


@pytest.fixture(scope="module")
def pipe(asr_folder):
    return TranscriptionPipeline.from_pretrained(asr_folder)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return write_wav(tmp_path_factory.mktemp("audio") / "clip.wav", speechy(0.8))


def greedy(pipe, samples, max_new_tokens=None):
    """Whisper's own greedy `generate` on one chunk: new tokens (end-of-text included, as the loop returns them)."""
    features = pipe.features(samples)
    kwargs = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
    sequences = pipe.model.generate(features, do_sample=False, return_dict_in_generate=True, **kwargs).sequences
    return sequences[0, 4:].tolist()  # after <|startoftranscript|> <|lang|> <|transcribe|> <|notimestamps|>


def test_fast_decoder_found_in_subfolder(pipe):
    assert pipe.fast_decoder is not None and pipe.available_methods == ["hybrid", "ar"] and pipe.default_method == "hybrid"
    assert pipe.chunk_seconds == 1.0


@pytest.mark.parametrize("method", ["ar", "hybrid"])
@pytest.mark.parametrize("max_new_tokens", [MAX_NEW, None])
def test_methods_equal_greedy_generate(pipe, clip, method, max_new_tokens):
    expected = greedy(pipe, load_audio(clip), max_new_tokens)
    out = pipe(clip, method=method, max_new_tokens=max_new_tokens, progress_bar=False)
    assert len(out.chunks) == 1 and out.chunks[0].tokens == expected
    assert out.text == pipe.tokenizer.decode(expected, skip_special_tokens=True).strip()
    assert out.method == method and out.mode == "strict" and out.model == str(pipe.model_name)
    assert out.stats.new_tokens == len(expected)
    # the language is detected (one decoder step), then the loop's passes
    assert out.decoder_passes == out.stats.target_forwards + 1
    if method == "ar":
        assert out.stats.target_forwards == len(expected) and out.stats.drafter_forwards == 0
    else:
        assert out.stats.drafter_forwards == 1


@pytest.mark.slow
def test_long_audio_windows_overlap_and_each_equals_greedy(pipe, tmp_path):
    samples = speechy(2.5, seed=3)
    path = write_wav(tmp_path / "long.wav", samples)
    out = pipe(path, method="hybrid", max_new_tokens=MAX_NEW, progress_bar=False)
    audio = load_audio(path)
    bounds = [(round(c.start_s * RATE), round(c.end_s * RATE)) for c in out.chunks]
    stride = round(RATE / 6)  # a sixth of the 1 s window on each side, as transformers' ASR pipeline
    assert len(bounds) >= 3 and bounds[0][0] == 0 and bounds[-1][1] == audio.shape[0]
    assert all(b[0] - a[0] == RATE - 2 * stride and a[1] - b[0] == 2 * stride for a, b in zip(bounds, bounds[1:-1]))
    greedy_loop = pipe(path, method="ar", max_new_tokens=MAX_NEW, progress_bar=False)
    assert [c.tokens for c in out.chunks] == [c.tokens for c in greedy_loop.chunks]  # lossless window by window
    ended = [(c, b) for c, b in zip(out.chunks, bounds) if c.tokens[-1] == pipe.model.generation_config.eos_token_id]
    assert len(ended) >= 2
    # ...and each is the model's own generate. (A window that reaches max_new_tokens without end-of-text is left
    # out: there transformers' Whisper generate starts a second decoding pass, see speech/bench.py.)
    for chunk, (start, end) in ended:
        assert chunk.tokens == greedy(pipe, audio[start:end], MAX_NEW)
    for name in ("new_tokens", "target_forwards", "drafter_forwards", "drafted", "accepted", "rounds"):
        assert getattr(out.stats, name) == sum(getattr(c.stats, name) for c in out.chunks), name
    assert out.decoder_passes == sum(c.decoder_passes for c in out.chunks) == out.stats.target_forwards + len(bounds)
    segments = out.segments
    assert len(segments) == len(bounds) and segments[0].start_s == 0.0 and segments[-1].end_s == audio.shape[0] / RATE
    assert all(a.end_s == b.start_s for a, b in zip(segments, segments[1:]))  # owned spans tile the region
    assert out.text == " ".join(s.text for s in segments if s.text)
    relaxed = pipe(path, method="hybrid", mode="relaxed", max_new_tokens=MAX_NEW, progress_bar=False)
    assert relaxed.mode == "relaxed" and len(relaxed.chunks) == len(bounds) and relaxed.stats.method == "hybrid-relaxed"


def test_array_input_at_another_rate(pipe):
    samples = speechy(0.8, seed=1, rate=8000)
    out = pipe(samples, sampling_rate=8000, method="ar", max_new_tokens=MAX_NEW, progress_bar=False)
    # Whisper's greedy `generate` on the encoder states of the window's features, which is what the pipeline's exactness
    # means (given the log-mel-padded features themselves, transformers' `generate` decoded other tokens on this random
    # model, which emits timestamp tokens: its segment handling, not the encoder states the pipeline decodes)
    states, _ = pipe.encode([load_audio(samples, RATE, source_sampling_rate=8000)])
    sequences = pipe.model.generate(encoder_outputs=BaseModelOutput(last_hidden_state=states), do_sample=False,
                                    max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
    assert out.chunks[0].tokens == sequences[0, 4:].tolist()


def test_silence_transcribes_to_nothing(pipe):
    out = pipe(np.zeros(2 * RATE, np.float32), sampling_rate=RATE, progress_bar=False)
    assert out.text == "" and out.decoder_passes == 0 and out.note and "silent" in out.note
    assert out.chunks == [] and out.segments == [] and out.stats.new_tokens == 0
    gap = np.concatenate([speechy(1.0), np.zeros(RATE, np.float32), speechy(1.0, seed=2)])
    out = pipe(gap, sampling_rate=RATE, max_new_tokens=MAX_NEW, progress_bar=False)
    assert out.note is None and out.chunks
    assert all(c.end_s <= 1.3 or c.start_s >= 1.7 for c in out.chunks)  # the pause is not decoded
    assert any(c.end_s <= 1.3 for c in out.chunks) and any(c.start_s >= 1.7 for c in out.chunks)
    forced = pipe(np.zeros(RATE, np.float32), sampling_rate=RATE, max_new_tokens=4, silence_threshold=None, progress_bar=False)
    assert forced.decoder_passes > 0 and len(forced.chunks) == 1


def test_too_short_audio_is_one_clear_error(pipe):
    with pytest.raises(MMSpecError, match="too short to hold speech"):
        pipe(speechy(0.1), sampling_rate=RATE, progress_bar=False)


def test_bad_calls(pipe, clip, tmp_path):
    with pytest.raises(MMSpecError, match="unknown method"):
        pipe(clip, method="beam")
    with pytest.raises(MMSpecError, match="unknown mode"):
        pipe(clip, mode="loose")
    with pytest.raises(MMSpecError, match="hybrid decoding only"):
        pipe(clip, method="ar", mode="relaxed")
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF not really a wave file" * 50)
    with pytest.raises(MMSpecError, match="cannot read audio"):
        pipe(corrupt)
    plain = TranscriptionPipeline(pipe.model, pipe.processor)
    assert plain.available_methods == ["ar"] and plain.default_method == "ar"
    with pytest.raises(MMSpecError, match="needs a fast decoder"):
        plain(clip, method="hybrid")


def test_bad_loads(asr_folder, tmp_path):
    with pytest.raises(MMSpecError, match="cannot load the (ASR )?model 'no-such-asr-model'"):
        TranscriptionPipeline.from_pretrained("no-such-asr-model")
    with pytest.raises(MMSpecError, match="cannot load the fast decoder"):
        TranscriptionPipeline.from_pretrained(asr_folder, fast_decoder=tmp_path)
    other = CTCFastDecoder.for_target(tiny_whisper(), hidden_size=32, intermediate_size=64, num_attention_heads=4)
    other.config.vocab_size = VOCAB + 1
    with pytest.raises(MMSpecError, match="predicts 129 tokens"):
        TranscriptionPipeline.from_pretrained(asr_folder, fast_decoder=other)


def test_cli_transcribe_json(asr_folder, clip, capsys):
    code = main(["transcribe", str(clip), "--model", str(asr_folder), "--max-new-tokens", str(MAX_NEW), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["method"] == "hybrid" and result["mode"] == "strict" and result["model"] == str(asr_folder)
    assert "method 'hybrid'" in captured.err
    assert {"new_tokens", "target_forwards", "mean_accepted_length", "acceptance_rate", "wall_time_s", "tokens_per_s",
            "decoder_passes"} <= set(result["stats"])
    assert result["stats"]["decoder_passes"] == result["stats"]["target_forwards"] + 1
    code = main(["transcribe", str(clip), "--model", str(asr_folder), "--method", "ar", "--max-new-tokens", "4"])
    captured = capsys.readouterr()
    assert code == 0 and "decoder passes" in captured.err


def test_cli_transcribe_corrupt_file(asr_folder, tmp_path, capsys):
    bad = tmp_path / "corrupt.wav"
    bad.write_bytes(b"garbage" * 1000)
    code = main(["transcribe", str(bad), "--model", str(asr_folder)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("mmspec: error:")] == [err.strip().splitlines()[-1]]
    assert len([line for line in err.splitlines() if "error" in line]) == 1


def test_cli_missing_zoo_default(clip, capsys, monkeypatch):
    monkeypatch.setattr("mmspec.speech.models.entries", lambda: [])  # as in an install without the zoo's tiny.en
    monkeypatch.setattr("mmspec.zoo.entries", lambda: [])
    code = main(["transcribe", str(clip)])
    err = capsys.readouterr().err
    assert code == 2 and "cannot load the" in err and "'whisper-tiny.en'" in err and "Traceback" not in err
