"""The SJD loop end to end on tiny random class-conditional models."""

import itertools
from functools import partial

import pytest
import torch

from mmspec import SamplingConfig
from mmspec.errors import MMSpecError
from mmspec.image_ar import (
    CFGTarget,
    ar_generate,
    gsd_accept,
    jacobi_generate,
    lantern_accept,
    lantern_neighbours,
    sjd_accept,
)
from mmspec.sampling import probabilities
from mmspec.testing import assert_distribution_preserved

GREEDY = SamplingConfig(do_sample=False)
SAMPLE = SamplingConfig(do_sample=True)


@pytest.mark.parametrize("init", ["random", "left", "above"])
@pytest.mark.parametrize("window", [1, 3, 16])
def test_greedy_jacobi_equals_greedy_ar(model, init, window):
    for label in range(3):
        expected = ar_generate(model, [label], GREEDY, guidance_scale=2.0).tokens
        out = jacobi_generate(model, [label], window=window, init=init, sampling=GREEDY, guidance_scale=2.0,
                              generator=torch.Generator().manual_seed(label))
        assert torch.equal(out.tokens, expected)
        assert out.stats.new_tokens == 16 and out.stats.target_forwards <= 16


def test_stats_and_step_compression(model):
    out = jacobi_generate(model, [0, 1], window=4, init="left", generator=torch.Generator().manual_seed(0), guidance_scale=1.5)
    stats = out.stats
    assert out.tokens.shape == (2, 4, 4)
    assert stats.new_tokens == 32 == stats.accepted + stats.rounds
    assert stats.rounds == stats.target_forwards and stats.drafter_forwards == 0
    assert stats.tau == pytest.approx(32 / stats.target_forwards)
    assert stats.method == "sjd" and stats.drafted >= stats.accepted
    ar = ar_generate(model, [0], generator=torch.Generator().manual_seed(0))
    assert ar.stats.target_forwards == 16 and ar.stats.tau == 1.0


def test_window_zero_is_ar(model):
    out = jacobi_generate(model, [1], window=0, generator=torch.Generator().manual_seed(0))
    assert out.stats.target_forwards == 16 and out.stats.drafted == 0


def test_seeded_runs_repeat(model):
    runs = [jacobi_generate(model, [0, 2], generator=torch.Generator().manual_seed(3), guidance_scale=2.0) for _ in range(2)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert runs[0].stats.accepted == runs[1].stats.accepted


def test_neutral_gsd_and_lantern_loops_equal_sjd(model):
    neighbours = lantern_neighbours(torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), 5)
    runs = {}
    for name, rule in {
        "sjd": sjd_accept,
        "gsd": partial(gsd_accept, window=0),
        "lantern": partial(lantern_accept, neighbours=neighbours, delta=0.0),
    }.items():
        runs[name] = jacobi_generate(model, [0, 1, 2], rule=rule, generator=torch.Generator().manual_seed(8), guidance_scale=2.0)
    assert torch.equal(runs["sjd"].tokens, runs["gsd"].tokens)
    assert torch.equal(runs["sjd"].tokens, runs["lantern"].tokens)


def test_relaxed_rules_accept_more(model):
    neighbours = lantern_neighbours(torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), 11)
    forwards = {}
    for name, rule in {
        "sjd": sjd_accept,
        "gsd": partial(gsd_accept, window=11, prob_threshold=1.0),
        "lantern": partial(lantern_accept, neighbours=neighbours, delta=0.5),
    }.items():
        out = jacobi_generate(model, list(range(3)) * 4, rule=rule, init="left", generator=torch.Generator().manual_seed(1), method=name)
        assert out.stats.method == name and out.tokens.shape == (12, 4, 4)
        forwards[name] = out.stats.target_forwards
    assert forwards["gsd"] < forwards["sjd"] and forwards["lantern"] < forwards["sjd"]


def test_bad_arguments(model):
    with pytest.raises(MMSpecError, match="init"):
        jacobi_generate(model, [0], init="diagonal")
    with pytest.raises(MMSpecError, match="class labels"):
        jacobi_generate(model, [5])


# ----------------------------------------------------------------------------- exact distribution (2 x 2 grid, 3 codes)

LABEL = 1
DRAWS = 3000


def exact_image_distribution(model, sampling, guidance_scale):
    """Probability of each of the 81 token grids under the guided, warped target (enumerated)."""
    grids = torch.tensor(list(itertools.product(range(3), repeat=4)))
    target = CFGTarget(model, guidance_scale)
    logits = target.full_logits(torch.full((len(grids),), LABEL), grids[:, :3])  # row j scores token j
    probs = probabilities(logits, sampling).gather(-1, grids[..., None]).squeeze(-1).double().prod(-1)
    return {tuple(g): float(pr) for g, pr in zip(grids.tolist(), probs) if pr > 0}


def draw_with(model, sampling, guidance_scale, rule=sjd_accept, init="random"):
    def draw(generator):
        out = jacobi_generate(model, [LABEL], window=3, rule=rule, init=init, sampling=sampling,
                              guidance_scale=guidance_scale, generator=generator)
        return tuple(out.tokens.flatten().tolist())

    return draw


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampling, guidance_scale, init",
    [(SAMPLE, 1.0, "random"), (SAMPLE, 3.0, "left"), (SamplingConfig(do_sample=True, temperature=0.7, top_k=2), 2.0, "random")],
    ids=["plain", "cfg-left-init", "cfg-temp-topk"],
)
def test_sjd_preserves_the_target_distribution(micro_model, sampling, guidance_scale, init):
    exact = exact_image_distribution(micro_model, sampling, guidance_scale)
    assert_distribution_preserved(draw_with(micro_model, sampling, guidance_scale, init=init), exact, num_draws=DRAWS, seed=11)


def wrong_residual_rule(tokens, d, p, generator):
    """Control: on a rejection the correction is drawn from p instead of norm(max(p - d, 0))."""
    verdict = sjd_accept(tokens, d, p, generator)
    n = int(verdict.num_accepted[0])
    if n < tokens.shape[1]:
        verdict.next_token = torch.multinomial(p[:, n], 1, generator=generator).squeeze(-1)
    return verdict


@pytest.mark.slow
def test_control_wrong_residual_fails(micro_model):
    exact = exact_image_distribution(micro_model, SAMPLE, 3.0)
    with pytest.raises(AssertionError, match="differs from the reference"):
        assert_distribution_preserved(draw_with(micro_model, SAMPLE, 3.0, rule=wrong_residual_rule), exact, num_draws=DRAWS, seed=11)
