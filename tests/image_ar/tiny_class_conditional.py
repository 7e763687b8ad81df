"""Tiny random VAR and MAR pipelines (float32, CPU) for the tests of each and of what both must do alike."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL

from mmspec.image_ar.mar import tiny_mar
from mmspec.image_ar.mar_pipeline import MARPipeline
from mmspec.image_ar.var import VAR
from mmspec.image_ar.var_pipeline import VARPipeline
from mmspec.image_ar.var_vq import VQVAE, tiny_var_vq

MAR_CLASSES = [f"shape {i}" for i in range(10)]
MAR_CARD = {"num_iter": 6, "num_draft": 2, "prefill_ratio": 0.15}
VAR_CLASSES = ["red circle", "blue circle", "red square", "blue square", "green star"]
VAR_CARD = {"draft_scales": 2, "cfg": 2.0}
PATCH_NUMS = (1, 2, 3, 4)


def tiny_vae(seed: int = 0) -> AutoencoderKL:
    """16 x 16 RGB <-> 4 x 4 x 4 latents (tiny_mar's tokens)."""
    torch.manual_seed(seed)
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
                         up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(8, 8, 8), layers_per_block=1,
                         latent_channels=4, norm_num_groups=4, sample_size=16).eval()


def mar_pipeline() -> MARPipeline:
    """A target MAR, a narrower draft MAR, the VAE, 10 class names and a card."""
    return MARPipeline(tiny_mar(0), tiny_vae(), tiny_mar(1, encoder_embed_dim=16, decoder_embed_dim=16),
                       class_names=MAR_CLASSES, model_name="tiny-mar", card=MAR_CARD)


def var_of(seed: int, depth: int) -> VAR:
    torch.manual_seed(seed)
    return VAR(vocab_size=16, Cvae=8, num_classes=5, depth=depth, embed_dim=32, num_heads=2,
               patch_nums=PATCH_NUMS).eval()


def tiny_vq(vocab_size: int = 16) -> VQVAE:
    return tiny_var_vq(vocab_size=vocab_size, z_channels=8, patch_nums=PATCH_NUMS, seed=0)


def var_pipeline() -> VARPipeline:
    """A 3-block VAR, a 1-block refiner, the VQ-VAE (4 scales), 5 class names and a card."""
    return VARPipeline(var_of(0, 3), tiny_vq(), var_of(1, 1), class_names=VAR_CLASSES, model_name="tiny-var",
                       card=VAR_CARD)
