"""Continuous speculative decoding: distribution proof on a model with closed-form per-token densities
(Gaussian mixtures), with failing controls; end to end on a tiny random MAR pair; one-line errors."""

from __future__ import annotations

import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.image_ar import cspd
from mmspec.image_ar.cspd import accept_drafts, cspd_generate, cspd_schedule, sample_residual
from mmspec.image_ar.mar import tiny_mar
from mmspec.image_ar.masked_decode import cosine_lefts, target_generate
from mmspec.sampling import seeded_generator

from .mixture_toy import MixtureDensity, MixtureTokenModel, energy_distance_test

N = 800  # images per sample: the always-accept control has p < 0.005 at this size, the exact rule p > 0.3
ALPHA = 0.01
SETTINGS = dict(num_iter=4, num_draft=2, prefill_ratio=0.0)


@pytest.fixture(scope="module")
def mixtures():
    torch.set_num_threads(1)
    target = MixtureTokenModel([[-1.5, 0.0], [1.5, 0.3]], [0.6, 0.5], [0.3, 0.7], coupling=0.3)
    draft = MixtureTokenModel([[-1.0, 0.5], [1.2, -0.3]], [0.8, 0.7], [0.5, 0.5], coupling=0.1)
    schedule = cspd_schedule(SETTINGS["num_iter"], target.seq_len, SETTINGS["num_draft"], SETTINGS["prefill_ratio"])
    reference, _ = target_generate(target, N, num_iter=4, lefts=schedule, generator=seeded_generator("cpu", 100))
    return draft, target, reference.flatten(1)


def test_schedule_merges_each_verified_window_into_one_step():
    assert cspd_schedule(4, 4, 2, 0.0) == [3, 1, 0]
    assert cspd_schedule(8, 16, 3, 0.15) == [15, 14, 8, 0]  # steps 0-1 pre-filled, then windows of 3, 3, 2
    assert cspd_schedule(8, 16, 1, 0.0) == cosine_lefts(8, 16)


def test_speculative_samples_match_the_target_distribution(mixtures):
    draft, target, reference = mixtures
    out = cspd_generate(draft, target, N, generator=seeded_generator("cpu", 0), **SETTINGS)
    _, p_value = energy_distance_test(out.tokens.flatten(1), reference, permutations=400, seed=0)
    assert p_value > ALPHA
    # the draft is really different and really used: about half its tokens are rejected and redrawn
    assert 0.3 < out.stats.alpha < 0.7 and out.stats.residual_fallbacks == 0
    assert out.stats.drafted == 3 * N and out.stats.target_forwards == 3 and out.stats.drafter_forwards == 3


def test_control_accepting_every_draft_fails_the_same_test(mixtures, monkeypatch):
    draft, target, reference = mixtures
    monkeypatch.setattr(cspd, "accept_drafts", lambda x, p, q, t, g: torch.ones(x.shape[0], dtype=torch.bool))
    out = cspd_generate(draft, target, N, generator=seeded_generator("cpu", 0), **SETTINGS)
    _, p_value = energy_distance_test(out.tokens.flatten(1), reference, permutations=400, seed=0)
    assert out.stats.alpha == 1.0 and p_value < ALPHA


@pytest.mark.slow
def test_control_the_official_inner_temperature_is_not_exact(mixtures):
    """T = 42 in the exponent (the official runner's default) flattens p/q to ~ the ratio of the
    normalisers: nearly every draft passes, and the output is the draft's, not the target's."""
    draft, target, reference = mixtures
    out = cspd_generate(draft, target, N, inner_temperature=42.0, generator=seeded_generator("cpu", 0), **SETTINGS)
    _, p_value = energy_distance_test(out.tokens.flatten(1), reference, permutations=400, seed=0)
    assert p_value < ALPHA


@pytest.mark.slow
def test_residual_sampler_draws_from_the_normalised_positive_part():
    """1-D check of norm(max(0, p - q)) against an exact sample of it (rejection from a fine grid)."""
    n = 4000
    p = MixtureDensity(torch.zeros(n, 1), torch.zeros(n, 1, 1), torch.tensor([1.0]), torch.zeros(1))
    q = MixtureDensity(torch.zeros(n, 1), torch.full((n, 1, 1), 1.0), torch.tensor([1.0]), torch.zeros(1))
    drawn, kept = sample_residual(p, q, max_tries=100, generator=seeded_generator("cpu", 0))
    assert kept.all()
    grid = torch.linspace(-8, 8, 16001)[:, None]
    one = lambda d: MixtureDensity(grid, d.centres[:1].expand(len(grid), 1, 1), d.stds, d.log_weights)  # noqa: E731
    weight = (one(p).log_density(grid).exp() - one(q).log_density(grid).exp()).clamp_min(0)
    exact = grid[torch.multinomial(weight.float(), n, replacement=True, generator=torch.Generator().manual_seed(1))]
    _, p_value = energy_distance_test(drawn[:800], exact[:800], permutations=400, seed=0)
    assert p_value > ALPHA and drawn.mean() < -0.5  # the residual of N(0,1) - N(1,1) lies left
    _, p_control = energy_distance_test(p.draw(seeded_generator("cpu", 2))[:800], exact[:800], permutations=400, seed=0)
    assert p_control < ALPHA


