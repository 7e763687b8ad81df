"""The multi-scale residual VQ-VAE of VAR (FoundationVision/VAR `models/vqvae.py`, `quant.py`,
`basic_vae.py`, MIT), written anew with the official parameter names so `vae_ch160v4096z32.pth` loads:

    encoder.conv_in, encoder.down.{i}.block.{j}.{norm1,conv1,norm2,conv2,nin_shortcut},
    encoder.down.{last}.attn.{j}.{norm,qkv,proj_out}, encoder.down.{i}.downsample.conv,
    encoder.mid.{block_1,attn_1,block_2}, encoder.norm_out, encoder.conv_out,
    decoder.conv_in, decoder.mid.*, decoder.up.{i}.block.{j}.*, decoder.up.{last}.attn.{j}.*,
    decoder.up.{i}.upsample.conv, decoder.norm_out, decoder.conv_out,
    quant_conv, post_quant_conv, quantize.embedding, quantize.ema_vocab_hit_SV,
    quantize.quant_resi.qresi_ls.{k}   (the K = 4 partially shared phi convolutions)

An image becomes one token map per scale of `v_patch_nums` (1, 2, 3, 4, 5, 6, 8, 10, 13, 16 officially):
scale s quantises what the earlier scales left of the latent, at pn_s x pn_s; its codes, upsampled to the
last scale and passed through phi, are added to `f_hat`, the running sum the decoder finally sees.
Images are [B, 3, H, W] in [-1, 1]. `ch_mult` and `norm_groups` can be lowered for tiny models
(official: ch_mult (1, 1, 2, 2, 4), GroupNorm with 32 groups).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from mmspec.errors import MMSpecError

from .vq import Downsample, Upsample, run_blocks  # LlamaGen's VQ has the same resamplers and level loop


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=groups, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, groups: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = _norm(in_channels, groups)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, 1, 1)
        self.norm2 = _norm(out_channels, groups)
        self.dropout = nn.Dropout(dropout) if dropout > 1e-6 else nn.Identity()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1)
        self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return self.nin_shortcut(x) + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with one fused qkv 1x1 convolution (the official layout)."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.norm = _norm(channels, groups)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(B, 3, C, H * W).unbind(1)
        weights = (q.transpose(1, 2) @ k).mul(C ** -0.5).softmax(dim=2)  # [B, HW(query), HW(key)]
        h = (v @ weights.transpose(1, 2)).view(B, C, H, W)
        return x + self.proj_out(h)


def _attn(channels: int, groups: int, used: bool) -> nn.Module:
    return AttnBlock(channels, groups) if used else nn.Identity()


def _mid(channels: int, groups: int, dropout: float, using_mid_sa: bool) -> nn.Module:
    mid = nn.Module()
    mid.block_1 = ResnetBlock(channels, channels, groups, dropout)
    mid.attn_1 = _attn(channels, groups, using_mid_sa)
    mid.block_2 = ResnetBlock(channels, channels, groups, dropout)
    return mid


def _level(block_in: int, block_out: int, num_blocks: int, groups: int, dropout: float,
           attention: bool) -> tuple[nn.Module, int]:
    """One resolution level (official names: `block`, `attn`): resnet blocks, each followed by an
    attention block on the level that has them; returns it and its output width."""
    level = nn.Module()
    level.block, level.attn = nn.ModuleList(), nn.ModuleList()
    for _ in range(num_blocks):
        level.block.append(ResnetBlock(block_in, block_out, groups, dropout))
        block_in = block_out
        if attention:
            level.attn.append(AttnBlock(block_in, groups))
    return level, block_in


class Encoder(nn.Module):
    def __init__(self, ch: int, ch_mult: Sequence[int], num_res_blocks: int, z_channels: int, groups: int,
                 dropout: float = 0.0, in_channels: int = 3, using_sa: bool = True, using_mid_sa: bool = True) -> None:
        super().__init__()
        self.num_res_blocks = num_res_blocks
        levels = len(ch_mult)
        self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1)
        in_mult = (1, *ch_mult)
        self.down = nn.ModuleList()
        block_in = ch
        for level in range(levels):
            down, block_in = _level(ch * in_mult[level], ch * ch_mult[level], num_res_blocks, groups, dropout,
                                    attention=level == levels - 1 and using_sa)
            if level != levels - 1:
                down.downsample = Downsample(block_in)
            self.down.append(down)
        self.mid = _mid(block_in, groups, dropout, using_mid_sa)
        self.norm_out = _norm(block_in, groups)
        self.conv_out = nn.Conv2d(block_in, z_channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = run_blocks(self.down, self.conv_in(x), "downsample", resnets="block")
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, ch: int, ch_mult: Sequence[int], num_res_blocks: int, z_channels: int, groups: int,
                 dropout: float = 0.0, in_channels: int = 3, using_sa: bool = True, using_mid_sa: bool = True) -> None:
        super().__init__()
        levels = len(ch_mult)
        block_in = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, 1, 1)
        self.mid = _mid(block_in, groups, dropout, using_mid_sa)
        ups: list[nn.Module] = []
        for level in reversed(range(levels)):
            up, block_in = _level(block_in, ch * ch_mult[level], num_res_blocks + 1, groups, dropout,
                                  attention=level == levels - 1 and using_sa)
            if level != 0:
                up.upsample = Upsample(block_in)
            ups.insert(0, up)
        self.up = nn.ModuleList(ups)
        self.norm_out = _norm(block_in, groups)
        self.conv_out = nn.Conv2d(block_in, in_channels, 3, 1, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(self.conv_in(z))))
        h = run_blocks(reversed(self.up), h, "upsample", resnets="block")
        return self.conv_out(F.silu(self.norm_out(h)))


class Phi(nn.Conv2d):
    """phi: a 3x3 convolution blended with its input, h (1 - r) + conv(h) r (r = `quant_resi`, 0.5)."""

    def __init__(self, channels: int, quant_resi: float) -> None:
        super().__init__(channels, channels, 3, stride=1, padding=1)
        self.resi_ratio = abs(quant_resi)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.mul(1 - self.resi_ratio) + super().forward(h).mul(self.resi_ratio)


class PhiPartiallyShared(nn.Module):
    """K phi convolutions shared over the scales: scale s of S uses the one whose tick is nearest s / (S - 1)."""

    def __init__(self, qresi_ls: nn.ModuleList) -> None:
        super().__init__()
        self.qresi_ls = qresi_ls
        K = len(qresi_ls)
        # The official ticks (K = 4 is spaced by 1 / 3K at the ends, other K by 1 / 2K).
        self.ticks = np.linspace(1 / 3 / K, 1 - 1 / 3 / K, K) if K == 4 else np.linspace(1 / 2 / K, 1 - 1 / 2 / K, K)

    def __getitem__(self, at_from_0_to_1: float) -> Phi:
        return self.qresi_ls[int(np.argmin(np.abs(self.ticks - at_from_0_to_1)))]


class VectorQuantizer2(nn.Module):
    def __init__(self, vocab_size: int, Cvae: int, v_patch_nums: Sequence[int], quant_resi: float = 0.5,
                 share_quant_resi: int = 4, using_znorm: bool = False) -> None:
        super().__init__()
        self.vocab_size, self.Cvae, self.using_znorm = vocab_size, Cvae, using_znorm
        self.v_patch_nums = tuple(v_patch_nums)
        self.quant_resi = PhiPartiallyShared(nn.ModuleList([Phi(Cvae, quant_resi) for _ in range(share_quant_resi)]))
        self.embedding = nn.Embedding(vocab_size, Cvae)
        # A training statistic of the official checkpoints (codebook hits per scale); kept so they load.
        self.register_buffer("ema_vocab_hit_SV", self.embedding.weight.new_zeros(len(self.v_patch_nums), vocab_size))

    def phi(self, si: int) -> Phi:
        return self.quant_resi[si / (len(self.v_patch_nums) - 1)]

    def codes_to_fhat_step(self, si: int, idx_Bl: torch.Tensor) -> torch.Tensor:
        """The contribution of scale `si`'s codes [B, pn^2] to f_hat: upsampled to the last scale, through phi."""
        B, pn, last = idx_Bl.shape[0], self.v_patch_nums[si], self.v_patch_nums[-1]
        h = self.embedding(idx_Bl).transpose(1, 2).reshape(B, self.Cvae, pn, pn)
        if pn != last:
            h = F.interpolate(h, size=(last, last), mode="bicubic")
        return self.phi(si)(h)

    def next_scale_input(self, si: int, f_hat: torch.Tensor) -> torch.Tensor:
        """The input map of scale si + 1, [B, pn_{si+1}^2, Cvae]: f_hat area-downsampled to that scale."""
        pn = self.v_patch_nums[si + 1]
        return F.interpolate(f_hat, size=(pn, pn), mode="area").flatten(2).transpose(1, 2)

    def idxBl_to_var_input(self, gt_ms_idx_Bl: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """Teacher-forcing input of scales 1.. from the token maps of scales 0..: [B, L - first_l, Cvae]."""
        B, last = gt_ms_idx_Bl[0].shape[0], self.v_patch_nums[-1]
        f_hat = self.embedding.weight.new_zeros(B, self.Cvae, last, last)
        inputs = []
        for si in range(min(len(gt_ms_idx_Bl), len(self.v_patch_nums) - 1)):
            f_hat = f_hat + self.codes_to_fhat_step(si, gt_ms_idx_Bl[si])
            inputs.append(self.next_scale_input(si, f_hat))
        return torch.cat(inputs, dim=1) if inputs else None

    def idxBl_to_fhat(self, ms_idx_Bl: Sequence[torch.Tensor]) -> torch.Tensor:
        B, last = ms_idx_Bl[0].shape[0], self.v_patch_nums[-1]
        f_hat = self.embedding.weight.new_zeros(B, self.Cvae, last, last)
        for si, idx in enumerate(ms_idx_Bl):
            f_hat = f_hat + self.codes_to_fhat_step(si, idx)
        return f_hat

    def forward(self, f: torch.Tensor, beta: float = 0.25) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Training quantisation: (f_hat with a straight-through gradient to f, the VQ loss, the codes).

        As the official: the loss averages over scales beta ||sg(f_hat_s) - f||^2 (commitment, to the
        encoder) + ||f_hat_s - sg(f)||^2 (to the codebook and phi), f_hat_s the sum after scale s.
        """
        f = f.float()
        f_no_grad = f.detach()
        codes = self.f_to_idxBl(f_no_grad)
        f_hat, loss = torch.zeros_like(f_no_grad), f.new_zeros(())
        for si, idx in enumerate(codes):
            f_hat = f_hat + self.codes_to_fhat_step(si, idx)
            loss = loss + beta * F.mse_loss(f_hat.detach(), f) + F.mse_loss(f_hat, f_no_grad)
        return (f_hat.detach() - f_no_grad) + f, loss / len(codes), codes

    def f_to_idxBl(self, f: torch.Tensor) -> list[torch.Tensor]:
        """Residual quantisation of a latent [B, Cvae, last, last] into one code map [B, pn^2] per scale."""
        B, C, H, W = f.shape
        if H != self.v_patch_nums[-1] or W != H:
            raise MMSpecError(f"the latent is {H}x{W}, the last scale is {self.v_patch_nums[-1]}")
        f_rest, codes = f.detach().clone(), []
        book = self.embedding.weight
        for si, pn in enumerate(self.v_patch_nums):
            z = f_rest if pn == H else F.interpolate(f_rest, size=(pn, pn), mode="area")
            z = z.permute(0, 2, 3, 1).reshape(-1, C)
            if self.using_znorm:
                idx = (F.normalize(z, dim=1) @ F.normalize(book, dim=1).T).argmax(dim=1)
            else:
                idx = torch.cdist(z, book).argmin(dim=1)
            idx = idx.view(B, pn * pn)
            f_rest = f_rest - self.codes_to_fhat_step(si, idx)
            codes.append(idx)
        return codes


class VQVAE(ModelMixin, ConfigMixin):
    """VAR's VQ-VAE; `Cvae` = z_channels, `downsample` = 2^(len(ch_mult) - 1); images are pn_last x downsample wide."""

    @register_to_config
    def __init__(self, vocab_size: int = 4096, z_channels: int = 32, ch: int = 160, dropout: float = 0.0,
                 quant_conv_ks: int = 3, quant_resi: float = 0.5, share_quant_resi: int = 4, using_znorm: bool = False,
                 v_patch_nums: Sequence[int] = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16),
                 ch_mult: Sequence[int] = (1, 1, 2, 2, 4), num_res_blocks: int = 2, norm_groups: int = 32) -> None:
        super().__init__()
        if share_quant_resi < 2:
            raise MMSpecError("only the partially shared phi (share_quant_resi >= 2, officially 4) is supported")
        layout = {"ch": ch, "ch_mult": tuple(ch_mult), "num_res_blocks": num_res_blocks, "z_channels": z_channels,
                      "groups": norm_groups, "dropout": dropout}
        self.encoder = Encoder(**layout)
        self.decoder = Decoder(**layout)
        self.vocab_size, self.Cvae = vocab_size, z_channels
        self.v_patch_nums = tuple(v_patch_nums)
        self.downsample = 2 ** (len(ch_mult) - 1)
        self.quantize = VectorQuantizer2(vocab_size, z_channels, self.v_patch_nums, quant_resi, share_quant_resi,
                                         using_znorm)
        self.quant_conv = nn.Conv2d(z_channels, z_channels, quant_conv_ks, padding=quant_conv_ks // 2)
        self.post_quant_conv = nn.Conv2d(z_channels, z_channels, quant_conv_ks, padding=quant_conv_ks // 2)

    @property
    def image_size(self) -> int:
        return self.v_patch_nums[-1] * self.downsample

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training pass: (the reconstruction in [-1, 1] scale, unclamped; the VQ loss)."""
        self._check_size(images)
        f_hat, vq_loss, _ = self.quantize(self.quant_conv(self.encoder(images)))
        return self.decoder(self.post_quant_conv(f_hat.to(images.dtype))), vq_loss

    def _check_size(self, images: torch.Tensor) -> None:
        if images.shape[-1] != self.image_size or images.shape[-2] != self.image_size:
            raise MMSpecError(f"images must be {self.image_size}x{self.image_size}, got {tuple(images.shape[-2:])}")

    def img_to_idxBl(self, images: torch.Tensor) -> list[torch.Tensor]:
        self._check_size(images)
        return self.quantize.f_to_idxBl(self.quant_conv(self.encoder(images)))

    def fhat_to_img(self, f_hat: torch.Tensor) -> torch.Tensor:
        """The image in [-1, 1] of an accumulated f_hat [B, Cvae, last, last]."""
        # channels-last convolutions decode about a quarter faster on a CPU (oneDNN's preferred layout)
        f_hat = f_hat.contiguous(memory_format=torch.channels_last)
        return self.decoder(self.post_quant_conv(f_hat)).clamp(-1, 1)

    def idxBl_to_img(self, ms_idx_Bl: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.fhat_to_img(self.quantize.idxBl_to_fhat(ms_idx_Bl))


def tiny_var_vq(vocab_size: int = 16, z_channels: int = 8, patch_nums: Sequence[int] = (1, 2, 3, 4),
                seed: int = 0) -> VQVAE:
    """A random VQ-VAE with 2x downsampling (8x8 images at patch_nums ending in 4), for tests."""
    torch.manual_seed(seed)
    return VQVAE(vocab_size=vocab_size, z_channels=z_channels, ch=16, v_patch_nums=tuple(patch_nums),
                 ch_mult=(1, 2), num_res_blocks=1, norm_groups=4).eval()
