"""VAR and its multi-scale VQ-VAE: official parameter names, block-causal attention, the KV cache,
CFG with the linear ramp, seeded sampling on the model's device (tiny random models, float32, CPU)."""

from __future__ import annotations

import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.image_ar.var import VAR, VARSampling
from mmspec.image_ar.var_vq import VQVAE, tiny_var_vq
from mmspec.sampling import seeded_generator

from ..device_checks import default_device_elsewhere

PATCH_NUMS = (1, 2, 3, 4)
L = 1 + 4 + 9 + 16


@pytest.fixture(scope="module")
def vq():
    return tiny_var_vq(vocab_size=16, z_channels=8, patch_nums=PATCH_NUMS, seed=0)


def var_of(vq, seed=0, depth=2, shared_aln=False):
    torch.manual_seed(seed)
    return VAR(vocab_size=16, Cvae=8, num_classes=5, depth=depth, embed_dim=32, num_heads=2,
               shared_aln=shared_aln, patch_nums=PATCH_NUMS).eval()


@pytest.fixture(scope="module")
def var(vq):
    return var_of(vq)


# ---- official names and shapes (written from FoundationVision/VAR's definitions) ----------------

def official_var_keys(depth, C, H, V, Cvae, classes, shared_aln):
    keys = {"word_embed.weight": (C, Cvae), "word_embed.bias": (C,), "class_emb.weight": (classes + 1, C),
            "pos_start": (1, 1, C), "pos_1LC": (1, L, C), "lvl_embed.weight": (len(PATCH_NUMS), C),
            "lvl_1L": (1, L), "attn_bias_for_masking": (1, 1, L, L),
            "head_nm.ada_lin.1.weight": (2 * C, C), "head_nm.ada_lin.1.bias": (2 * C,),
            "head.weight": (V, C), "head.bias": (V,)}
    if shared_aln:
        keys |= {"shared_ada_lin.1.weight": (6 * C, C), "shared_ada_lin.1.bias": (6 * C,)}
    for i in range(depth):
        b = f"blocks.{i}."
        keys |= {b + "attn.mat_qkv.weight": (3 * C, C), b + "attn.q_bias": (C,), b + "attn.v_bias": (C,),
                 b + "attn.zero_k_bias": (C,), b + "attn.scale_mul_1H11": (1, H, 1, 1),
                 b + "attn.proj.weight": (C, C), b + "attn.proj.bias": (C,),
                 b + "ffn.fc1.weight": (4 * C, C), b + "ffn.fc1.bias": (4 * C,),
                 b + "ffn.fc2.weight": (C, 4 * C), b + "ffn.fc2.bias": (C,)}
        if shared_aln:
            keys[b + "ada_gss"] = (1, 1, 6, C)
        else:
            keys |= {b + "ada_lin.1.weight": (6 * C, C), b + "ada_lin.1.bias": (6 * C,)}
    return keys


def resnet_keys(prefix, cin, cout):
    keys = {f"{prefix}.norm1.weight": (cin,), f"{prefix}.norm1.bias": (cin,), f"{prefix}.conv1.weight": (cout, cin, 3, 3),
            f"{prefix}.conv1.bias": (cout,), f"{prefix}.norm2.weight": (cout,), f"{prefix}.norm2.bias": (cout,),
            f"{prefix}.conv2.weight": (cout, cout, 3, 3), f"{prefix}.conv2.bias": (cout,)}
    if cin != cout:
        keys |= {f"{prefix}.nin_shortcut.weight": (cout, cin, 1, 1), f"{prefix}.nin_shortcut.bias": (cout,)}
    return keys


def attn_keys(prefix, c):
    return {f"{prefix}.norm.weight": (c,), f"{prefix}.norm.bias": (c,), f"{prefix}.qkv.weight": (3 * c, c, 1, 1),
            f"{prefix}.qkv.bias": (3 * c,), f"{prefix}.proj_out.weight": (c, c, 1, 1), f"{prefix}.proj_out.bias": (c,)}