def test_residual_sampler_falls_back_to_the_targets_draw_when_tries_run_out():
    n = 50
    p = MixtureDensity(torch.zeros(n, 1), torch.zeros(n, 1, 1), torch.tensor([1.0]), torch.zeros(1))
    drawn, kept = sample_residual(p, p, max_tries=3, generator=seeded_generator("cpu", 0))  # residual is empty
    assert not kept.any() and torch.isfinite(drawn).all() and drawn.std() > 0.5


def test_accept_rule_is_min_one_p_over_q():
    x = torch.zeros(20000, 1)
    p = MixtureDensity(x, torch.zeros(len(x), 1, 1), torch.tensor([1.0]), torch.zeros(1))
    q = MixtureDensity(x, torch.full((len(x), 1, 1), 1.0), torch.tensor([1.0]), torch.zeros(1))
    rate = accept_drafts(x, q, p, 1.0, seeded_generator("cpu", 0)).double().mean()
    assert abs(rate - torch.exp(torch.tensor(-0.5))) < 0.02  # q(0)/p(0) = e^-1/2
    assert accept_drafts(x, p, q, 1.0, seeded_generator("cpu", 0)).all()  # p(0) > q(0)


@pytest.fixture(scope="module")
def mar_pair():
    torch.set_num_threads(1)
    return tiny_mar(1, encoder_depth=1, decoder_depth=1), tiny_mar(0, encoder_depth=2, decoder_depth=2)


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_cspd_on_a_tiny_mar_pair_runs_end_to_end(mar_pair, cfg):
    draft, target = mar_pair
    out = cspd_generate(draft, target, 2, labels=torch.tensor([1, 5]), num_iter=8, num_draft=3, prefill_ratio=0.15,
                        cfg=cfg, generator=seeded_generator("cpu", 0))
    assert out.tokens.shape == (2, 16, 4) and out.tokens.dtype == torch.float32 and out.tokens.device.type == "cpu"
    assert torch.isfinite(out.tokens).all()
    stats = out.stats
    assert stats.target_forwards == 4 and stats.drafter_forwards == 6  # 2 pre-filled + 2 windows; 6 drafted steps
    assert stats.drafted == 2 * (16 - 2) and 0 <= stats.accepted <= stats.drafted and stats.new_tokens == 32
    assert stats.schedule == cspd_schedule(8, 16, 3, 0.15) and stats.prefill_steps == 2
    assert [(w.steps, w.left) for w in stats.windows] == [(3, stats.schedule[2]), (3, 0)]
    assert sum(w.drafted for w in stats.windows) == stats.drafted and sum(w.accepted for w in stats.windows) == stats.accepted
    again = cspd_generate(draft, target, 2, labels=torch.tensor([1, 5]), num_iter=8, num_draft=3, prefill_ratio=0.15,
                          cfg=cfg, generator=seeded_generator("cpu", 0))
    assert torch.equal(out.tokens, again.tokens)


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_draft_equal_to_target_accepts_everything_and_gives_the_targets_output(mar_pair, cfg):
    """With shared noise and one-step windows the draft's tokens are the target's own: all accepted,
    and the output equals the target-only loop's with the same generator. The control (a different
    draft) rejects some and changes the output."""
    draft, target = mar_pair
    kwargs = dict(labels=torch.tensor([1, 5]), num_iter=6, num_draft=1, prefill_ratio=0.0, cfg=cfg)
    same = cspd_generate(target, target, 2, generator=seeded_generator("cpu", 0), **kwargs)
    reference, _ = target_generate(target, 2, num_iter=6, cfg=cfg, labels=torch.tensor([1, 5]),
                                   generator=seeded_generator("cpu", 0))
    assert same.stats.accepted == same.stats.drafted > 0
    assert torch.equal(same.tokens, reference)
    other = cspd_generate(draft, target, 2, generator=seeded_generator("cpu", 0), **kwargs)
    assert other.stats.accepted < other.stats.drafted and not torch.equal(other.tokens, reference)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_draft=0), "num_draft must be >= 1"),
    (dict(prefill_ratio=1.0), r"prefill_ratio must be in \[0, 1\)"),
    (dict(inner_temperature=0.0), "inner_temperature must be > 0"),
    (dict(max_tries=0), "max_tries must be >= 1"),
    (dict(num_iter=40), "num_iter must be in 1..16"),
    (dict(batch_size=0), "batch_size must be >= 1"),
])
def test_bad_settings_give_one_clear_error(mar_pair, kwargs, message):
    draft, target = mar_pair
    call = {"batch_size": 1, "num_iter": 4, **kwargs}
    with pytest.raises(MMSpecError, match=message) as info:
        cspd_generate(draft, target, call.pop("batch_size"), **call)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides, message", [
    (dict(num_sampling_steps=5), "must denoise on the same timesteps to align .*: draft 5 steps"),
    (dict(vae_embed_dim=8), "draft and target must make the same tokens"),
    (dict(scheduler="ddim"), "needs DDPM heads on both models"),
    (dict(timestep_spacing="leading"), "draft 10 steps from t = 900, target 10 steps from t = 999"),
])
def test_incompatible_pairs_give_one_clear_error(mar_pair, overrides, message):
    _, target = mar_pair
    with pytest.raises(MMSpecError, match=message):
        cspd_generate(tiny_mar(2, **overrides), target, 1, num_iter=4)


