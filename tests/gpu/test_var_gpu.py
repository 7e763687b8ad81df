"""VAR and CoDe on CUDA: seeded repeats with a CUDA and a CPU generator, greedy tokens equal to the CPU's,
the identity control of CoDe on the GPU, and bfloat16. Skipped without a CUDA GPU."""

import pytest
import torch

from mmspec.image_ar import VAR, VARSampling, code_generate, tiny_var_vq
from mmspec.sampling import seeded_generator

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PATCH_NUMS = (1, 2, 3, 4)
SAMPLING = VARSampling(cfg=2.0, top_k=12, top_p=0.95)


def models(device, dtype=torch.float32):
    vq = tiny_var_vq(patch_nums=PATCH_NUMS, seed=0).to(device, dtype)
    built = []
    for seed, depth in ((0, 3), (1, 1)):
        torch.manual_seed(seed)
        built.append(VAR(vocab_size=16, Cvae=8, num_classes=5, depth=depth, embed_dim=32, num_heads=2,
                         patch_nums=PATCH_NUMS).eval().to(device, dtype))
    return vq, *built


@pytest.mark.parametrize("generator_device", ["cuda", "cpu"])
def test_var_and_code_repeat_with_either_generator(generator_device):
    vq, drafter, refiner = models("cuda")
    runs = [code_generate(drafter, refiner, vq, [0, 3], 2, SAMPLING, seeded_generator(generator_device, 7))
            for _ in range(2)]
    assert runs[0].images.device.type == "cuda"
    assert all(torch.equal(a, b) for a, b in zip(runs[0].token_maps, runs[1].token_maps, strict=True))
    images = drafter.autoregressive_infer_cfg(vq, 2, [1, 2], generator=seeded_generator(generator_device, 3))
    assert images.device.type == "cuda" and images.shape == (2, 3, 8, 8)


def test_greedy_tokens_equal_the_cpu_ones():
    greedy = VARSampling(cfg=2.0, do_sample=False)
    outs = []
    for device in ("cuda", "cpu"):
        vq, drafter, refiner = models(device)
        outs.append(code_generate(drafter, refiner, vq, [0, 4], 2, greedy))
    assert all(torch.equal(a.cpu(), b) for a, b in zip(outs[0].token_maps, outs[1].token_maps, strict=True))


def test_the_identity_control_holds_on_the_gpu():
    vq, drafter, _ = models("cuda")
    state = drafter.begin([1, 4])
    drafter.run_scales(state, vq, 0, 4, SAMPLING, seeded_generator("cpu", 11))
    out = code_generate(drafter, drafter, vq, [1, 4], 2, SAMPLING, seeded_generator("cpu", 11))
    assert all(torch.equal(a, b) for a, b in zip(out.token_maps, state.token_maps, strict=True))


def test_bfloat16_runs():
    vq, drafter, refiner = models("cuda", torch.bfloat16)
    out = code_generate(drafter, refiner, vq, [0, 1], 3, SAMPLING, seeded_generator("cpu", 0))
    assert out.images.dtype == torch.bfloat16 and torch.isfinite(out.images.float()).all()
