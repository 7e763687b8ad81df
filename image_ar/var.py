"""VAR: class-conditional next-scale prediction (Tian et al. 2024; FoundationVision/VAR `models/var.py`,
`basic_var.py`, MIT), written anew with the official parameter names so `var_d{16,20,24,30}.pth` load:

    word_embed, class_emb [num_classes + 1, C] (the last row is the unconditional class), pos_start,
    pos_1LC, lvl_embed, lvl_1L and attn_bias_for_masking (buffers), shared_ada_lin.1 (when shared),
    blocks.{i}.attn.{mat_qkv, q_bias, v_bias, zero_k_bias, scale_mul_1H11, proj},
    blocks.{i}.ffn.{fc1, fc2}, blocks.{i}.ada_lin.1 (or ada_gss when shared), head_nm.ada_lin.1, head

A sequence is the concatenation of the scales' token maps (1x1, 2x2, ..., 16x16 officially); every
position of scale s sees all positions of scales <= s (block-causal). Generation runs one forward per
scale with a key/value cache; `run_scales` runs any range of scales from a `VARState`, prefilling its
own cache in one block-causal pass when the state's earlier scales came from another model (CoDe).
Official builds: embed_dim = 64 depth, num_heads = depth, attn_l2_norm, mlp_ratio 4, norm_eps 1e-6.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from mmspec.errors import MMSpecError
from mmspec.sampling import SamplingConfig, randint, sample_warped_rows

from .var_vq import VQVAE


class SelfAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, attn_l2_norm: bool) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise MMSpecError(f"embed_dim {embed_dim} is not a multiple of num_heads {num_heads}")
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.attn_l2_norm = attn_l2_norm
        self.mat_qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=False)
        self.q_bias = nn.Parameter(self.mat_qkv.weight.new_zeros(embed_dim))
        self.v_bias = nn.Parameter(self.mat_qkv.weight.new_zeros(embed_dim))
        self.register_buffer("zero_k_bias", self.mat_qkv.weight.new_zeros(embed_dim))
        if attn_l2_norm:  # cosine attention with a learnt per-head scale (log 4 at init, capped at log 100)
            self.scale = 1.0
            self.scale_mul_1H11 = nn.Parameter(self.mat_qkv.weight.new_full((1, num_heads, 1, 1), 4.0).log())
            self.max_scale_mul = math.log(100)
        else:
            self.scale = 0.25 / math.sqrt(self.head_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None, cache: list | None) -> torch.Tensor:
        """x [B, l, C]; `cache` a [k, v] pair (or []) extended in place with this call's keys and values."""
        B, L, C = x.shape
        bias = torch.cat((self.q_bias, self.zero_k_bias, self.v_bias))
        qkv = F.linear(x, self.mat_qkv.weight, bias).view(B, L, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, L, c]
        if self.attn_l2_norm:
            q = F.normalize(q, dim=-1).mul(self.scale_mul_1H11.clamp_max(self.max_scale_mul).exp())
            k = F.normalize(k, dim=-1)
        if cache is not None:
            if cache:
                k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
            cache[:] = [k, v]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, scale=self.scale)
        out = out.transpose(1, 2).reshape(B, L, C)
        return self.proj(out)


class FFN(nn.Module):
    def __init__(self, embed_dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden)
        self.fc2 = nn.Linear(hidden, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class AdaLNSelfAttn(nn.Module):
    """Pre-norm attention + MLP whose LayerNorm scale/shift and residual gates come from the class condition."""

    def __init__(self, embed_dim: int, cond_dim: int, num_heads: int, mlp_ratio: float, norm_eps: float,
                 shared_aln: bool, attn_l2_norm: bool) -> None:
        super().__init__()
        self.C = embed_dim
        self.attn = SelfAttention(embed_dim, num_heads, attn_l2_norm)
        self.ffn = FFN(embed_dim, round(embed_dim * mlp_ratio))
        self.ln_wo_grad = nn.LayerNorm(embed_dim, eps=norm_eps, elementwise_affine=False)
        self.shared_aln = shared_aln
        if shared_aln:
            self.ada_gss = nn.Parameter(self.attn.mat_qkv.weight.new_zeros(1, 1, 6, embed_dim))
        else:
            self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(cond_dim, 6 * embed_dim))

    def forward(self, x: torch.Tensor, cond: torch.Tensor, attn_bias: torch.Tensor | None,
                cache: list | None) -> torch.Tensor:
        if self.shared_aln:  # cond is already the shared [B, 1, 6, C] projection
            gamma1, gamma2, scale1, scale2, shift1, shift2 = (self.ada_gss + cond).unbind(2)
        else:
            gamma1, gamma2, scale1, scale2, shift1, shift2 = self.ada_lin(cond).view(-1, 1, 6, self.C).unbind(2)
        x = x + self.attn(self.ln_wo_grad(x) * (scale1 + 1) + shift1, attn_bias, cache) * gamma1
        return x + self.ffn(self.ln_wo_grad(x) * (scale2 + 1) + shift2) * gamma2


