"""Sampled speculative output is distributed as the target's own sampling (end to end)."""

import pytest
import torch

from mmspec import SamplingConfig, speculative_generate, speculative_sampling
from mmspec.drafters import JacobiDrafter
from mmspec.testing import assert_distribution_preserved, exact_continuation_distribution, tiny_llama
from mmspec.types import Proposal

VOCAB = 5
NEW_TOKENS = 4  # first token from prefill, then rounds drafting up to 3 tokens


@pytest.fixture(scope="module")
def peaked_pair():
    # Peaked, mutually different distributions so a wrong rule shows up quickly.
    target = tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=3, initializer_range=0.6, eos_token_id=None)
    drafter = tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=4, initializer_range=0.6, eos_token_id=None)
    return target, drafter


PROMPT = torch.tensor([[1, 2, 0, 4]])
SLOW = pytest.mark.slow
# Each draw is one speculative_generate call. 600 draws already reject the wrong-residual control (p ~ 1e-9);
# the slow tier draws 3000, which the subtler argmax-Jacobi control needs.
DRAWS = [pytest.param(600, id="600"), pytest.param(3000, id="3000", marks=SLOW)]


def draw_with(target, drafter, rule=None, **sampling):
    def draw(generator):
        out = speculative_generate(
            target, drafter, PROMPT, max_new_tokens=NEW_TOKENS, do_sample=True, generator=generator, num_draft_tokens=3,
            rule=rule, **sampling
        )
        return tuple(out.sequences[0, PROMPT.shape[1] :].tolist())

    return draw


@pytest.mark.parametrize(
    "sampling, num_draws",
    [pytest.param({}, 600, id="plain-600"), pytest.param({}, 3000, id="plain-3000", marks=SLOW),
     pytest.param({"temperature": 0.7, "top_k": 4}, 3000, id="temp-topk-3000", marks=SLOW),
     pytest.param({"top_p": 0.9}, 3000, id="topp-3000", marks=SLOW)],
)
def test_speculative_sampling_matches_target(peaked_pair, sampling, num_draws):
    target, drafter = peaked_pair
    exact = exact_continuation_distribution(target, PROMPT, NEW_TOKENS, SamplingConfig(do_sample=True, **sampling))
    assert_distribution_preserved(draw_with(target, drafter, **sampling), exact, num_draws=num_draws, seed=11)


def resample_from_target_rule(proposal, target_logits, sampling, generator):
    """Control: the correction drawn from p instead of the residual norm(max(p - q, 0))."""
    verdict = speculative_sampling(proposal, target_logits, sampling, generator)
    if int(verdict.num_accepted[0]) < proposal.length:
        p = target_logits[:, int(verdict.num_accepted[0])].softmax(-1)
        verdict.next_token = torch.multinomial(p, 1, generator=generator).squeeze(-1)
    return verdict


@pytest.mark.parametrize("num_draws", DRAWS)
def test_control_wrong_residual_fails(peaked_pair, num_draws):
    target, drafter = peaked_pair
    exact = exact_continuation_distribution(target, PROMPT, NEW_TOKENS, SamplingConfig(do_sample=True))
    with pytest.raises(AssertionError, match="differs from the reference"):
        assert_distribution_preserved(draw_with(target, drafter, rule=resample_from_target_rule), exact,
                                      num_draws=num_draws, seed=11)


@pytest.mark.parametrize(
    "sampling, num_draws",
    [pytest.param({}, 600, id="plain-600"), pytest.param({}, 3000, id="plain-3000", marks=SLOW),
     pytest.param({"temperature": 0.7, "top_k": 4}, 3000, id="temp-topk-3000", marks=SLOW)],
)
def test_jacobi_drafts_with_speculative_sampling_match_target(peaked_pair, sampling, num_draws):
    """The Jacobi iterate (drafts sampled from the target's previous rows, q = those rows) is lossless."""
    target, _ = peaked_pair
    exact = exact_continuation_distribution(target, PROMPT, NEW_TOKENS, SamplingConfig(do_sample=True, **sampling))
    assert_distribution_preserved(draw_with(target, JacobiDrafter(VOCAB), **sampling), exact, num_draws=num_draws, seed=11)


class ArgmaxJacobiDrafter(JacobiDrafter):
    """Control: carries the argmax of each row but claims q = the row (drafts not sampled from their q)."""

    def propose(self, view):
        proposal = super().propose(view)
        return Proposal(tokens=proposal.probs.argmax(-1), probs=proposal.probs)


@SLOW  # needs the 3000 draws
def test_control_jacobi_drafts_not_drawn_from_q_fail(peaked_pair):
    target, _ = peaked_pair
    exact = exact_continuation_distribution(target, PROMPT, NEW_TOKENS, SamplingConfig(do_sample=True))
    with pytest.raises(AssertionError, match="differs from the reference"):
        assert_distribution_preserved(draw_with(target, ArgmaxJacobiDrafter(VOCAB)), exact, num_draws=3000, seed=11)


def test_seeded_runs_repeat(target, small_drafter, prompt):
    runs = [
        speculative_generate(target, small_drafter, prompt, max_new_tokens=20, do_sample=True, top_p=0.95,
                             generator=torch.Generator().manual_seed(5))
        for _ in range(2)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.accepted == runs[1].stats.accepted


def test_global_seed_makes_runs_repeat_without_a_generator(target, small_drafter, prompt):
    outs = []
    for _ in range(2):
        torch.manual_seed(9)
        outs.append(speculative_generate(target, small_drafter, prompt, max_new_tokens=12, do_sample=True).sequences)
    assert torch.equal(outs[0], outs[1])
