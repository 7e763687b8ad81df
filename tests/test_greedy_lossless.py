"""Greedy speculative output equals target.generate(do_sample=False), whatever the drafter."""

import pytest
import torch

from mmspec import (
    ConfidenceStopDraftLength,
    FixedDraftLength,
    HeuristicDraftLength,
    PromptLookupDrafter,
    speculative_generate,
)
from mmspec.drafters import JacobiDrafter
from mmspec.testing import NeverAgreeDrafter, assert_greedy_equal

POLICIES = {
    "fixed": FixedDraftLength,
    "heuristic": HeuristicDraftLength,
    "adaptive": lambda k: ConfidenceStopDraftLength(k, threshold=0.05),
}


def make_drafter(kind, target, small_drafter):
    if kind == "self":
        return target  # always agrees
    if kind == "never":
        return NeverAgreeDrafter(target)
    if kind == "small":
        return small_drafter  # a random small LM: agrees sometimes
    if kind == "jacobi":
        return JacobiDrafter(target.config.vocab_size)  # the target's previous iterate
    return PromptLookupDrafter()


@pytest.mark.parametrize("policy", sorted(POLICIES))
# k = 1, 3 and 8 in the fast tier; every k in the slow tier.
@pytest.mark.parametrize("k", [k if k in (1, 3, 8) else pytest.param(k, marks=pytest.mark.slow) for k in range(1, 9)])
@pytest.mark.parametrize("kind", ["self", "never", "small", "lookup", "jacobi"])
def test_greedy_identical(kind, k, policy, target, small_drafter, prompt):
    drafter = make_drafter(kind, target, small_drafter)
    out = assert_greedy_equal(target, drafter, prompt, max_new_tokens=24, policy=POLICIES[policy](k))
    stats = out.stats
    assert stats.new_tokens == out.sequences.shape[1] - prompt.shape[1]
    if kind == "self" and policy == "fixed":
        assert stats.alpha == 1.0 and stats.target_forwards < stats.new_tokens
    if kind == "never":
        assert stats.accepted == 0 and stats.target_forwards == stats.new_tokens


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 7])
def test_max_new_tokens_is_exact(max_new_tokens, target, prompt):
    out = assert_greedy_equal(target, target, prompt, max_new_tokens=max_new_tokens, num_draft_tokens=5)
    assert out.sequences.shape[1] == prompt.shape[1] + max_new_tokens


def test_stops_at_eos_like_generate(target, prompt):
    # Make the target's own 5th greedy token the end token: both must stop right after it.
    plain = target.generate(prompt, do_sample=False, max_new_tokens=12)
    eos = int(plain[0, prompt.shape[1] + 4])
    expected = target.generate(prompt, do_sample=False, max_new_tokens=12, eos_token_id=eos)
    out = speculative_generate(target, target, prompt, max_new_tokens=12, eos_token_id=eos, num_draft_tokens=6)
    assert torch.equal(out.sequences, expected)
    assert int(out.sequences[0, -1]) == eos


def test_attention_mask_of_ones_is_accepted(target, small_drafter, prompt):
    assert_greedy_equal(target, small_drafter, prompt, max_new_tokens=10, attention_mask=torch.ones_like(prompt))


def test_no_drafter_is_plain_decoding(target, prompt):
    from mmspec import NoDrafter

    seen = []
    out = assert_greedy_equal(target, NoDrafter(), prompt, max_new_tokens=15, on_tokens=seen.append)
    assert out.stats.tau == 1.0 and out.stats.drafted == 0 and out.stats.target_forwards == 15
    assert sum(seen) == 15
