"""Acceptance rules as pure functions: exactness, and the sampling rule's distribution at scale."""

from collections import Counter

import pytest
import torch

from mmspec import Proposal, SamplingConfig, greedy_match, speculative_sampling
from mmspec.rules import leading_true_count, on_target_probabilities, target_choice
from mmspec.sampling import choose_next, probabilities
from mmspec.testing import chi_square
from mmspec.types import Verdict

SAMPLE = SamplingConfig(do_sample=True)


def test_leading_true_count():
    accepted = torch.tensor([[True, True, False, True], [False, True, True, True], [True] * 4])
    assert leading_true_count(accepted).tolist() == [2, 0, 4]


def test_greedy_match_accepts_prefix_and_corrects():
    logits = torch.full((1, 4, 5), -1.0)
    for position, best in enumerate([2, 3, 1, 4]):
        logits[0, position, best] = 1.0
    verdict = greedy_match(Proposal(tokens=torch.tensor([[2, 3, 0]])), logits)
    assert verdict.num_accepted.tolist() == [2]
    assert verdict.next_token.tolist() == [1]
    full = greedy_match(Proposal(tokens=torch.tensor([[2, 3, 1]])), logits)
    assert full.num_accepted.tolist() == [3] and full.next_token.tolist() == [4]


def test_greedy_match_with_no_drafts_returns_target_choice():
    logits = torch.tensor([[[0.0, 5.0, 1.0]]])
    verdict = greedy_match(Proposal(tokens=torch.empty(1, 0, dtype=torch.long)), logits)
    assert verdict.num_accepted.tolist() == [0] and verdict.next_token.tolist() == [1]


def first_token_outcomes(rule, p_logits, q, draws, seed=0):
    """Run the rule on `draws` identical rows; the first committed token of each row."""
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q[0], draws, replacement=True, generator=gen)[:, None]
    proposal = Proposal(tokens=drafts, probs=q[None].expand(draws, -1, -1).contiguous())
    verdict = rule(proposal, p_logits.expand(draws, -1, -1), SAMPLE, gen)
    first = torch.where(verdict.num_accepted > 0, drafts[:, 0], verdict.next_token)
    return Counter(first.tolist())


P_LOGITS = torch.tensor([[[2.0, 0.5, -1.0, 1.0, 0.0], [0.0, 0.0, 3.0, 0.0, 0.0]]])
Q = torch.tensor([[0.05, 0.6, 0.05, 0.1, 0.2]])


def wrong_residual_rule(proposal, target_logits, sampling, generator):
    """Control: on rejection resample from p instead of norm(max(p - q, 0)): biased."""
    verdict = speculative_sampling(proposal, target_logits, sampling, generator)
    p = target_logits.softmax(-1)[:, 0]
    rejected = verdict.num_accepted == 0
    resampled = torch.multinomial(p, 1, generator=generator).squeeze(-1)
    verdict.next_token = torch.where(rejected, resampled, verdict.next_token)
    return verdict


def test_speculative_sampling_preserves_target_distribution():
    p = P_LOGITS[0, 0].softmax(-1)
    counts = first_token_outcomes(speculative_sampling, P_LOGITS, Q, draws=200_000)
    result = chi_square(counts, {i: float(p[i]) for i in range(5)})
    assert result.p_value > 1e-3, result


def test_wrong_residual_is_detected():
    p = P_LOGITS[0, 0].softmax(-1)
    counts = first_token_outcomes(wrong_residual_rule, P_LOGITS, Q, draws=200_000)
    assert chi_square(counts, {i: float(p[i]) for i in range(5)}).p_value < 1e-6


def test_deterministic_drafts_use_one_hot_q():
    # A deterministic draft of token 1 is accepted with probability p(1).
    draws = 100_000
    gen = torch.Generator().manual_seed(1)
    proposal = Proposal(tokens=torch.ones(draws, 1, dtype=torch.long))
    verdict = speculative_sampling(proposal, P_LOGITS.expand(draws, -1, -1), SAMPLE, gen)
    p = P_LOGITS[0, 0].softmax(-1)
    rate = verdict.num_accepted.float().mean().item()
    assert abs(rate - p[1].item()) < 4 * (p[1].item() * (1 - p[1].item()) / draws) ** 0.5
    rejected_next = verdict.next_token[verdict.num_accepted == 0]
    assert not (rejected_next == 1).any(), "a rejected deterministic draft must never be re-drawn"


def test_bonus_token_drawn_from_last_position():
    q = P_LOGITS[0, 0].softmax(-1)[None]  # q == p at the draft position: always accepted
    draws = 20_000
    gen = torch.Generator().manual_seed(2)
    drafts = torch.multinomial(q[0], draws, replacement=True, generator=gen)[:, None]
    verdict = speculative_sampling(
        Proposal(tokens=drafts, probs=q[None].expand(draws, -1, -1)), P_LOGITS.expand(draws, -1, -1), SAMPLE, gen
    )
    assert bool((verdict.num_accepted == 1).all())
    assert (verdict.next_token == 2).float().mean() > 0.8  # position 1 puts most mass on token 2


@pytest.mark.parametrize("seed", [0, 1])
def test_sampling_rule_repeats_with_seed(seed):
    proposal = Proposal(tokens=torch.tensor([[1, 2]]), probs=Q[None].expand(1, 2, -1).contiguous())
    logits = torch.cat([P_LOGITS, P_LOGITS[:, :1]], dim=1)
    runs = [speculative_sampling(proposal, logits, SAMPLE, torch.Generator().manual_seed(seed)) for _ in range(2)]
    assert runs[0].num_accepted.tolist() == runs[1].num_accepted.tolist()
    assert runs[0].next_token.tolist() == runs[1].next_token.tolist()


@pytest.mark.parametrize("sampling", [SAMPLE, SamplingConfig(), SamplingConfig(do_sample=True, temperature=0.7, top_k=3)])
def test_target_choice_is_choose_next_and_accepts_nothing(sampling):
    logits = torch.randn(1, 3, 6, generator=torch.Generator().manual_seed(1))
    verdict = target_choice(Proposal(tokens=torch.tensor([[1, 2]])), logits, sampling, torch.Generator().manual_seed(7))
    expected = choose_next(logits[:, 0], sampling, torch.Generator().manual_seed(7))
    assert verdict.num_accepted.tolist() == [0] and torch.equal(verdict.next_token, expected)


def test_rules_on_probabilities_see_warped_or_one_hot_p_and_hand_it_on():
    logits = torch.randn(1, 3, 6, generator=torch.Generator().manual_seed(2))
    seen = []

    def rule(draft_tokens, draft_probs, target_probs, generator):
        seen.append(target_probs)
        return Verdict(num_accepted=torch.tensor([0]), next_token=torch.tensor([0]))

    proposal = Proposal(tokens=torch.tensor([[1, 2]]))
    warped = SamplingConfig(do_sample=True, temperature=0.5, top_p=0.8)
    sampled = on_target_probabilities(rule)(proposal, logits, warped, None)
    greedy = on_target_probabilities(rule)(proposal, logits, SamplingConfig(), None)
    assert torch.equal(seen[0], probabilities(logits, warped)) and sampled.target_probs is seen[0]
    assert torch.equal(greedy.target_probs, torch.nn.functional.one_hot(logits.argmax(-1), 6).float())
    assert not torch.equal(seen[0], logits.softmax(-1))  # control: the warping is applied
