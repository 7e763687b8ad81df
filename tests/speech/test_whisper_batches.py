"""Whisper decodes batches of recordings: plain and hybrid decoding (each recording its own
hypothesis and alignment cursor) equal Whisper's batched `generate` and each recording alone."""

import pytest
import torch

from mmspec import speculative_generate
from mmspec.drafters import NoDrafter
from mmspec.speech import CTCFastDecoder, hybrid_generate

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
    out = hybrid_generate(whisper, PerRowHypotheses(rows), x, max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, expected)
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
