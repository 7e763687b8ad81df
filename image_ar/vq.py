"""A VQ image tokenizer in the layout of LlamaGen's VQ-16 (`tokenizer/tokenizer_image/vq_model.py`, MIT).

Parameter names follow the official checkpoint (`vq_ds16_c2i.pt`), so its state dict loads:

    encoder.conv_in, encoder.conv_blocks.{i}.res.{j}.{norm1,conv1,norm2,conv2,nin_shortcut},
    encoder.conv_blocks.{i}.attn.{j}.{norm,q,k,v,proj_out}, encoder.conv_blocks.{i}.downsample.conv,
    encoder.mid.{0,1,2}, encoder.norm_out, encoder.conv_out, quant_conv,
    quantize.embedding.weight [codebook_size, codebook_embed_dim], post_quant_conv,
    decoder.conv_in, decoder.mid.{0,1,2}, decoder.conv_blocks.{i}.res/attn/upsample.conv,
    decoder.norm_out, decoder.conv_out
(`quantize.codebook_used`, a training statistic in the official checkpoints, is ignored.)

Official VQ-16: ch 128, ch_mult (1, 1, 2, 2, 4), 2 res blocks, z 256, codebook 16384 x 8,
l2-normalised codes, GroupNorm with 32 groups. `norm_groups` and `ch` can be lowered for tiny models.
Images are float tensors [B, 3, H, W] in [-1, 1]; codes are [B, H / f, W / f] with f = 2^(levels - 1).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers import initialization as init

from mmspec.errors import MMSpecError


class VQConfig(PretrainedConfig):
    model_type = "mmspec_llamagen_vq"

    def __init__(
        self,
        codebook_size: int = 16384,
        codebook_embed_dim: int = 8,
        codebook_l2_norm: bool = True,
        encoder_ch_mult: Sequence[int] = (1, 1, 2, 2, 4),
        decoder_ch_mult: Sequence[int] = (1, 1, 2, 2, 4),
        z_channels: int = 256,
        ch: int = 128,
        num_res_blocks: int = 2,
        norm_groups: int = 32,
        in_channels: int = 3,
        **kwargs: Any,
    ) -> None:
        self.codebook_size = codebook_size
        self.codebook_embed_dim = codebook_embed_dim
        self.codebook_l2_norm = codebook_l2_norm
        self.encoder_ch_mult = list(encoder_ch_mult)
        self.decoder_ch_mult = list(decoder_ch_mult)
        self.z_channels = z_channels
        self.ch = ch
        self.num_res_blocks = num_res_blocks
        self.norm_groups = norm_groups
        self.in_channels = in_channels
        super().__init__(**kwargs)

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.encoder_ch_mult) - 1)


def swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_ch, eps=1e-6)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, out_ch, eps=1e-6)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    def __init__(self, ch: int, groups: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, ch, eps=1e-6)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(ch, ch, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        n = self.norm(x)
        q, k, v = (m(n).reshape(b, c, h * w).transpose(1, 2) for m in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, h, w))


class Downsample(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Encoder(nn.Module):
    def __init__(self, c: VQConfig) -> None:
        super().__init__()
        mult, g = c.encoder_ch_mult, c.norm_groups
        self.conv_in = nn.Conv2d(c.in_channels, c.ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        block_in = c.ch
        for level, m in enumerate(mult):
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(c.num_res_blocks):
                block.res.append(ResnetBlock(block_in, c.ch * m, g))
                block_in = c.ch * m
                if level == len(mult) - 1:
                    block.attn.append(AttnBlock(block_in, g))
            if level != len(mult) - 1:
                block.downsample = Downsample(block_in)
            self.conv_blocks.append(block)
        self.mid = nn.ModuleList([ResnetBlock(block_in, block_in, g), AttnBlock(block_in, g), ResnetBlock(block_in, block_in, g)])
        self.norm_out = nn.GroupNorm(g, block_in, eps=1e-6)
        self.conv_out = nn.Conv2d(block_in, c.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = run_blocks(self.conv_blocks, self.conv_in(x), "downsample")
        for m in self.mid:
            h = m(h)
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, c: VQConfig) -> None:
        super().__init__()
        mult, g = c.decoder_ch_mult, c.norm_groups
        block_in = c.ch * mult[-1]
        self.conv_in = nn.Conv2d(c.z_channels, block_in, 3, padding=1)
        self.mid = nn.ModuleList([ResnetBlock(block_in, block_in, g), AttnBlock(block_in, g), ResnetBlock(block_in, block_in, g)])
        self.conv_blocks = nn.ModuleList()
        for level in reversed(range(len(mult))):
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(c.num_res_blocks + 1):
                block.res.append(ResnetBlock(block_in, c.ch * mult[level], g))
                block_in = c.ch * mult[level]
                if level == len(mult) - 1:
                    block.attn.append(AttnBlock(block_in, g))
            if level != 0:
                block.upsample = Upsample(block_in)
            self.conv_blocks.append(block)
        self.norm_out = nn.GroupNorm(g, block_in, eps=1e-6)
        self.conv_out = nn.Conv2d(block_in, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for m in self.mid:
            h = m(h)
        h = run_blocks(self.conv_blocks, h, "upsample")
        return self.conv_out(swish(self.norm_out(h)))


def run_blocks(blocks: Iterable[nn.Module], h: torch.Tensor, resample: str, resnets: str = "res") -> torch.Tensor:
    """Each level: its resnet blocks (the level's `resnets` list, each followed by its attention block
    where the level has them), then its `resample` ("downsample" / "upsample") module, where it has one.
    The level layout of LlamaGen's VQ (`res`) and of VAR's VQ-VAE (`block`)."""
    for block in blocks:
        for i, res in enumerate(getattr(block, resnets)):
            h = res(h)
            if len(block.attn):
                h = block.attn[i](h)
        if hasattr(block, resample):
            h = getattr(block, resample)(h)
    return h


class VectorQuantizer(nn.Module):
    def __init__(self, c: VQConfig) -> None:
        super().__init__()
        self.l2_norm = c.codebook_l2_norm
        self.embedding = nn.Embedding(c.codebook_size, c.codebook_embed_dim)

    def codebook(self) -> torch.Tensor:
        w = self.embedding.weight
        return F.normalize(w, p=2, dim=-1) if self.l2_norm else w

    def lookup(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.LongTensor]:
        """z [B, C, h, w] -> (quantised z [B, C, h, w], codes [B, h, w]) by nearest code (L2)."""
        flat = z.permute(0, 2, 3, 1)
        if self.l2_norm:
            flat = F.normalize(flat, p=2, dim=-1)
        book = self.codebook()
        dist = (flat * flat).sum(-1, keepdim=True) + (book * book).sum(-1) - 2 * flat @ book.T
        codes = dist.argmin(-1)
        quant = book[codes]
        quant = flat + (quant - flat).detach()  # straight-through gradient for training
        return quant.permute(0, 3, 1, 2), codes


class VQModel(PreTrainedModel):
    """encode(images) -> codes [B, h, w]; decode(codes) -> images; codebook_embeddings() -> [V, D]."""

    config_class = VQConfig
    base_model_prefix = ""
    main_input_name = "pixel_values"
    _keys_to_ignore_on_load_unexpected = [r"quantize\.codebook_used"]

    def __init__(self, config: VQConfig) -> None:
        if config.norm_groups < 1 or config.ch % config.norm_groups:
            raise MMSpecError(f"ch {config.ch} must be a multiple of norm_groups {config.norm_groups}")
        super().__init__(config)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Embedding):
            n = module.weight.shape[0]
            init.uniform_(module.weight, -1.0 / n, 1.0 / n)

    def codebook_embeddings(self) -> torch.Tensor:
        """The code vectors the decoder sees [V, D] (l2-normalised when the codebook is): use for latent distances."""
        return self.quantize.codebook().detach()

    def encode_latents(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.LongTensor]:
        return self.quantize.lookup(self.quant_conv(self.encoder(images)))

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.LongTensor:
        """Images [B, 3, H, W] in [-1, 1] (H, W multiples of the downsample factor) -> codes [B, h, w]."""
        f = self.config.downsample_factor
        if images.dim() != 4 or images.shape[1] != self.config.in_channels or images.shape[-1] % f or images.shape[-2] % f:
            raise MMSpecError(
                f"expected images [B, {self.config.in_channels}, H, W] with H and W multiples of {f}, got {tuple(images.shape)}"
            )
        return self.encode_latents(images)[1]

    def decode_latents(self, quant: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(quant))

    @torch.no_grad()
    def decode(self, codes: torch.LongTensor) -> torch.Tensor:
        """Codes [B, h, w] -> images [B, 3, h f, w f] (roughly in [-1, 1])."""
        if codes.dim() != 3:
            raise MMSpecError(f"expected codes [B, h, w], got {tuple(codes.shape)}")
        if int(codes.min()) < 0 or int(codes.max()) >= self.config.codebook_size:
            raise MMSpecError(f"codes must be in [0, {self.config.codebook_size})")
        return self.decode_latents(self.quantize.codebook()[codes].permute(0, 3, 1, 2))

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.LongTensor]:
        """Training path: (reconstruction, latent before quantisation [B, D, h, w] l2-normalised if so, codes)."""
        z = self.quant_conv(self.encoder(pixel_values))
        quant, codes = self.quantize.lookup(z)
        return self.decode_latents(quant), z, codes


def tiny_vq(codebook_size: int = 12, embed_dim: int = 4, levels: int = 3, ch: int = 8, seed: int = 0) -> VQModel:
    """A random VQ tokenizer for tests: downsample factor 2^(levels - 1)."""
    torch.manual_seed(seed)
    config = VQConfig(
        codebook_size=codebook_size,
        codebook_embed_dim=embed_dim,
        encoder_ch_mult=[1] * (levels - 1) + [2],
        decoder_ch_mult=[1] * (levels - 1) + [2],
        z_channels=8,
        ch=ch,
        num_res_blocks=1,
        norm_groups=4,
    )
    return VQModel(config).eval()