class SharedAdaLin(nn.Linear):
    def forward(self, cond: torch.Tensor) -> torch.Tensor:
        return super().forward(cond).view(-1, 1, 6, self.weight.shape[0] // 6)


class AdaLNBeforeHead(nn.Module):
    def __init__(self, C: int, D: int, norm_eps: float) -> None:
        super().__init__()
        self.C = C
        self.ln_wo_grad = nn.LayerNorm(C, eps=norm_eps, elementwise_affine=False)
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(D, 2 * C))

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.ada_lin(cond).view(-1, 1, 2, self.C).unbind(2)
        return self.ln_wo_grad(x) * (scale + 1) + shift


@dataclass
class VARState:
    """A generation in progress: the scales done so far, shared by every model that continues it.

    `f_hat` is the VQ-VAE's running sum; `inputs` the next-scale input maps [B, pn^2, Cvae] of scales
    1..done (the drafter's "token hub" in CoDe); `cache` belongs to `cache_owner` only.
    """

    labels: torch.Tensor
    f_hat: torch.Tensor
    token_maps: list[torch.Tensor] = field(default_factory=list)
    inputs: list[torch.Tensor] = field(default_factory=list)
    cache: list[list] | None = None
    cache_owner: nn.Module | None = None
    forwards: dict[str, int] = field(default_factory=dict)
    scales_by: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> int:
        return len(self.token_maps)


@dataclass(frozen=True)
class VARSampling:
    """CFG and sampling of VAR: guidance ramps linearly from 0 at the first scale to `cfg` at the last.

    `top_k` 0 / `top_p` 0 mean no filter (the official convention); `temperature` is one value or one per
    scale (CoDe's sampler uses [1.1] * 7 + [1.0] * 3); `do_sample` False takes the argmax.
    """

    cfg: float = 1.5
    top_k: int = 0
    top_p: float = 0.0
    temperature: float | Sequence[float] = 1.0
    do_sample: bool = True

    def at(self, si: int) -> SamplingConfig:
        t = self.temperature if isinstance(self.temperature, (int, float)) else self.temperature[si]
        return SamplingConfig(do_sample=self.do_sample, temperature=float(t), top_k=self.top_k or None,
                              top_p=self.top_p or None)


