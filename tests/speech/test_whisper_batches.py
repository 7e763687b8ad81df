"""Whisper decodes batches of recordings: plain and hybrid decoding (each recording its own
hypothesis and alignment cursor) equal Whisper's batched `generate` and each recording alone."""

import pytest
import torch

from mmspec import speculative_generate
from mmspec.drafters import NoDrafter
from mmspec.speech import CTCFastDecoder, hybrid_generate
from mmspec.speech.target import WhisperTarget

from .conftest import MAX_NEW
from .test_hybrid import hypotheses
from .tiny_whisper import features

SEEDS = [0, 1, 2, 3, 4]


class PerRowHypotheses:
    """Test double of a fast decoder: row b of the batch gets hypotheses[b]."""

    def __init__(self, rows):
        self.rows = [list(r) for r in rows]

    def hypothesis(self, encoder_hidden_states):
        assert encoder_hidden_states.shape[0] == len(self.rows)
        return [list(r) for r in self.rows]


@pytest.fixture(scope="module")
def batch_reference(whisper, references):
    x = torch.cat([references[seed][0] for seed in SEEDS])
    expected = whisper.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
    return x, expected


def test_plain_batch_equals_generate(whisper, references, batch_reference):
    x, expected = batch_reference
    out = speculative_generate(whisper, NoDrafter(), None, input_features=x, max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, expected)
    for row, seed in enumerate(SEEDS):
        alone = references[seed][1][0]
        assert torch.equal(out.sequences[row, : alone.shape[0]], alone)


@pytest.mark.parametrize("kinds", [
    ["exact"] * 5,
    ["exact", "wrong_middle", "empty", "garbage", "inserted_middle"],
    ["shifted", "too_long", "wrong_start_3", "deleted_middle", "too_short"],
])
def test_hybrid_batch_equals_generate(whisper, references, batch_reference, kinds):
    x, expected = batch_reference
    rows = [hypotheses(references[seed][2])[kind] for seed, kind in zip(SEEDS, kinds)]
    target = WhisperTarget(whisper)
    out = hybrid_generate(target, PerRowHypotheses(rows), x, max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, expected)
    assert out.target.certified_head is not None  # greedy verification of the batch read argmaxes from the certified head
    if kinds == ["exact"] * 5:
        # Every row's whole transcript rides along with the prefill: one decoder pass per recording.
        assert all(row.target_forwards == 1 for row in out.stats.rows)
        assert out.stats.alpha == 1.0


def test_random_ctc_head_in_a_batch(whisper, batch_reference):
    x, expected = batch_reference
    torch.manual_seed(0)
    head = CTCFastDecoder.for_target(whisper, hidden_size=32, intermediate_size=64, num_attention_heads=4, upsample=2).eval()
    head.head.bias.data[head.blank_id] = -5.0
    out = hybrid_generate(whisper, head, x, max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, expected)
    assert out.drafter.stats.hypothesis_length > 0


def test_each_recording_detects_its_language(whisper):
    """A multilingual model detects the language per recording, as generate does."""
    x = torch.cat([features(seed) for seed in range(8)])
    expected = whisper.generate(x, do_sample=False, max_new_tokens=4, return_dict_in_generate=True).sequences
    out = speculative_generate(whisper, NoDrafter(), None, input_features=x, max_new_tokens=4)
    assert torch.equal(out.sequences[:, 1], expected[:, 1])


@pytest.mark.parametrize("init_layer", [-1, 1])
def test_ar_fast_decoder_batch_equals_generate(whisper, references, batch_reference, init_layer):
    """The AR fast decoder drafts every recording's hypothesis in one batched pass per forced prompt (the
    recordings' detected languages may differ); each row's hypothesis is the one it drafts alone."""
    from mmspec import SpeculativeDecoder
    from mmspec.speech import ARFastDecoder, ARHybridDrafter, WhisperTarget, hybrid_rule
    from mmspec.speech.hybrid import hybrid_policy

    x, expected = batch_reference
    fast = ARFastDecoder.for_target(whisper, init_layer=init_layer)
    drafter = ARHybridDrafter(fast)
    decoder = SpeculativeDecoder(WhisperTarget(whisper), drafter, policy=hybrid_policy(), rule=hybrid_rule("strict"))
    out = decoder.generate(None, input_features=x, max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, expected)
    assert out.stats.accepted > 0 if init_layer == 1 else True
    for row, seed in enumerate(SEEDS):
        alone = SpeculativeDecoder(WhisperTarget(whisper), ARHybridDrafter(fast), policy=hybrid_policy(),
                                   rule=hybrid_rule("strict")).generate(None, input_features=references[seed][0],
                                                                        max_new_tokens=MAX_NEW)
        assert out.drafter._hypotheses[row] == alone.drafter.hypothesis


def test_ar_fast_decoder_re_drafting_stays_one_recording_at_a_time(whisper, batch_reference):
    from mmspec import MMSpecError, SpeculativeDecoder
    from mmspec.speech import ARFastDecoder, ARHybridDrafter, WhisperTarget

    x, _ = batch_reference
    drafter = ARHybridDrafter(ARFastDecoder.for_target(whisper), redraft=True)
    with pytest.raises(MMSpecError, match="drafts one sequence at a time"):
        SpeculativeDecoder(WhisperTarget(whisper), drafter).generate(None, input_features=x, max_new_tokens=4)


def test_relaxed_hybrid_in_a_batch_equals_each_recording_alone(whisper, references, batch_reference):
    """The relaxed rule (not lossless) judges each row's ragged drafts as it judges them alone."""
    x, _ = batch_reference
    rows = [hypotheses(references[seed][2])[kind] for seed, kind in zip(SEEDS, ["exact", "wrong_middle", "empty",
                                                                             "garbage", "inserted_middle"])]
    out = hybrid_generate(whisper, PerRowHypotheses(rows), x, mode="relaxed", max_new_tokens=MAX_NEW)
    for row, (seed, hypothesis) in enumerate(zip(SEEDS, rows)):
        alone = hybrid_generate(whisper, PerRowHypotheses([hypothesis]), references[seed][0], mode="relaxed",
                                max_new_tokens=MAX_NEW).sequences[0]
        assert torch.equal(out.sequences[row, : alone.shape[0]], alone)