def conv_keys(prefix, cout, cin, k=3):
    return {f"{prefix}.weight": (cout, cin, k, k), f"{prefix}.bias": (cout,)}


def official_vq_keys():
    """ch 16, ch_mult (1, 2), 1 res block, z 8, vocab 16, 4 shared phi, patch_nums (1, 2, 3, 4)."""
    def mid(p, c):
        return resnet_keys(f"{p}.mid.block_1", c, c) | attn_keys(f"{p}.mid.attn_1", c) | resnet_keys(f"{p}.mid.block_2", c, c)

    enc = (conv_keys("encoder.conv_in", 16, 3) | resnet_keys("encoder.down.0.block.0", 16, 16)
           | conv_keys("encoder.down.0.downsample.conv", 16, 16) | resnet_keys("encoder.down.1.block.0", 16, 32)
           | attn_keys("encoder.down.1.attn.0", 32) | mid("encoder", 32)
           | {"encoder.norm_out.weight": (32,), "encoder.norm_out.bias": (32,)} | conv_keys("encoder.conv_out", 8, 32))
    dec = (conv_keys("decoder.conv_in", 32, 8) | mid("decoder", 32)
           | resnet_keys("decoder.up.1.block.0", 32, 32) | resnet_keys("decoder.up.1.block.1", 32, 32)
           | attn_keys("decoder.up.1.attn.0", 32) | attn_keys("decoder.up.1.attn.1", 32)
           | conv_keys("decoder.up.1.upsample.conv", 32, 32)
           | resnet_keys("decoder.up.0.block.0", 32, 16) | resnet_keys("decoder.up.0.block.1", 16, 16)
           | {"decoder.norm_out.weight": (16,), "decoder.norm_out.bias": (16,)} | conv_keys("decoder.conv_out", 3, 16))
    quant = {"quantize.embedding.weight": (16, 8), "quantize.ema_vocab_hit_SV": (4, 16)}
    for k in range(4):
        quant |= conv_keys(f"quantize.quant_resi.qresi_ls.{k}", 8, 8)
    return enc | dec | quant | conv_keys("quant_conv", 8, 8) | conv_keys("post_quant_conv", 8, 8)


