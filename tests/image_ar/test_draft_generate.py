"""Speculative decoding with a separate small AR drafter, through the core loop (plain SD and LANTERN)."""

import itertools

import pytest
import torch

from mmspec import SamplingConfig
from mmspec.errors import MMSpecError
from mmspec.image_ar import (
    CFGTarget,
    GuidedImageDrafter,
    ar_generate,
    draft_generate,
    lantern_neighbours,
    lantern_rule,
    tiny_llamagen,
)
from mmspec.rules import speculative_sampling
from mmspec.sampling import probabilities, sample
from mmspec.testing import assert_distribution_preserved

GREEDY = SamplingConfig(do_sample=False)
SAMPLE = SamplingConfig(do_sample=True)


@pytest.fixture(scope="module")
def drafter():
    """Same codebook (12) and classes (3) as the `model` fixture, one layer, other weights."""
    return tiny_llamagen(vocab_size=12, grid_size=4, num_classes=3, n_layer=1, seed=1, initializer_range=0.3)


@pytest.fixture(scope="module")
def neighbours():
    return lantern_neighbours(torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), 6)


class NeverAgrees(GuidedImageDrafter):
    """Greedy drafts of the target's own second-best token: every greedy draft is rejected."""

    def propose(self, view):
        proposal, sequence = super().propose(view), view.sequence
        logits = self.cfg.full_logits(sequence[:, 0], torch.cat([sequence[:, 1:], proposal.tokens], dim=1))
        second = logits[:, sequence.shape[1] - 1 : sequence.shape[1] - 1 + proposal.length].topk(2, dim=-1).indices[..., 1]
        proposal.tokens = second
        return proposal


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("kind", ["self", "small", "never"])
def test_greedy_equals_target_greedy_ar(model, drafter, kind, k):
    """Greedy SD = the target's own greedy AR output, whatever the drafter (and CFG on both)."""
    draft_model = {"self": model, "small": drafter, "never": model}[kind]
    for label in range(3):
        expected = ar_generate(model, [label], GREEDY, guidance_scale=2.0).tokens
        d = (NeverAgrees if kind == "never" else GuidedImageDrafter)(draft_model, 2.0)
        out = draft_generate(model, d, [label], num_draft_tokens=k, sampling=GREEDY, guidance_scale=2.0)
        assert torch.equal(out.tokens, expected)
        s = out.stats
        assert s.new_tokens == 16 and s.drafter_forwards > 0
        if kind == "self":
            assert s.accepted == s.drafted and s.target_forwards == -(-16 // (k + 1))
        if kind == "never":
            assert s.accepted == 0 and s.target_forwards == 16


def test_top_k_one_equals_greedy(model, drafter):
    """Sampling with top_k = 1 is greedy: the sampled SD output equals greedy AR (and consumes randomness fine)."""
    top1 = SamplingConfig(do_sample=True, top_k=1)
    for label in range(3):
        expected = ar_generate(model, [label], GREEDY, guidance_scale=2.0).tokens
        out = draft_generate(model, drafter, [label], sampling=top1, guidance_scale=2.0, generator=torch.Generator().manual_seed(label))
        assert torch.equal(out.tokens, expected)


def test_lantern_delta_zero_is_plain_speculative_sampling(model, drafter, neighbours):
    runs = {}
    for name, rule in {"sd": None, "lantern": lantern_rule(neighbours, delta=0.0), "lam1": lantern_rule(neighbours, lam=1.0)}.items():
        runs[name] = draft_generate(model, drafter, [0, 1, 2, 0], rule=rule, sampling=SAMPLE, guidance_scale=2.0,
                                    generator=torch.Generator().manual_seed(4))
    assert torch.equal(runs["sd"].tokens, runs["lantern"].tokens)
    assert torch.equal(runs["sd"].tokens, runs["lam1"].tokens)
    assert runs["sd"].stats.accepted == runs["lantern"].stats.accepted


def test_lantern_accepts_more_and_stays_seeded(model, drafter, neighbours):
    labels = [0, 1, 2] * 3
    plain = draft_generate(model, drafter, labels, sampling=SAMPLE, generator=torch.Generator().manual_seed(1))
    relaxed = [draft_generate(model, drafter, labels, rule=lantern_rule(neighbours, delta=0.5), sampling=SAMPLE,
                              generator=torch.Generator().manual_seed(1), method="lantern") for _ in range(2)]
    assert torch.equal(relaxed[0].tokens, relaxed[1].tokens)
    assert relaxed[0].stats.method == "lantern"
    assert relaxed[0].stats.target_forwards < plain.stats.target_forwards
    assert relaxed[0].stats.alpha > plain.stats.alpha


def test_stats_and_caches(model, drafter):
    out = draft_generate(model, drafter, [2, 0], num_draft_tokens=3, guidance_scale=1.5, generator=torch.Generator().manual_seed(0))
    s = out.stats
    assert out.tokens.shape == (2, 4, 4)
    assert s.new_tokens == 32 == s.accepted + s.rounds
    assert s.target_forwards == s.rounds and s.step_compression == pytest.approx(32 / s.target_forwards)
    assert s.drafted <= 3 * s.rounds


def test_incompatible_drafter_is_one_clear_error(model):
    wrong_vocab = tiny_llamagen(vocab_size=10, grid_size=4, num_classes=3, n_layer=1, seed=2)
    with pytest.raises(MMSpecError, match="vocabularies differ"):
        draft_generate(model, wrong_vocab, [0])
    wrong_classes = tiny_llamagen(vocab_size=12, grid_size=4, num_classes=5, n_layer=1, seed=2)
    with pytest.raises(MMSpecError, match="classes"):
        draft_generate(model, wrong_classes, [0])
    wrong_grid = tiny_llamagen(vocab_size=12, grid_size=2, num_classes=3, n_layer=1, seed=2)
    with pytest.raises(MMSpecError, match="image tokens"):
        draft_generate(model, wrong_grid, [0])


# ----------------------------------------------------------------------------- exact distribution (2 x 2 grid, 3 codes)

LABEL = 1
DRAWS = 2500


@pytest.fixture(scope="module")
def micro_drafter():
    return tiny_llamagen(vocab_size=3, grid_size=2, num_classes=2, dim=16, n_layer=1, n_head=2, seed=9, initializer_range=0.8)


def exact_image_distribution(model, sampling, guidance_scale):
    """Probability of each of the 81 token grids under the guided, warped target (enumerated)."""
    grids = torch.tensor(list(itertools.product(range(3), repeat=4)))
    logits = CFGTarget(model, guidance_scale).full_logits(torch.full((len(grids),), LABEL), grids[:, :3])
    probs = probabilities(logits, sampling).gather(-1, grids[..., None]).squeeze(-1).double().prod(-1)
    return {tuple(g): float(p) for g, p in zip(grids.tolist(), probs) if p > 0}


def draws(model, drafter, sampling, guidance_scale, rule=None):
    def draw(generator):
        out = draft_generate(model, drafter, [LABEL], num_draft_tokens=2, rule=rule, sampling=sampling,
                             guidance_scale=guidance_scale, generator=generator)
        return tuple(out.tokens.flatten().tolist())

    return draw


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampling, guidance_scale",
    [(SAMPLE, 1.0), (SAMPLE, 3.0), (SamplingConfig(do_sample=True, temperature=0.7, top_k=2), 2.0)],
    ids=["plain", "cfg", "cfg-temp-topk"],
)
def test_speculative_sampling_preserves_the_target_distribution(micro_model, micro_drafter, sampling, guidance_scale):
    exact = exact_image_distribution(micro_model, sampling, guidance_scale)
    assert_distribution_preserved(draws(micro_model, micro_drafter, sampling, guidance_scale), exact, num_draws=DRAWS, seed=3)


def wrong_residual(proposal, target_logits, sampling, generator):
    """Control: on a rejection the correction is drawn from p instead of norm(max(p - q, 0))."""
    verdict = speculative_sampling(proposal, target_logits, sampling, generator)
    n = int(verdict.num_accepted[0])
    if n < proposal.length:
        verdict.next_token = sample(probabilities(target_logits[:, n], sampling), generator)
    return verdict


@pytest.mark.slow
def test_control_wrong_residual_fails(micro_model, micro_drafter):
    exact = exact_image_distribution(micro_model, SAMPLE, 3.0)
    with pytest.raises(AssertionError, match="differs from the reference"):
        assert_distribution_preserved(draws(micro_model, micro_drafter, SAMPLE, 3.0, rule=wrong_residual), exact,
                                      num_draws=DRAWS, seed=3)
