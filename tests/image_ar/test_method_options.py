"""Method options the runner resolves: GSD's latents, LANTERN's neighbourhood against the codebook."""

from functools import partial

import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.image_ar import CFGTarget, MethodConfig, MethodRunner, gsd_accept, jacobi_generate, tiny_llamagen, tiny_vq
from mmspec.image_ar.rules import GSD_DISTANCE_THRESHOLD, GSD_PROB_THRESHOLD, GSD_WINDOW
from mmspec.sampling import SamplingConfig

SAMPLE = SamplingConfig(do_sample=True)


@pytest.fixture(scope="module")
def parts():
    model = tiny_llamagen(vocab_size=12, grid_size=4, num_classes=3, seed=0, initializer_range=0.3)
    return model, tiny_vq(codebook_size=12).codebook_embeddings()


def gsd_direct(model, latents, **group):
    """GSD through jacobi_generate with the latents given explicitly."""
    rule = partial(gsd_accept, embeddings=latents, **group)
    return jacobi_generate(CFGTarget(model, 1.0), [0, 1, 2], window=6, init="random", rule=rule, sampling=SAMPLE,
                           generator=torch.Generator().manual_seed(5)).tokens


def test_gsd_defaults_are_the_authors_on_the_input_token_embeddings(parts):
    """GSD compares the AR model's input embeddings of the codes (as the authors' code does), not the VQ codebook."""
    model, codebook = parts
    config = MethodConfig(method="gsd", window=6, init="random")
    assert (config.gsd_window, config.gsd_prob_threshold, config.gsd_distance_threshold, config.gsd_latents) == (
        GSD_WINDOW, GSD_PROB_THRESHOLD, GSD_DISTANCE_THRESHOLD, "embeddings") == (7, 0.15, 0.5, "embeddings")
    runner = MethodRunner(CFGTarget(model, 1.0), codebook=codebook)
    assert torch.equal(runner.gsd_latents("embeddings"), model.tok_embeddings.weight.detach())
    # squared distance 2.0: about half the codebook pairs pass, almost no embedding pairs (median 5.9)
    group = dict(window=5, prob_threshold=None, distance_threshold=2.0)
    options = dict(window=6, init="random", gsd_window=5, gsd_prob_threshold=None, gsd_distance_threshold=2.0)
    by_embeddings = gsd_direct(model, model.tok_embeddings.weight, **group)
    by_codebook = gsd_direct(model, codebook, **group)
    assert not torch.equal(by_embeddings, by_codebook)
    default = runner.run(MethodConfig(method="gsd", **options), [0, 1, 2], sampling=SAMPLE,
                         generator=torch.Generator().manual_seed(5)).tokens
    assert torch.equal(default, by_embeddings)
    chosen = runner.run(MethodConfig(method="gsd", gsd_latents="codebook", **options), [0, 1, 2], sampling=SAMPLE,
                        generator=torch.Generator().manual_seed(5)).tokens
    assert torch.equal(chosen, by_codebook)


def test_gsd_latent_errors(parts):
    model, _ = parts
    with pytest.raises(MMSpecError, match="gsd_latents must be one of"):
        MethodConfig(method="gsd", gsd_latents="pixels")
    with pytest.raises(MMSpecError, match="needs the VQ codebook"):
        MethodRunner(CFGTarget(model, 1.0)).check(MethodConfig(method="gsd", gsd_latents="codebook"))
    with pytest.raises(MMSpecError, match="token embeddings have 5 rows"):
        MethodRunner(CFGTarget(model, 1.0), embeddings=torch.zeros(5, 3))


def test_lantern_k_is_checked_against_the_codebook(parts):
    """No silent clipping: a neighbourhood as large as the codebook is one clear error, before anything runs."""
    model, codebook = parts
    runner = MethodRunner(CFGTarget(model, 1.0), codebook=codebook)
    with pytest.raises(MMSpecError, match=r"lantern_k=1000 does not fit this 12-code codebook: it must be in \[1, 11\]"):
        runner.run(MethodConfig(method="lantern", drafts="jacobi"), [0], sampling=SAMPLE)
    with pytest.raises(MMSpecError, match="lantern_k=12 does not fit"):
        runner.check(MethodConfig(method="lantern", lantern_k=12))
    runner.check(MethodConfig(method="lantern", lantern_k=11))
    assert runner.neighbours(11).shape == (12, 11)
    for bad, message in [(dict(lantern_k=0), "lantern_k"), (dict(lantern_delta=1.5), r"budget in \[0, 1\]"),
                         (dict(lantern_delta=-0.1), r"budget in \[0, 1\]"), (dict(lantern_lam=0.5), "lantern_lam")]:
        with pytest.raises(MMSpecError, match=message):
            MethodConfig(method="lantern", **bad)


def test_gsd_window_options(parts):
    """An int W is the authors' window (W below, W - 1 above); a (below, above) pair is taken as given."""
    model, codebook = parts
    runner = MethodRunner(CFGTarget(model, 1.0), codebook=codebook)
    out = runner.run(MethodConfig(method="gsd", window=6, gsd_window=(7, 7), gsd_distance_threshold=None), [0],
                     sampling=SAMPLE, generator=torch.Generator().manual_seed(1))
    assert out.tokens.shape == (1, 4, 4)
    for bad in (-1, (-1, 3)):
        with pytest.raises(MMSpecError, match="rank window"):
            MethodConfig(method="gsd", gsd_window=bad)