def random_state_dict(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


@pytest.mark.parametrize("shared_aln", [False, True])
def test_an_official_var_state_dict_loads_strictly(vq, shared_aln):
    model = var_of(vq, shared_aln=shared_aln)
    expected = official_var_keys(depth=2, C=32, H=2, V=16, Cvae=8, classes=5, shared_aln=shared_aln)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
    state = random_state_dict(expected, seed=1)
    model.load_state_dict(state, strict=True)
    assert torch.equal(model.blocks[1].attn.mat_qkv.weight, state["blocks.1.attn.mat_qkv.weight"])


def test_an_official_vq_state_dict_loads_strictly(vq):
    expected = official_vq_keys()
    assert {k: tuple(v.shape) for k, v in vq.state_dict().items()} == expected
    fresh = tiny_var_vq(seed=3)
    state = random_state_dict(expected, seed=2)
    fresh.load_state_dict(state, strict=True)
    assert torch.equal(fresh.quantize.quant_resi.qresi_ls[3].weight, state["quantize.quant_resi.qresi_ls.3.weight"])


def test_a_misnamed_key_is_refused(vq):
    """Control: strict loading does check the names."""
    state = var_of(vq).state_dict()
    state["blocks.0.attn.qkv.weight"] = state.pop("blocks.0.attn.mat_qkv.weight")
    with pytest.raises(RuntimeError):
        var_of(vq).load_state_dict(state, strict=True)


# ---- the VQ-VAE ------------------------------------------------------------------------------------

def test_phi_blends_half_of_the_convolution_and_picks_the_nearest_tick(vq):
    quant = vq.quantize
    h = torch.randn(1, 8, 4, 4, generator=torch.Generator().manual_seed(0))
    phi = quant.quant_resi.qresi_ls[0]
    assert torch.allclose(phi(h), 0.5 * h + 0.5 * torch.nn.functional.conv2d(h, phi.weight, phi.bias, padding=1))
    # 4 scales: s / 3 = 0, 1/3, 2/3, 1 against ticks 1/12, 5/12, 7/12, 11/12
    assert [list(quant.quant_resi.qresi_ls).index(quant.phi(s)) for s in range(4)] == [0, 1, 2, 3]


def test_fhat_accumulates_the_scales_and_next_inputs_are_its_area_downsamples(vq):
    g = torch.Generator().manual_seed(1)
    codes = [torch.randint(16, (2, pn * pn), generator=g) for pn in PATCH_NUMS]
    inputs = vq.quantize.idxBl_to_var_input(codes)
    assert inputs.shape == (2, L - 1, 8)
    f_hat = vq.quantize.idxBl_to_fhat(codes[:2])
    two_scales = torch.nn.functional.interpolate(f_hat, size=(3, 3), mode="area").flatten(2).transpose(1, 2)
    assert torch.allclose(inputs[:, 4:13], two_scales, atol=1e-6)
    assert vq.idxBl_to_img(codes).shape == (2, 3, 8, 8)


def test_encoding_quantises_residually(vq):
    images = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(2)) * 2 - 1
    codes = vq.img_to_idxBl(images)
    assert [tuple(c.shape) for c in codes] == [(2, pn * pn) for pn in PATCH_NUMS]
    f = vq.quant_conv(vq.encoder(images))
    book = vq.quantize.embedding.weight
    for si, pn in enumerate(PATCH_NUMS):  # scale s codes what scales < s left of the latent, at pn x pn
        rest = f - vq.quantize.idxBl_to_fhat(codes[:si]) if si else f
        z = torch.nn.functional.interpolate(rest, size=(pn, pn), mode="area").permute(0, 2, 3, 1).reshape(-1, 8)
        assert torch.equal(((z[:, None] - book[None]) ** 2).sum(-1).argmin(-1).view(2, -1), codes[si])
    with pytest.raises(MMSpecError, match="8x8"):
        vq.img_to_idxBl(torch.zeros(1, 3, 16, 16))


# ---- block-causal attention and the KV cache ------------------------------------------------------

def test_the_mask_is_block_causal_over_scales(var):
    scale = [s for s, pn in enumerate(PATCH_NUMS) for _ in range(pn * pn)]
    expected = torch.tensor([[0.0 if scale[j] <= scale[i] else float("-inf") for j in range(L)] for i in range(L)])
    assert torch.equal(var.attn_bias_for_masking[0, 0], expected)


def teacher_inputs(vq, seed=3, B=2):
    g = torch.Generator().manual_seed(seed)
    codes = [torch.randint(16, (B, pn * pn), generator=g) for pn in PATCH_NUMS]
    return codes, vq.quantize.idxBl_to_var_input(codes)


def test_a_scale_sees_itself_and_earlier_scales_only(var, vq):
    labels = torch.tensor([1, 4])
    _, inputs = teacher_inputs(vq)
    base = var(labels, inputs)
    changed = inputs.clone()
    changed[:, 4:13] += 1.0  # the input map of scale 2 (positions 5..13 of the sequence)
    moved = var(labels, changed)
    assert torch.equal(base[:, :5], moved[:, :5])
    assert not torch.allclose(base[:, 5:14], moved[:, 5:14])
    assert not torch.allclose(base[:, 14:], moved[:, 14:])


