"""timestamps=True: each window is decoded as Whisper's `generate(return_timestamps=True)` decodes it (the prompt without
`<|notimestamps|>`, Whisper's timestamp rules after its suppressions), hybrid strict equal to greedy; the text leaves the
timestamp tokens out."""

import pytest
import torch
from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor
from transformers.modeling_outputs import BaseModelOutput

from mmspec.errors import MMSpecError
from mmspec.speech.audio import load_audio
from mmspec.speech.pipeline import TranscriptionPipeline
from mmspec.speech.target import WhisperTarget

from .conftest import MAX_NEW
from .test_long_audio_packing import bursts, ending_folder, planned  # noqa: F401 - fixtures
from .tiny_whisper import EOT, NO_TIMESTAMPS


def greedy_with_timestamps(model, states, prompt, limit):
    """Greedy decoding by hand with Whisper's processors in `generate`'s order: begin suppression (first new position),
    suppression, then the timestamp rules; until end-of-text or `limit` new tokens."""
    config = model.generation_config
    stamps = WhisperTimeStampLogitsProcessor(config, begin_index=prompt.shape[1])
    sequence = prompt.clone()
    for step in range(limit):
        with torch.no_grad():
            logits = model(encoder_outputs=BaseModelOutput(last_hidden_state=states), decoder_input_ids=sequence,
                           use_cache=False).logits[:, -1].clone()
        if step == 0:
            logits[:, list(config.begin_suppress_tokens or [])] = float("-inf")
        logits[:, list(config.suppress_tokens or [])] = float("-inf")
        token = int(stamps(sequence, logits).argmax())
        sequence = torch.cat([sequence, torch.tensor([[token]])], dim=1)
        if token == EOT:
            break
    return sequence[0, prompt.shape[1]:].tolist()


@pytest.mark.parametrize("method", ["ar", "hybrid"])
def test_each_window_is_greedy_with_timestamps(ending_folder, bursts, method):  # noqa: F811
    pipe = TranscriptionPipeline.from_pretrained(ending_folder)
    pipe.encoder_batch_size = 1  # each window's states as encoded alone (the reference encodes them alone)
    out = pipe(bursts, method=method, max_new_tokens=MAX_NEW, progress_bar=False, timestamps=True)
    plain = pipe(bursts, method=method, max_new_tokens=MAX_NEW, progress_bar=False)
    samples = load_audio(bursts)
    _, windows = planned(pipe, samples, pipe.chunk_seconds)
    assert len(out.chunks) == len(windows) > 1
    stamped = 0
    for window, chunk in zip(windows, out.chunks):
        states = pipe.encode([window.samples(samples)])[0]
        prompt = WhisperTarget(pipe.model, timestamps=True).prompt_ids(
            {"encoder_outputs": BaseModelOutput(last_hidden_state=states)})
        assert NO_TIMESTAMPS not in prompt[0].tolist()
        limit = min(MAX_NEW, pipe.model.config.max_target_positions - prompt.shape[1])
        assert chunk.tokens == greedy_with_timestamps(pipe.model, states, prompt, limit)
        stamped += sum(t > NO_TIMESTAMPS for t in chunk.tokens)
    assert stamped > 0  # the rules were exercised: timestamp tokens were decoded
    assert [c.tokens for c in out.chunks] != [c.tokens for c in plain.chunks]


def test_hybrid_equals_greedy_with_timestamps_in_batches(ending_folder, bursts):  # noqa: F811
    pipe = TranscriptionPipeline.from_pretrained(ending_folder)
    outs = {m: pipe(bursts, method=m, max_new_tokens=MAX_NEW, progress_bar=False, timestamps=True) for m in ("ar", "hybrid")}
    assert [c.tokens for c in outs["ar"].chunks] == [c.tokens for c in outs["hybrid"].chunks]
    assert outs["ar"].text == outs["hybrid"].text


def test_the_text_leaves_timestamps_out():
    pipe = TranscriptionPipeline.from_pretrained("whisper-tiny.en")
    first = pipe.tokenizer.convert_tokens_to_ids("<|0.00|>")
    words = pipe.tokenizer.encode(" in this clip", add_special_tokens=False)
    assert pipe.text_tokens([first, *words, first + 100, pipe.tokenizer.eos_token_id]) == words
    assert pipe.text_of([first, *words, first + 100]) == "in this clip"


def test_timestamps_are_checked(ending_folder, bursts):  # noqa: F811
    pipe = TranscriptionPipeline.from_pretrained(ending_folder)
    with pytest.raises(MMSpecError, match="timestamps must be True, False or None"):
        pipe(bursts, timestamps="yes", progress_bar=False)
    with pytest.raises(MMSpecError, match="compiled path decodes without timestamps"):
        pipe(bursts, timestamps=True, compile=True, progress_bar=False)


def test_suppressed_tokens_give_transformers_scores():
    from transformers.generation.logits_process import (
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
    )

    from mmspec.speech.suppression import SuppressedTokens

    torch.manual_seed(0)
    scores, ids = torch.randn(3, 50), [1, 7, 49, 60]
    for length in (4, 5):
        prefix = torch.zeros(3, length, dtype=torch.long)
        assert torch.equal(SuppressedTokens(ids)(prefix, scores), SuppressTokensLogitsProcessor(ids)(prefix, scores))
        assert torch.equal(SuppressedTokens(ids, 4)(prefix, scores),
                           SuppressTokensAtBeginLogitsProcessor(ids, 4)(prefix, scores))