def test_every_tensor_is_made_on_the_models_device(mar_pair):
    """With "meta" as the default device, a tensor made without a device fails as it would on a GPU;
    a CPU generator gives the same tokens as without the check."""
    from ..device_checks import default_device_elsewhere

    draft, target = mar_pair
    kwargs = dict(labels=torch.tensor([1, 5]), num_iter=6, num_draft=2, prefill_ratio=0.15, cfg=2.0)
    expected = cspd_generate(draft, target, 2, generator=seeded_generator("cpu", 9), **kwargs).tokens
    labels = kwargs["labels"]
    with default_device_elsewhere(draft, target):
        out = cspd_generate(draft, target, 2, generator=seeded_generator("cpu", 9), **kwargs).tokens
        alone = target.sample_tokens(2, num_iter=6, cfg=2.0, labels=labels, generator=seeded_generator("cpu", 9))
    assert out.device.type == "cpu" and torch.equal(out, expected) and alone.device.type == "cpu"


def test_last_step_gaussian_ratio_is_the_papers_criterion():
    """exp(log p~(x) - log q~(x)) equals the paper's acceptance ratio written out:
    N_T(x; mu_p, s_p) / N_T(x; mu_q, s_q) * exp(sum(L_p - L_q)) * prod(s_q) / prod(s_p), with
    N_T(x; mu, s) = exp(-1/2 |(x - mu) / (s T)|^2); and at T = 1 the residual's keep probability
    max(0, p(x) - q(x) / F) / p(x) with normalised p, q and F = exp(sum(L_p - L_q))."""
    from mmspec.image_ar.token_density import LastStepGaussian

    g = torch.Generator().manual_seed(0)
    n, c = 6, 4
    make = lambda: LastStepGaussian(torch.zeros(n, c), torch.randn(n, c, generator=g),  # noqa: E731
                                    torch.rand(n, c, generator=g) + 0.3, torch.randn(n, c, generator=g) * 0.1)
    p, q = make(), make()
    x = q.mean + 0.3 * torch.randn(n, c, generator=g)
    for t in (1.0, 42.0):
        unnorm = lambda d: torch.exp(-0.5 * ((x - d.mean) / d.std / t).pow(2).sum(-1))  # noqa: E731
        paper = unnorm(p) / unnorm(q) * torch.exp((p.log_var_sum - q.log_var_sum).sum(-1)) * q.std.prod(-1) / p.std.prod(-1)
        torch.testing.assert_close((p.log_density(x, t) - q.log_density(x, t)).exp(), paper, rtol=1e-4, atol=0)
    pdf = lambda d: torch.distributions.Normal(d.mean, d.std).log_prob(x).sum(-1).exp()  # noqa: E731
    fixed = torch.exp((p.log_var_sum - q.log_var_sum).sum(-1))
    paper_keep = (pdf(p) - pdf(q) / fixed).clamp_min(0) / pdf(p)
    ours = (1 - (q.log_density(x) - p.log_density(x)).exp()).clamp_min(0)
    torch.testing.assert_close(ours, paper_keep, rtol=1e-4, atol=1e-6)