@pytest.mark.parametrize("prefill_upto", [0, 2])
def test_cached_scale_by_scale_logits_equal_one_full_forward(var, vq, prefill_upto):
    labels = torch.tensor([0, 3])
    _, inputs = teacher_inputs(vq)
    full = var(labels, inputs)
    cache = [[] for _ in var.blocks]
    stop = prefill_upto + 1
    x = var.embed(labels, inputs[:, : var.begin_ends[stop - 1][1] - 1] if stop > 1 else None, 0, stop)
    pieces = [var.transformer(x, labels, var.attn_bias_for_masking[:, :, : x.shape[1], : x.shape[1]], cache)]
    for si in range(stop, len(PATCH_NUMS)):
        begin, end = var.begin_ends[si]
        pieces.append(var.transformer(var.embed(labels, inputs[:, begin - 1:end - 1], si, si + 1), labels, None, cache))
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=1e-5)
    # Control: without the cache a scale sees only itself, and the logits differ.
    begin, end = var.begin_ends[3]
    alone = var.transformer(var.embed(labels, inputs[:, begin - 1:end - 1], 3, 4), labels, None, None)
    assert not torch.allclose(alone, full[:, begin:end], atol=1e-3)


# ---- generation ------------------------------------------------------------------------------------

def guided_teacher_logits(var, vq, labels, codes, cfg):
    inputs = vq.quantize.idxBl_to_var_input(codes)
    cond = var(labels, inputs)
    uncond = var(torch.full_like(labels, var.num_classes), inputs)
    out = []
    for si, (begin, end) in enumerate(var.begin_ends):
        t = cfg * si / (len(PATCH_NUMS) - 1)
        out.append((1 + t) * cond[:, begin:end] - t * uncond[:, begin:end])
    return out


def test_greedy_generation_is_the_argmax_of_the_guided_teacher_forced_logits(var, vq):
    """The KV-cached loop, CFG with the linear ramp, and f_hat bookkeeping, checked against one full pass."""
    labels = torch.tensor([2, 0])
    state = var.begin(labels)
    var.run_scales(state, vq, 0, 4, VARSampling(cfg=3.0, do_sample=False))
    logits = guided_teacher_logits(var, vq, labels, state.token_maps, cfg=3.0)
    assert [torch.equal(lg.argmax(-1), tok) for lg, tok in zip(logits, state.token_maps, strict=True)] == [True] * 4
    assert torch.allclose(state.f_hat, vq.quantize.idxBl_to_fhat(state.token_maps), atol=1e-6)
    assert state.forwards == {"var": 4}
    # Control: a constant guidance (no ramp) is not what was generated.
    flat = [lg.argmax(-1) for lg in guided_teacher_logits(var, vq, labels, state.token_maps, cfg=300.0)]
    assert not all(torch.equal(a, b) for a, b in zip(flat, state.token_maps, strict=True))


def test_sampling_is_seeded_and_the_seed_matters(var, vq):
    def run(seed):
        return var.autoregressive_infer_cfg(vq, 2, [1, 2], generator=seeded_generator("cpu", seed),
                                            cfg=1.5, top_k=8, top_p=0.95)

    first, again, other = run(0), run(0), run(1)
    assert first.shape == (2, 3, 8, 8) and 0 <= first.min() and first.max() <= 1
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_top_k_one_is_greedy(var, vq):
    sampled = var.begin([3])
    var.run_scales(sampled, vq, 0, 4, VARSampling(cfg=1.0, top_k=1), seeded_generator("cpu", 5))
    greedy = var.begin([3])
    var.run_scales(greedy, vq, 0, 4, VARSampling(cfg=1.0, do_sample=False))
    assert all(torch.equal(a, b) for a, b in zip(sampled.token_maps, greedy.token_maps, strict=True))