class VAR(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, vocab_size: int = 4096, Cvae: int = 32, num_classes: int = 1000, depth: int = 16,
                 embed_dim: int = 1024, num_heads: int = 16, mlp_ratio: float = 4.0, norm_eps: float = 1e-6,
                 shared_aln: bool = False, attn_l2_norm: bool = True,
                 patch_nums: Sequence[int] = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)) -> None:
        super().__init__()
        self.V, self.Cvae, self.C, self.D = vocab_size, Cvae, embed_dim, embed_dim
        self.num_classes, self.depth = num_classes, depth
        self.patch_nums = tuple(patch_nums)
        self.L = sum(pn * pn for pn in self.patch_nums)
        self.first_l = self.patch_nums[0] ** 2
        ends = itertools.accumulate(pn * pn for pn in self.patch_nums)
        self.begin_ends = [(end - pn * pn, end) for end, pn in zip(ends, self.patch_nums, strict=True)]
        self.num_stages_minus_1 = len(self.patch_nums) - 1

        init_std = math.sqrt(1 / embed_dim / 3)
        self.word_embed = nn.Linear(Cvae, embed_dim)
        self.class_emb = nn.Embedding(num_classes + 1, embed_dim)
        self.pos_start = nn.Parameter(self.class_emb.weight.new_empty(1, self.first_l, embed_dim))
        self.pos_1LC = nn.Parameter(self.class_emb.weight.new_empty(1, self.L, embed_dim))
        self.lvl_embed = nn.Embedding(len(self.patch_nums), embed_dim)
        for weight in (self.class_emb.weight, self.pos_start, self.pos_1LC, self.lvl_embed.weight):
            nn.init.trunc_normal_(weight.data, mean=0, std=init_std)
        self.shared_ada_lin = (nn.Sequential(nn.SiLU(), SharedAdaLin(embed_dim, 6 * embed_dim)) if shared_aln
                               else nn.Identity())
        self.blocks = nn.ModuleList(AdaLNSelfAttn(embed_dim, embed_dim, num_heads, mlp_ratio, norm_eps, shared_aln,
                                                  attn_l2_norm) for _ in range(depth))
        if shared_aln:
            for block in self.blocks:
                nn.init.normal_(block.ada_gss.data, std=embed_dim ** -0.5)
        scale_of = torch.cat([torch.full((pn * pn,), si, device=self.class_emb.weight.device)
                              for si, pn in enumerate(self.patch_nums)])
        self.register_buffer("lvl_1L", scale_of.view(1, self.L))
        # Block-causal: position i sees position j iff scale(j) <= scale(i).
        visible = scale_of.view(self.L, 1) >= scale_of.view(1, self.L)
        zeros = self.class_emb.weight.new_zeros(self.L, self.L)
        self.register_buffer("attn_bias_for_masking",
                             zeros.masked_fill(~visible, float("-inf")).view(1, 1, self.L, self.L))
        self.head_nm = AdaLNBeforeHead(embed_dim, embed_dim, norm_eps)
        self.head = nn.Linear(embed_dim, vocab_size)

    def init_weights(self, init_adaln: float = 0.5, init_adaln_gamma: float = 1e-5, init_head: float = 0.02,
                     init_std: float = -1.0) -> VAR:
        """The official training init (`build_vae_var`): truncated normals, a small head, near-zero residual gates.

        `init_std` < 0 means sqrt(1 / 3C). The gates (gamma1, gamma2: the first 2C rows of each block's
        ada_lin) start at `init_adaln_gamma` times the init, so every block begins close to the identity.
        """
        std = math.sqrt(1 / self.C / 3) if init_std < 0 else init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(module.weight.data, std=std)
                if getattr(module, "bias", None) is not None:
                    module.bias.data.zero_()
        self.head.weight.data.mul_(init_head)
        self.head_nm.ada_lin[-1].weight.data.mul_(init_adaln)
        self.head_nm.ada_lin[-1].bias.data.zero_()
        for block in self.blocks:
            block.attn.proj.weight.data.div_(math.sqrt(2 * self.depth))
            block.ffn.fc2.weight.data.div_(math.sqrt(2 * self.depth))
            if block.shared_aln:
                block.ada_gss.data[:, :, 2:].mul_(init_adaln)
                block.ada_gss.data[:, :, :2].mul_(init_adaln_gamma)
            else:
                block.ada_lin[-1].weight.data[2 * self.C:].mul_(init_adaln)
                block.ada_lin[-1].weight.data[: 2 * self.C].mul_(init_adaln_gamma)
                block.ada_lin[-1].bias.data.zero_()
        return self

    # ---- the network ------------------------------------------------------------------------------

    def embed(self, labels: torch.Tensor, inputs_BlCv: torch.Tensor | None, start: int, stop: int) -> torch.Tensor:
        """Input embeddings of scales [start, stop): scale 0 is the class token; scales >= 1 the input maps."""
        B = labels.shape[0]
        begin, end = self.begin_ends[start][0], self.begin_ends[stop - 1][1]
        parts = []
        if start == 0:
            sos = self.class_emb(labels).unsqueeze(1).expand(B, self.first_l, -1)
            parts.append(sos + self.pos_start.expand(B, -1, -1))
        if stop > max(start, 1):
            parts.append(self.word_embed(inputs_BlCv.to(self.dtype)))
        x = torch.cat(parts, dim=1)
        return x + self.lvl_embed(self.lvl_1L[:, begin:end]) + self.pos_1LC[:, begin:end]

    def transformer(self, x: torch.Tensor, labels: torch.Tensor, attn_bias: torch.Tensor | None,
                    cache: list[list] | None, logits_from: int = 0) -> torch.Tensor:
        """Logits [B, l - logits_from, V] (float32) of embedded positions x [B, l, C] under the class condition."""
        cond = self.class_emb(labels)
        cond_or_gss = self.shared_ada_lin(cond)
        for i, block in enumerate(self.blocks):
            x = block(x, cond_or_gss, attn_bias, None if cache is None else cache[i])
        return self.head(self.head_nm(x[:, logits_from:], cond)).float()

    def forward(self, label_B: torch.Tensor, x_BLCv_wo_first_l: torch.Tensor | None) -> torch.Tensor:
        """Teacher forcing over all scales: logits [B, L, V]. (Class dropout for training is the caller's.)"""
        stop = 1 if x_BLCv_wo_first_l is None else len(self.patch_nums)
        x = self.embed(label_B, x_BLCv_wo_first_l, 0, stop)
        end = x.shape[1]
        return self.transformer(x, label_B, self.attn_bias_for_masking[:, :, :end, :end], None)

    # ---- generation -------------------------------------------------------------------------------

    def check_vq(self, vq: VQVAE) -> None:
        if (vq.vocab_size, vq.Cvae, vq.v_patch_nums) != (self.V, self.Cvae, self.patch_nums):
            raise MMSpecError(f"the VQ-VAE (vocab {vq.vocab_size}, Cvae {vq.Cvae}, patch_nums {vq.v_patch_nums}) "
                              f"does not match the VAR (vocab {self.V}, Cvae {self.Cvae}, patch_nums {self.patch_nums})")

    def begin(self, labels: torch.Tensor | Sequence[int]) -> VARState:
        labels = torch.as_tensor(labels, device=self.device).long().view(-1)
        if labels.numel() == 0 or int(labels.min()) < 0 or int(labels.max()) >= self.num_classes:
            raise MMSpecError(f"class labels must be in 0..{self.num_classes - 1}, got {labels.tolist()}")
        last = self.patch_nums[-1]
        return VARState(labels=labels, f_hat=self.pos_1LC.new_zeros(labels.shape[0], self.Cvae, last, last).float())

    def _cfg_labels(self, state: VARState) -> torch.Tensor:
        return torch.cat((state.labels, torch.full_like(state.labels, self.num_classes)))

    def _guided_logits(self, logits: torch.Tensor, si: int, sampling: VARSampling) -> torch.Tensor:
        if sampling.cfg == 0:
            return logits
        B, t = logits.shape[0] // 2, sampling.cfg * si / self.num_stages_minus_1
        return (1 + t) * logits[:B] - t * logits[B:]

    def _take(self, state: VARState, vq: VQVAE, si: int, logits: torch.Tensor, sampling: VARSampling,
              generator: torch.Generator | None) -> None:
        """Choose scale si's tokens from its logits [B(·2), pn^2, V] and advance f_hat and the next input."""
        logits = self._guided_logits(logits, si, sampling)
        B, L, V = logits.shape
        config = sampling.at(si)
        flat = logits.reshape(B * L, V)
        # a scale's tokens are thousands of rows at once: inverse-CDF draws (torch.multinomial is slow there on a CPU)
        idx = sample_warped_rows(flat, config, generator) if config.do_sample else flat.argmax(dim=-1)
        idx = idx.view(B, L)
        state.token_maps.append(idx)
        state.f_hat = state.f_hat + vq.quantize.codes_to_fhat_step(si, idx).float()
        if si < self.num_stages_minus_1:
            state.inputs.append(vq.quantize.next_scale_input(si, state.f_hat))

    def run_scales(self, state: VARState, vq: VQVAE, start: int, stop: int, sampling: VARSampling,
                   generator: torch.Generator | None = None, name: str = "var",
                   on_scale: Callable[[int, str], Any] | None = None) -> VARState:
        """Generate scales [start, stop) into `state` (one forward per scale, KV-cached).

        When the state's cache is not this model's (its scales < start came from another model), the
        first forward is one block-causal prefill over scales 0..start that builds this model's cache.
        `on_scale(si, name)` is called after each scale is taken (a pipeline's progress bar).
        """
        if not 0 <= start < stop <= len(self.patch_nums):
            raise MMSpecError(f"scales [{start}, {stop}) are outside 0..{len(self.patch_nums)}")
        if state.done != start:
            raise MMSpecError(f"the state has {state.done} scales done, cannot run from scale {start}")
        self.check_vq(vq)
        if not isinstance(sampling.temperature, (int, float)) and len(sampling.temperature) != len(self.patch_nums):
            raise MMSpecError(f"{len(sampling.temperature)} temperatures for {len(self.patch_nums)} scales")
        guided = sampling.cfg != 0
        labels = self._cfg_labels(state) if guided else state.labels
        copies = 2 if guided else 1
        # The cache goes on only if this model made it, with the same rows (CFG doubles the batch).
        own_cache = (state.cache is not None and state.cache_owner is self
                     and state.cache[0][0].shape[0] == labels.shape[0])
        with torch.no_grad():
            for si in range(start, stop):
                if si == start and not own_cache:  # prefill this model's cache over scales 0..si
                    state.cache, state.cache_owner = [[] for _ in self.blocks], self
                    inputs = torch.cat(state.inputs, dim=1).repeat(copies, 1, 1) if si else None
                    x = self.embed(labels, inputs, 0, si + 1)
                    end = x.shape[1]
                    bias = self.attn_bias_for_masking[:, :, :end, :end]
                    logits = self.transformer(x, labels, bias, state.cache, logits_from=self.begin_ends[si][0])
                else:
                    inputs = state.inputs[si - 1].repeat(copies, 1, 1)
                    logits = self.transformer(self.embed(labels, inputs, si, si + 1), labels, None, state.cache)
                state.forwards[name] = state.forwards.get(name, 0) + 1
                state.scales_by[name] = state.scales_by.get(name, 0) + 1
                self._take(state, vq, si, logits, sampling, generator)
                if on_scale is not None:
                    on_scale(si, name)
        return state

    def autoregressive_infer_cfg(self, vq: VQVAE, B: int, label_B: torch.Tensor | Sequence[int] | int | None,
                                 generator: torch.Generator | None = None, cfg: float = 1.5, top_k: int = 0,
                                 top_p: float = 0.0, temperature: float | Sequence[float] = 1.0) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1] of classes `label_B`, as the official: one int is repeated B times,
        None draws B classes uniformly with the generator."""
        if label_B is None:
            label_B = randint(self.num_classes, (B,), generator, self.device)
        labels = [label_B] * B if isinstance(label_B, int) else label_B
        state = self.begin(labels)
        if state.labels.shape[0] != B:
            raise MMSpecError(f"{state.labels.shape[0]} labels for a batch of {B}")
        self.run_scales(state, vq, 0, len(self.patch_nums), VARSampling(cfg, top_k, top_p, temperature), generator)
        with torch.no_grad():
            return vq.fhat_to_img(state.f_hat.to(vq.dtype)).add(1).mul(0.5)


def tiny_var(vq: VQVAE, num_classes: int = 5, depth: int = 2, embed_dim: int = 32, num_heads: int = 2,
             seed: int = 0, shared_aln: bool = False) -> VAR:
    """A random VAR matching `vq` (its vocab, Cvae and patch_nums), for tests."""
    torch.manual_seed(seed)
    model = VAR(vocab_size=vq.vocab_size, Cvae=vq.Cvae, num_classes=num_classes, depth=depth, embed_dim=embed_dim,
                num_heads=num_heads, shared_aln=shared_aln, patch_nums=vq.v_patch_nums)
    return model.eval()
