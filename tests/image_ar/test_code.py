"""CoDe: a large drafter VAR runs the first N scales, a small refiner VAR prefills over them in one
block-causal pass and generates the rest (tiny random models sharing one VQ-VAE, float32, CPU)."""

from __future__ import annotations

import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.image_ar.code import code_generate
from mmspec.image_ar.var import VAR, VARSampling
from mmspec.image_ar.var_vq import tiny_var_vq
from mmspec.sampling import seeded_generator

from ..device_checks import default_device_elsewhere

PATCH_NUMS = (1, 2, 3, 4)
SAMPLING = VARSampling(cfg=2.0, top_k=12, top_p=0.95, temperature=(1.1, 1.1, 1.0, 1.0))


@pytest.fixture(scope="module")
def vq():
    return tiny_var_vq(vocab_size=16, z_channels=8, patch_nums=PATCH_NUMS, seed=0)


def var_of(seed, depth):
    torch.manual_seed(seed)
    return VAR(vocab_size=16, Cvae=8, num_classes=5, depth=depth, embed_dim=32, num_heads=2,
               patch_nums=PATCH_NUMS).eval()


@pytest.fixture(scope="module")
def drafter():
    return var_of(seed=0, depth=3)


@pytest.fixture(scope="module")
def refiner():
    return var_of(seed=1, depth=1)


def alone(model, vq, labels, seed):
    state = model.begin(labels)
    model.run_scales(state, vq, 0, len(PATCH_NUMS), SAMPLING, seeded_generator("cpu", seed))
    return state


@pytest.mark.parametrize("draft_steps", [1, 2, 3])
def test_a_refiner_with_the_drafters_weights_gives_the_drafters_own_output(drafter, vq, draft_steps):
    """Identity control: the refiner's one-pass prefill over the drafted scales rebuilds the same cache."""
    twin = var_of(seed=0, depth=3)
    twin.load_state_dict(drafter.state_dict())
    labels = [1, 4, 0]
    reference = alone(drafter, vq, labels, seed=11)
    out = code_generate(drafter, twin, vq, labels, draft_steps, SAMPLING, seeded_generator("cpu", 11))
    assert all(torch.equal(a, b) for a, b in zip(out.token_maps, reference.token_maps, strict=True))
    expected = vq.fhat_to_img(reference.f_hat).add(1).mul(0.5)
    assert torch.allclose(out.images, expected, atol=1e-5)


@pytest.mark.parametrize("draft_steps", [1, 2, 3])
def test_a_different_refiner_keeps_the_drafted_scales_and_changes_the_rest(drafter, refiner, vq, draft_steps):
    labels = [1, 4, 0]
    reference = alone(drafter, vq, labels, seed=11)
    out = code_generate(drafter, refiner, vq, labels, draft_steps, SAMPLING, seeded_generator("cpu", 11))
    assert all(torch.equal(a, b) for a, b in zip(out.token_maps[:draft_steps], reference.token_maps[:draft_steps], strict=True))
    later = torch.cat(out.token_maps[draft_steps:], dim=1)
    assert not torch.equal(later, torch.cat(reference.token_maps[draft_steps:], dim=1))
    assert out.images.shape == (3, 3, 8, 8)


@pytest.mark.parametrize("draft_steps", [1, 3])
def test_the_refiner_continues_from_the_drafted_scales_as_teacher_forcing_says(drafter, refiner, vq, draft_steps):
    """Greedy: each refined scale is the refiner's guided argmax given all earlier scales, drafted or its own."""
    greedy = VARSampling(cfg=2.0, do_sample=False)
    out = code_generate(drafter, refiner, vq, [2, 3], draft_steps, greedy)
    labels = torch.tensor([2, 3])
    inputs = vq.quantize.idxBl_to_var_input(out.token_maps)
    cond, uncond = refiner(labels, inputs), refiner(torch.full_like(labels, 5), inputs)
    for si in range(draft_steps, len(PATCH_NUMS)):
        begin, end = refiner.begin_ends[si]
        t = 2.0 * si / 3
        guided = (1 + t) * cond[:, begin:end] - t * uncond[:, begin:end]
        assert torch.equal(guided.argmax(-1), out.token_maps[si])


@pytest.mark.parametrize("draft_steps", [1, 2, 3])
def test_stats_count_forwards_and_scales_per_model(drafter, refiner, vq, draft_steps):
    out = code_generate(drafter, refiner, vq, [0], draft_steps, SAMPLING, seeded_generator("cpu", 0))
    # The refiner's first forward is the prefill that also yields its first scale.
    assert out.stats.target_forwards == draft_steps and out.stats.drafter_forwards == 4 - draft_steps
    assert out.stats.scales_by("model") == draft_steps and out.stats.scales_by("refiner") == 4 - draft_steps
    assert out.stats.draft_scales == draft_steps and out.stats.new_tokens == 1 + 4 + 9 + 16
    assert [r.prefill for r in out.stats.scales] == [si == draft_steps for si in range(4)]


@pytest.mark.parametrize("draft_steps", [0, 4, -1, 2.5, None, True])
def test_draft_steps_outside_the_scales_are_refused(drafter, refiner, vq, draft_steps):
    with pytest.raises(MMSpecError, match=r"draft_steps must be in 1\.\.3"):
        code_generate(drafter, refiner, vq, [0], draft_steps, SAMPLING)


def test_models_on_different_scales_are_refused(drafter, vq):
    torch.manual_seed(0)
    other = VAR(vocab_size=16, Cvae=8, num_classes=5, depth=1, embed_dim=32, num_heads=2, patch_nums=(1, 2, 4)).eval()
    with pytest.raises(MMSpecError, match="scales differ"):
        code_generate(drafter, other, vq, [0], 2, SAMPLING)


def test_no_tensor_or_draw_lands_on_the_default_device(drafter, refiner, vq):
    expected = code_generate(drafter, refiner, vq, [0, 1], 2, SAMPLING, seeded_generator("cpu", 3))
    with default_device_elsewhere(drafter, refiner, vq):
        out = code_generate(drafter, refiner, vq, [0, 1], 2, SAMPLING, seeded_generator("cpu", 3))
    assert out.images.device.type == "cpu" and torch.equal(out.images, expected.images)
