"""MAR and its DiffLoss head: official parameter names and shapes, the diffusers schedulers configured to
the official cosine schedule and respacing, the step Gaussian equal to `DDPMScheduler.step`, seeded
sampling, save/load, the training loss, one-line errors (tiny random models, float32, CPU)."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
import torch
from diffusers import DDPMScheduler

from mmspec.errors import MMSpecError
from mmspec.image_ar.diffloss import cosine_scheduler, step_gaussian
from mmspec.image_ar.mar import MAR, load_official_mar, tiny_mar
from mmspec.sampling import seeded_generator

SMALL = dict(img_size=32, vae_stride=16, patch_size=1, encoder_embed_dim=64, encoder_depth=2, encoder_num_heads=4,
             decoder_embed_dim=64, decoder_depth=2, decoder_num_heads=4, mlp_ratio=4.0, vae_embed_dim=16, class_num=10,
             buffer_size=8, diffloss_d=2, diffloss_w=96, num_sampling_steps=10)


def official_shapes(e: int = 64, d: int = 64, depth: int = 2, tokens: int = 4, c: int = 16, classes: int = 10,
                    buffer: int = 8, w: int = 96, res: int = 2) -> dict[str, tuple[int, ...]]:
    """Names and shapes of LTH14/mar's `MAR` state dict for a scaled-down build, written from its
    definitions (timm ViT blocks with qkv_bias, mlp_ratio 4; DiffLoss's SimpleMLPAdaLN with learned
    variance, so out_channels = 2 c; the final norm has no affine weights). The official class
    embedding always has 1000 rows; here it has `class_num`."""
    shapes = {"class_emb.weight": (classes, e), "fake_latent": (1, e), "z_proj.weight": (e, c), "z_proj.bias": (e,),
              "z_proj_ln.weight": (e,), "z_proj_ln.bias": (e,), "encoder_pos_embed_learned": (1, tokens + buffer, e),
              "encoder_norm.weight": (e,), "encoder_norm.bias": (e,), "decoder_embed.weight": (d, e),
              "decoder_embed.bias": (d,), "mask_token": (1, 1, d), "decoder_pos_embed_learned": (1, tokens + buffer, d),
              "decoder_norm.weight": (d,), "decoder_norm.bias": (d,), "diffusion_pos_embed_learned": (1, tokens, d)}
    for part, width in (("encoder_blocks", e), ("decoder_blocks", d)):
        for i in range(depth):
            p = f"{part}.{i}."
            shapes.update({p + "norm1.weight": (width,), p + "norm1.bias": (width,),
                           p + "attn.qkv.weight": (3 * width, width), p + "attn.qkv.bias": (3 * width,),
                           p + "attn.proj.weight": (width, width), p + "attn.proj.bias": (width,),
                           p + "norm2.weight": (width,), p + "norm2.bias": (width,),
                           p + "mlp.fc1.weight": (4 * width, width), p + "mlp.fc1.bias": (4 * width,),
                           p + "mlp.fc2.weight": (width, 4 * width), p + "mlp.fc2.bias": (width,)})
    n = "diffloss.net."
    shapes.update({n + "time_embed.mlp.0.weight": (w, 256), n + "time_embed.mlp.0.bias": (w,),
                   n + "time_embed.mlp.2.weight": (w, w), n + "time_embed.mlp.2.bias": (w,),
                   n + "cond_embed.weight": (w, d), n + "cond_embed.bias": (w,),
                   n + "input_proj.weight": (w, c), n + "input_proj.bias": (w,),
                   n + "final_layer.linear.weight": (2 * c, w), n + "final_layer.linear.bias": (2 * c,),
                   n + "final_layer.adaLN_modulation.1.weight": (2 * w, w),
                   n + "final_layer.adaLN_modulation.1.bias": (2 * w,)})
    for i in range(res):
        p = f"{n}res_blocks.{i}."
        shapes.update({p + "in_ln.weight": (w,), p + "in_ln.bias": (w,), p + "mlp.0.weight": (w, w), p + "mlp.0.bias": (w,),
                       p + "mlp.2.weight": (w, w), p + "mlp.2.bias": (w,), p + "adaLN_modulation.1.weight": (3 * w, w),
                       p + "adaLN_modulation.1.bias": (3 * w,)})
    return shapes


def test_state_dict_has_the_official_names_and_shapes():
    ours = {k: tuple(v.shape) for k, v in MAR(**SMALL).state_dict().items()}
    assert ours == official_shapes()


def test_an_official_checkpoint_loads(tmp_path):
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(shape, generator=g) * 0.05 for k, shape in official_shapes().items()}
    model = load_official_mar({"model_ema": state, "model": {}}, **SMALL)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key
    path = tmp_path / "checkpoint-last.pth"  # the official file layout: model, model_ema, the training args
    torch.save({"model": state, "model_ema": state, "epoch": 3, "args": argparse.Namespace(model="mar_base")}, path)
    assert torch.equal(load_official_mar(path, **SMALL).mask_token, state["mask_token"])
    (tmp_path / "bad.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(MMSpecError, match="cannot read .*bad.pth"):
        load_official_mar(tmp_path / "bad.pth", **SMALL)
    with pytest.raises(MMSpecError, match="not a MAR state dict"):
        load_official_mar({"model": {k: v for k, v in state.items() if k != "mask_token"}}, ema=False, **SMALL)


def test_scheduler_is_the_official_cosine_schedule_and_respacing():
    scheduler = cosine_scheduler("ddpm")
    scheduler.set_timesteps(100)
    # the official respacing of "100" over 1000 steps: round(i * 999 / 99)
    stride = (1000 - 1) / (100 - 1)
    official = sorted({round(i * stride) for i in range(100)}, reverse=True)
    assert scheduler.timesteps.tolist() == official
    # the official cosine betas: 1 - abar(t+1)/abar(t), abar(t) = cos((t/1000 + 0.008)/1.008 pi/2)^2, capped at 0.999
    abar = lambda t: math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
    betas = np.array([min(1 - abar((i + 1) / 1000) / abar(i / 1000), 0.999) for i in range(1000)])
    assert np.allclose(scheduler.betas.numpy(), betas, atol=1e-6)
    assert scheduler.config.variance_type == "learned_range" and scheduler.config.prediction_type == "epsilon"


def test_step_gaussian_is_what_ddpm_scheduler_step_samples():
    scheduler = cosine_scheduler("ddpm")
    scheduler.set_timesteps(10)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 4, generator=g)
    out = torch.randn(5, 8, generator=g).clamp(-1, 1)
    for t in scheduler.timesteps.tolist()[:-1]:
        mean, log_var = step_gaussian(scheduler, out, t, x)
        stepped = DDPMScheduler.step(scheduler, out, t, x, generator=torch.Generator().manual_seed(7)).prev_sample
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(7))
        torch.testing.assert_close(mean + (0.5 * log_var).exp() * noise, stepped, rtol=1e-5, atol=1e-5)
    last = scheduler.timesteps.tolist()[-1]
    mean, _ = step_gaussian(scheduler, out, last, x)
    torch.testing.assert_close(mean, scheduler.step(out, last, x).prev_sample, rtol=1e-5, atol=1e-5)


def test_sampling_denoiser_is_the_nets_forward():
    from mmspec.image_ar.diffloss import SamplingDenoiser, SimpleMLPAdaLN

    torch.manual_seed(0)
    net = SimpleMLPAdaLN(in_channels=4, model_channels=16, out_channels=8, z_channels=12, num_res_blocks=2)
    for p in net.parameters():  # the zero-initialised gates would hide the blocks
        torch.nn.init.normal_(p, std=0.3)
    timesteps = torch.tensor([999, 600, 37, 0])
    c, x = torch.randn(6, 12), torch.randn(6, 4)
    denoise = SamplingDenoiser(net, timesteps, c)
    for step, t in enumerate(timesteps.tolist()):
        expected = net(x, torch.full((6,), t), c)
        torch.testing.assert_close(denoise(x, step), expected, rtol=1e-5, atol=1e-6)
    guided = net.forward_with_cfg(x, torch.full((6,), 600), c, 3.0)
    torch.testing.assert_close(net.guide(denoise(torch.cat([x[:3], x[:3]]), 1), 3.0), guided, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def mar():
    torch.set_num_threads(1)
    return tiny_mar(0)


def test_sampling_is_seeded_and_shaped(mar):
    labels = torch.tensor([1, 7])
    a = mar.sample_tokens(2, num_iter=4, cfg=2.0, labels=labels, generator=seeded_generator("cpu", 3))
    b = mar.sample_tokens(2, num_iter=4, cfg=2.0, labels=labels, generator=seeded_generator("cpu", 3))
    c = mar.sample_tokens(2, num_iter=4, cfg=2.0, labels=labels, generator=seeded_generator("cpu", 4))
    assert a.shape == (2, 4, 4, 4) and a.dtype == torch.float32 and torch.isfinite(a).all()
    assert torch.equal(a, b) and not torch.equal(a, c)
    unguided = mar.sample_tokens(2, num_iter=4, cfg=1.0, labels=labels, generator=seeded_generator("cpu", 3))
    assert not torch.equal(a, unguided)


def test_cosine_schedule_predicts_every_token_once(mar):
    from mmspec.image_ar.masked_decode import cfg_scale, cosine_lefts

    lefts = cosine_lefts(5, 16)
    assert lefts[-1] == 0 and all(b < a for a, b in zip([16] + lefts, lefts))
    assert lefts == [max(1, math.floor(16 * math.cos(math.pi / 2 * (s + 1) / 5))) for s in range(4)] + [0]
    # the official ramp counts the last step's mask as one token
    assert cfg_scale(4.0, "linear", 16, 0) == cfg_scale(4.0, "linear", 16, 1) == 1 + 3.0 * 15 / 16
    assert cfg_scale(4.0, "linear", 16, 16) == 1.0 and cfg_scale(4.0, "constant", 16, 7) == 4.0


def test_ddim_head_samples_deterministically_from_the_noise(mar):
    ddim = tiny_mar(0, scheduler="ddim")
    z = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    noise = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    a = ddim.diffloss.sample(z, noise=noise).tokens
    assert torch.equal(a, ddim.diffloss.sample(z, noise=noise).tokens) and a.shape == (3, 4)
    assert not ddim.supports_density and mar.supports_density


def test_save_and_load_round_trip(mar, tmp_path):
    mar.save_pretrained(tmp_path / "mar")
    again = MAR.from_pretrained(tmp_path / "mar").eval()
    for (name, a), (_, b) in zip(mar.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    out = lambda m: m.sample_tokens(1, num_iter=3, labels=torch.tensor([2]), generator=seeded_generator("cpu", 0))  # noqa: E731
    assert torch.equal(out(mar), out(again))


def test_training_loss_is_finite_and_trains_every_part():
    model = tiny_mar(1).train()
    latents = torch.randn(2, 4, 4, 4, generator=torch.Generator().manual_seed(0))
    loss = model(latents, torch.tensor([0, 3]), generator=seeded_generator("cpu", 0))
    loss.backward()
    assert torch.isfinite(loss) and loss.ndim == 0
    for name in ("z_proj.weight", "encoder_blocks.0.attn.qkv.weight", "decoder_blocks.0.mlp.fc1.weight",
                 "diffloss.net.final_layer.linear.weight", "diffusion_pos_embed_learned"):
        assert model.get_parameter(name).grad.abs().sum() > 0, name


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_iter=0), "num_iter must be in 1..16"),
    (dict(num_iter=17), "num_iter must be in 1..16"),
    (dict(cfg=0.5), "cfg must be >= 1"),
    (dict(temperature=0.0), "temperature must be > 0"),
    (dict(cfg_schedule="cosine"), "unknown cfg_schedule 'cosine'"),
    (dict(labels=torch.tensor([10])), r"class labels must be in 0\.\.9"),
    (dict(labels=torch.tensor([1, 2])), "got 2 labels for a batch of 1"),
])
def test_bad_generation_settings_give_one_clear_error(mar, kwargs, message):
    with pytest.raises(MMSpecError, match=message) as info:
        mar.sample_tokens(1, **{"num_iter": 4, **kwargs})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides, message", [
    (dict(scheduler="euler"), "unknown diffusion scheduler 'euler'"),
    (dict(encoder_num_heads=5), "encoder_embed_dim 32 is not a multiple of encoder_num_heads 5"),
    (dict(img_size=18), "img_size 18 is not a multiple"),
    (dict(num_sampling_steps=0), "num_sampling_steps must be in 1..1000"),
])
def test_bad_configs_give_one_clear_error(overrides, message):
    with pytest.raises(MMSpecError, match=message):
        tiny_mar(0, **overrides)


@pytest.mark.parametrize("name, millions", [("mar_base", 208), ("mar_large", 479), ("mar_huge", 943)])
def test_official_builds_have_the_papers_parameter_counts(name, millions):
    """MAR-B/L/H are 208M/479M/943M parameters (Li et al. 2024, Table 4); built on the meta device."""
    from mmspec.image_ar.mar import OFFICIAL_BUILDS

    with torch.device("meta"):
        model = MAR(**OFFICIAL_BUILDS[name])
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - millions) < 1.5
    assert model.state_dict()["class_emb.weight"].shape == (1000, OFFICIAL_BUILDS[name]["encoder_embed_dim"])


def test_the_head_can_skip_the_degenerate_first_timestep():
    """"leading" spacing starts at t = 980 (gain 33 from noise prediction to x_0) instead of the official 999 (2e4)."""
    from mmspec.image_ar.diffloss import cosine_scheduler

    official, leading = cosine_scheduler("ddpm"), cosine_scheduler("ddpm", timestep_spacing="leading")
    official.set_timesteps(50), leading.set_timesteps(50)
    assert int(official.timesteps[0]) == 999 and int(leading.timesteps[0]) == 980 and int(leading.timesteps[-1]) == 0
    gain = lambda t: float(1 / official.alphas_cumprod[t].sqrt())  # noqa: E731
    assert gain(999) > 1e4 and gain(980) < 40
    model = tiny_mar(0, timestep_spacing="leading")
    assert int(model.diffloss.scheduler.timesteps[0]) == 900 and int(tiny_mar(0).diffloss.scheduler.timesteps[0]) == 999
    with pytest.raises(MMSpecError, match="unknown timestep_spacing 'trailing'"):
        cosine_scheduler("ddpm", timestep_spacing="trailing")