def test_bad_settings_are_refused(var, vq):
    with pytest.raises(MMSpecError, match="class labels"):
        var.begin([5])
    with pytest.raises(MMSpecError, match="labels for a batch"):
        var.autoregressive_infer_cfg(vq, 3, [1, 2])
    with pytest.raises(MMSpecError, match="3 temperatures for 4 scales"):
        var.run_scales(var.begin([1]), vq, 0, 4, VARSampling(temperature=(1.0, 1.0, 1.0)))
    with pytest.raises(MMSpecError, match="top_k"):
        var.run_scales(var.begin([1]), vq, 0, 4, VARSampling(top_k=-2))
    with pytest.raises(MMSpecError, match="scales done"):
        var.run_scales(var.begin([1]), vq, 1, 4, VARSampling())
    other = VQVAE(vocab_size=32, z_channels=8, ch=16, v_patch_nums=PATCH_NUMS, ch_mult=(1, 2), num_res_blocks=1,
                  norm_groups=4)
    with pytest.raises(MMSpecError, match="does not match"):
        var.run_scales(var.begin([1]), other, 0, 4, VARSampling())


def test_no_tensor_or_draw_lands_on_the_default_device(var, vq):
    """With "meta" as the default device, generation with a CPU generator still runs on the models' device."""
    expected = var.autoregressive_infer_cfg(vq, 2, [0, 1], generator=seeded_generator("cpu", 7), top_k=4)
    with default_device_elsewhere(var, vq):
        images = var.autoregressive_infer_cfg(vq, 2, [0, 1], generator=seeded_generator("cpu", 7), top_k=4)
    assert images.device.type == "cpu" and torch.equal(images, expected)


# ---- diffusers model plumbing ----------------------------------------------------------------------

def test_save_and_load_pretrained_round_trip(var, vq, tmp_path):
    var.save_pretrained(tmp_path / "var")
    vq.save_pretrained(tmp_path / "vq")
    var2, vq2 = VAR.from_pretrained(tmp_path / "var").eval(), VQVAE.from_pretrained(tmp_path / "vq").eval()
    assert var2.patch_nums == PATCH_NUMS and vq2.v_patch_nums == PATCH_NUMS
    run = lambda m, q: m.autoregressive_infer_cfg(q, 1, 2, generator=seeded_generator("cpu", 4))  # noqa: E731
    assert torch.equal(run(var, vq), run(var2, vq2))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_generate(vq, dtype):
    model = var_of(vq).to(dtype)
    half_vq = tiny_var_vq(seed=0).to(dtype)
    images = model.autoregressive_infer_cfg(half_vq, 2, [0, 1], generator=seeded_generator("cpu", 0), top_k=4)
    assert images.dtype == dtype and torch.isfinite(images.float()).all()


def test_the_official_init_starts_every_block_near_the_identity(vq):
    model = var_of(vq).init_weights()
    C = model.C
    gates = model.blocks[0].ada_lin[-1].weight[: 2 * C]
    assert gates.abs().max() < 1e-5 and model.blocks[0].ada_lin[-1].weight[2 * C:].abs().max() > 1e-3
    labels = torch.tensor([1])
    _, inputs = teacher_inputs(vq, B=1)
    x = model.embed(labels, inputs, 0, len(PATCH_NUMS))
    cond = model.class_emb(labels)
    after = model.blocks[0](x, cond, model.attn_bias_for_masking, None)
    assert torch.allclose(after, x, atol=1e-4)


def test_without_labels_the_classes_are_drawn_with_the_generator(var, vq):
    run = lambda seed: var.autoregressive_infer_cfg(vq, 4, None, generator=seeded_generator("cpu", seed))  # noqa: E731
    assert torch.equal(run(5), run(5))


# ---- the published configurations (built on "meta": no memory) -------------------------------------

@pytest.mark.parametrize(("depth", "millions"), [(16, 310), (20, 600), (24, 1000), (30, 2000)])
def test_the_official_builds_have_the_published_parameter_counts(depth, millions):
    """build_vae_var: C = 64 depth, depth heads, 4096 codes of 32 channels, 1000 classes (VAR paper: 310M .. 2.0B)."""
    with torch.device("meta"):
        model = VAR(vocab_size=4096, Cvae=32, num_classes=1000, depth=depth, embed_dim=64 * depth, num_heads=depth)
    count = sum(p.numel() for p in model.parameters()) / 1e6
    assert float(f"{count:.2g}") == millions, count  # the paper rounds to two significant digits
    assert model.L == 680 and model.attn_bias_for_masking.shape == (1, 1, 680, 680)


