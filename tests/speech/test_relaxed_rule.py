"""The relaxed hybrid acceptance rule: top-r and a log-prob margin (not lossless)."""

import math

import pytest
import torch

from mmspec import MMSpecError, Proposal, SamplingConfig, greedy_match
from mmspec.speech.hybrid import hybrid_rule, relaxed_top_r_rule


def logits_from_probs(rows):
    return torch.tensor(rows, dtype=torch.float32).log()[None]


# vocabulary of 4; three positions scored (k = 2 drafts + bonus)
PROBS = [[0.50, 0.40, 0.09, 0.01], [0.05, 0.05, 0.60, 0.30], [0.10, 0.20, 0.30, 0.40]]


def verdict(rule, drafts):
    v = rule(Proposal(tokens=torch.tensor([drafts])), logits_from_probs(PROBS), SamplingConfig(), None)
    return int(v.num_accepted[0]), int(v.next_token[0])


def test_accepts_within_top_r_and_margin():
    rule = relaxed_top_r_rule(top_r=2, margin=math.log(0.5 / 0.4) + 1e-6)
    assert verdict(rule, [1, 2]) == (2, 3)  # 1 is second and close enough; bonus = argmax of last row
    assert verdict(rule, [0, 3]) == (1, 2)  # 3 is second at position 1 but 0.6 / 0.3 exceeds the margin


def test_rank_limit_and_margin_limit():
    assert verdict(relaxed_top_r_rule(top_r=1, margin=10.0), [1, 2]) == (0, 0)
    assert verdict(relaxed_top_r_rule(top_r=3, margin=0.1), [1, 2]) == (0, 0)
    assert verdict(relaxed_top_r_rule(top_r=4, margin=10.0), [3, 0]) == (2, 3)


def test_suppressed_tokens_are_never_accepted():
    logits = logits_from_probs(PROBS)
    logits[0, 0, 1] = float("-inf")
    v = relaxed_top_r_rule(top_r=4, margin=1e9)(Proposal(tokens=torch.tensor([[1, 2]])), logits, SamplingConfig(), None)
    assert int(v.num_accepted[0]) == 0 and int(v.next_token[0]) == 0


def test_reduces_to_greedy_match():
    torch.manual_seed(0)
    strict = relaxed_top_r_rule(top_r=1, margin=0.0)
    for _ in range(50):
        logits = torch.randn(1, 6, 9)
        proposal = Proposal(tokens=torch.where(torch.rand(1, 5) < 0.7, logits[:, :5].argmax(-1), torch.randint(0, 9, (1, 5))))
        a, b = strict(proposal, logits, SamplingConfig(), None), greedy_match(proposal, logits)
        assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.next_token, b.next_token)


def test_empty_proposal_and_parameter_checks():
    v = relaxed_top_r_rule()(Proposal(tokens=torch.zeros(1, 0, dtype=torch.long)), logits_from_probs(PROBS[:1]), SamplingConfig(), None)
    assert int(v.num_accepted[0]) == 0 and int(v.next_token[0]) == 0
    with pytest.raises(MMSpecError):
        relaxed_top_r_rule(top_r=0)
    with pytest.raises(MMSpecError):
        relaxed_top_r_rule(margin=-1)
    with pytest.raises(MMSpecError):
        relaxed_top_r_rule()(Proposal(tokens=torch.tensor([[1]])), logits_from_probs(PROBS[:2]), SamplingConfig(do_sample=True), None)
    with pytest.raises(MMSpecError):
        hybrid_rule("loose")
    assert hybrid_rule("strict") is greedy_match
