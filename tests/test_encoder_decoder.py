"""Encoder-decoder targets: the encoder runs once, greedy output equals generate()."""

import pytest
import torch

from mmspec import PromptLookupDrafter, speculative_generate
from mmspec.testing import NeverAgreeDrafter, assert_greedy_equal

from .test_cache_rollback import tiny_t5


@pytest.fixture(scope="module")
def t5():
    return tiny_t5()


@pytest.mark.parametrize("kind", ["self", "never", "lookup"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_seq2seq_greedy_identical(t5, kind, k):
    drafter = {"self": t5, "never": NeverAgreeDrafter(t5), "lookup": PromptLookupDrafter()}[kind]
    encoder_ids = torch.tensor([[5, 9, 14, 3, 22, 40, 1]])
    assert_greedy_equal(t5, drafter, encoder_ids, max_new_tokens=20, num_draft_tokens=k,
                        attention_mask=torch.ones_like(encoder_ids))


def test_encoder_runs_once(t5):
    calls = []
    hook = t5.get_encoder().register_forward_hook(lambda *args: calls.append(1))
    try:
        out = speculative_generate(t5, t5, torch.tensor([[5, 9, 14, 1]]), max_new_tokens=15, num_draft_tokens=3)
    finally:
        hook.remove()
    assert out.stats.new_tokens > 1
    assert len(calls) == 2  # once for the target, once for the (same-model) drafter