def test_the_official_vq_vae_build_is_256_pixels_with_16x_downsampling():
    with torch.device("meta"):
        vq = VQVAE()  # vae_ch160v4096z32: ch 160, ch_mult (1, 1, 2, 2, 4), z 32, 4096 codes, 4 shared phi
    assert (vq.downsample, vq.image_size, vq.Cvae, vq.vocab_size) == (16, 256, 32, 4096)
    assert vq.state_dict()["quantize.ema_vocab_hit_SV"].shape == (10, 4096)
    assert vq.state_dict()["encoder.down.4.attn.1.qkv.weight"].shape == (3 * 640, 640, 1, 1)


@pytest.mark.parametrize("split", [1, 3])
def test_running_the_scales_in_two_calls_continues_the_own_cache(var, vq, split):
    sampling = VARSampling(cfg=1.5, top_k=8)
    whole = var.begin([1, 2])
    var.run_scales(whole, vq, 0, 4, sampling, seeded_generator("cpu", 9))
    parts = var.begin([1, 2])
    generator = seeded_generator("cpu", 9)
    var.run_scales(parts, vq, 0, split, sampling, generator)
    cache = parts.cache
    assert cache[0][0].shape[2] == var.begin_ends[split - 1][1]
    var.run_scales(parts, vq, split, 4, sampling, generator)
    assert parts.cache is cache and cache[0][0].shape[2] == L  # the second call went on from it, no new prefill
    assert all(torch.equal(a, b) for a, b in zip(whole.token_maps, parts.token_maps, strict=True))
    assert parts.forwards == {"var": 4}


def test_the_training_pass_is_straight_through_and_trains_encoder_codebook_and_phi():
    vq = tiny_var_vq(seed=4).train()
    images = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(6)) * 2 - 1
    f = vq.quant_conv(vq.encoder(images)).detach().requires_grad_(True)
    f_hat, loss, codes = vq.quantize(f)
    assert all(torch.equal(a, b) for a, b in zip(codes, vq.quantize.f_to_idxBl(f), strict=True))
    assert torch.allclose(f_hat, vq.quantize.idxBl_to_fhat(codes), atol=1e-6)
    (f_hat * torch.arange(f_hat.numel(), device="cpu").view_as(f_hat)).sum().backward(retain_graph=True)
    assert torch.equal(f.grad, torch.arange(f.numel(), device="cpu").view_as(f).float())  # identity gradient
    recon, vq_loss = vq(images)
    assert recon.shape == images.shape and vq_loss > 0
    (torch.nn.functional.mse_loss(recon, images) + vq_loss).backward()
    for name in ("encoder.conv_in.weight", "quantize.embedding.weight", "quantize.quant_resi.qresi_ls.0.weight",
                 "decoder.conv_out.weight"):
        assert vq.get_parameter(name).grad.abs().sum() > 0, name


def test_a_continuation_without_guidance_prefills_again(var, vq):
    """A cache built with CFG rows cannot serve an unguided continuation: it is rebuilt, not misused."""
    state = var.begin([1, 2])
    var.run_scales(state, vq, 0, 2, VARSampling(cfg=1.5), seeded_generator("cpu", 1))
    guided_cache = state.cache
    var.run_scales(state, vq, 2, 4, VARSampling(cfg=0.0, do_sample=False))
    assert state.cache is not guided_cache and state.cache[0][0].shape[0] == 2
    logits = var(torch.tensor([1, 2]), vq.quantize.idxBl_to_var_input(state.token_maps))
    assert torch.equal(logits[:, 14:].argmax(-1), state.token_maps[3])
