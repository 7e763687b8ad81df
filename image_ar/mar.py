"""MAR: masked autoregressive image generation over continuous tokens (Li et al. 2024, "Autoregressive
Image Generation without Vector Quantization"; LTH14/mar `models/mar.py`, MIT), written anew with the
official parameter names so `mar_{base,large,huge}` checkpoints (their `model_ema` dicts) load:

    class_emb [class_num, E], fake_latent [1, E], z_proj, z_proj_ln, encoder_pos_embed_learned
    [1, buffer_size + L, E], encoder_blocks.{i} (timm ViT `Block`: norm1, attn.qkv, attn.proj, norm2,
    mlp.fc1, mlp.fc2), encoder_norm, decoder_embed, mask_token [1, 1, D], decoder_pos_embed_learned
    [1, buffer_size + L, D], decoder_blocks.{i}, decoder_norm, diffusion_pos_embed_learned [1, L, D],
    diffloss.net.* (see `diffloss.py`)

The encoder sees the class embedding in `buffer_size` buffer slots and the known tokens only; the
decoder fills the unknown positions with the mask token; the diffusion head samples each unknown
token from the decoder's output at its position. Generation follows a random order per image and
the cosine schedule: after step s, floor(L cos(pi/2 (s+1)/num_iter)) tokens stay unknown (at least
one fewer each step). CFG runs the batch twice, the second half with `fake_latent` as the class, and
guides the head's noise prediction with a linear ("linear", Muse) or constant scale.
The released builds (`OFFICIAL_BUILDS`) use class_num 1000, buffer_size 64, 256 tokens of 16
channels (KL-16 VAE, 256 px) and equal encoder/decoder widths: base 768 x 12 (12 heads), large
1024 x 16, huge 1280 x 20 (16 heads); their DiffLoss MLPs are 6 x 1024, 8 x 1280 and 12 x 1536.
"""

from __future__ import annotations

import argparse
import functools
import math
from pathlib import Path

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from mmspec.errors import MMSpecError
from mmspec.optional import require
from mmspec.sampling import rand

from .diffloss import DiffLoss
from .masked_decode import cfg_scale, mask_by_order, target_generate
from .token_density import LastStepGaussian

OFFICIAL_BUILDS = {
    name: dict(encoder_embed_dim=width, encoder_depth=depth, encoder_num_heads=heads, decoder_embed_dim=width,
               decoder_depth=depth, decoder_num_heads=heads, diffloss_d=head_depth, diffloss_w=head_width)
    for name, width, depth, heads, head_depth, head_width in (("mar_base", 768, 12, 12, 6, 1024),
                                                              ("mar_large", 1024, 16, 16, 8, 1280),
                                                              ("mar_huge", 1280, 20, 16, 12, 1536))
}


class MAR(ModelMixin, ConfigMixin):
    """Class-conditional MAR with its DiffLoss head; see the module docstring for names and shapes."""

    @register_to_config
    def __init__(
        self,
        img_size: int = 256,
        vae_stride: int = 16,
        patch_size: int = 1,
        encoder_embed_dim: int = 1024,
        encoder_depth: int = 16,
        encoder_num_heads: int = 16,
        decoder_embed_dim: int = 1024,
        decoder_depth: int = 16,
        decoder_num_heads: int = 16,
        mlp_ratio: float = 4.0,
        vae_embed_dim: int = 16,
        mask_ratio_min: float = 0.7,
        label_drop_prob: float = 0.1,
        class_num: int = 1000,
        attn_dropout: float = 0.1,
        proj_dropout: float = 0.1,
        buffer_size: int = 64,
        diffloss_d: int = 3,
        diffloss_w: int = 1024,
        num_sampling_steps: int = 100,
        diffusion_batch_mul: int = 4,
        scheduler: str = "ddpm",
        timestep_spacing: str = "linspace",
    ) -> None:
        super().__init__()
        for name, value, heads in (("encoder", encoder_embed_dim, encoder_num_heads),
                                   ("decoder", decoder_embed_dim, decoder_num_heads)):
            if value % heads:
                raise MMSpecError(f"{name}_embed_dim {value} is not a multiple of {name}_num_heads {heads}")
        if img_size % (vae_stride * patch_size):
            raise MMSpecError(f"img_size {img_size} is not a multiple of vae_stride x patch_size = {vae_stride * patch_size}")
        self.seq_h = self.seq_w = img_size // vae_stride // patch_size
        self.seq_len = self.seq_h * self.seq_w
        self.token_embed_dim = vae_embed_dim * patch_size**2
        self.buffer_size = buffer_size
        self.diffusion_batch_mul = diffusion_batch_mul

        self.class_emb = nn.Embedding(class_num, encoder_embed_dim)
        self.fake_latent = nn.Parameter(torch.zeros(1, encoder_embed_dim))  # the unconditional "class"

        # timm's ViT block, imported here so that `mmspec.image_ar` loads without timm (only MAR needs it).
        vit_block = require("timm.models.vision_transformer", "image", "a MAR model").Block

        def blocks(width: int, depth: int, heads: int) -> nn.ModuleList:
            norm = functools.partial(nn.LayerNorm, eps=1e-6)
            return nn.ModuleList(vit_block(width, heads, mlp_ratio, qkv_bias=True, norm_layer=norm, proj_drop=proj_dropout,
                                       attn_drop=attn_dropout) for _ in range(depth))

        self.z_proj = nn.Linear(self.token_embed_dim, encoder_embed_dim)
        self.z_proj_ln = nn.LayerNorm(encoder_embed_dim, eps=1e-6)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, self.seq_len + buffer_size, encoder_embed_dim))
        self.encoder_blocks = blocks(encoder_embed_dim, encoder_depth, encoder_num_heads)
        self.encoder_norm = nn.LayerNorm(encoder_embed_dim, eps=1e-6)

        self.decoder_embed = nn.Linear(encoder_embed_dim, decoder_embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_embed_dim))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, self.seq_len + buffer_size, decoder_embed_dim))
        self.decoder_blocks = blocks(decoder_embed_dim, decoder_depth, decoder_num_heads)
        self.decoder_norm = nn.LayerNorm(decoder_embed_dim, eps=1e-6)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, self.seq_len, decoder_embed_dim))
        self.initialize_weights()

        self.diffloss = DiffLoss(target_channels=self.token_embed_dim, z_channels=decoder_embed_dim, width=diffloss_w,
                                 depth=diffloss_d, num_sampling_steps=num_sampling_steps, scheduler=scheduler,
                                 timestep_spacing=timestep_spacing)

    def initialize_weights(self) -> None:
        for param in (self.class_emb.weight, self.fake_latent, self.mask_token, self.encoder_pos_embed_learned,
                      self.decoder_pos_embed_learned, self.diffusion_pos_embed_learned):
            nn.init.normal_(param, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm) and module.elementwise_affine:
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    # ----- latents <-> token sequences

    def patchify(self, latents: torch.Tensor) -> torch.Tensor:
        """VAE latents [B, c, h, w] -> tokens [B, L, c p p] (channel-major within a patch, as the official)."""
        b, c, h, w = latents.shape
        p = self.config.patch_size
        x = latents.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(b, (h // p) * (w // p), c * p * p)

    def unpatchify(self, tokens: torch.Tensor) -> torch.Tensor:
        b, p, c = tokens.shape[0], self.config.patch_size, self.config.vae_embed_dim
        x = tokens.reshape(b, self.seq_h, self.seq_w, c, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(b, c, self.seq_h * p, self.seq_w * p)

    # ----- the MAE encoder / decoder

    def class_embedding(self, labels: torch.Tensor | None, batch_size: int, cfg: float) -> torch.Tensor:
        """[B, E] (or [2B, E] with the unconditional half when cfg != 1); labels None = unconditional."""
        if labels is None:
            cond = self.fake_latent.expand(batch_size, -1)
        else:
            labels = torch.as_tensor(labels, device=self.device).reshape(-1)
            if labels.numel() != batch_size:
                raise MMSpecError(f"got {labels.numel()} labels for a batch of {batch_size}")
            if ((labels < 0) | (labels >= self.config.class_num)).any():
                raise MMSpecError(f"class labels must be in 0..{self.config.class_num - 1}")
            cond = self.class_emb(labels)
        if cfg != 1.0:
            cond = torch.cat([cond, self.fake_latent.expand(batch_size, -1)])
        return cond

    def forward_mae_encoder(self, tokens: torch.Tensor, mask: torch.Tensor, class_embedding: torch.Tensor) -> torch.Tensor:
        """Encodes the buffer (class embedding) and the known tokens; every row must know as many tokens."""
        x = self.z_proj(tokens.to(self.z_proj.weight.dtype))  # generation keeps tokens in float32 under a bf16 model
        b, _, width = x.shape
        x = torch.cat([class_embedding[:, None].expand(b, self.buffer_size, width).to(x.dtype), x], dim=1)
        x = self.z_proj_ln(x + self.encoder_pos_embed_learned)
        keep = torch.cat([mask.new_zeros(b, self.buffer_size), mask], dim=1).logical_not()
        x = x[keep].reshape(b, -1, width)
        for block in self.encoder_blocks:
            x = block(x)
        return self.encoder_norm(x)

    def forward_mae_decoder(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Decoder output [B, L, D] for every position (buffer slots dropped), plus the diffusion position embedding."""
        x = self.decoder_embed(x)
        b, _, width = x.shape
        keep = torch.cat([mask.new_zeros(b, self.buffer_size), mask], dim=1).logical_not()
        full = self.mask_token.to(x.dtype).expand(b, keep.shape[1], width).clone()
        full[keep] = x.reshape(-1, width)
        x = full + self.decoder_pos_embed_learned
        for block in self.decoder_blocks:
            x = block(x)
        x = self.decoder_norm(x)[:, self.buffer_size:]
        return x + self.diffusion_pos_embed_learned

    def condition(self, tokens: torch.Tensor, unknown: torch.Tensor, class_embedding: torch.Tensor) -> torch.Tensor:
        """Decoder outputs z [B', L, D] for tokens [B, L, C] with `unknown` [B, L] (bool), B' = rows of class_embedding."""
        if class_embedding.shape[0] != tokens.shape[0]:  # CFG: the unconditional half sees the same tokens
            tokens, unknown = torch.cat([tokens, tokens]), torch.cat([unknown, unknown])
        return self.forward_mae_decoder(self.forward_mae_encoder(tokens, unknown, class_embedding), unknown)

    def forward(self, latents: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Training loss: mask a random share (truncated normal, at least `mask_ratio_min`) of a random
        order and predict the masked tokens with the diffusion loss."""
        tokens = self.patchify(latents)
        b, length, _ = tokens.shape
        class_embedding = self.class_emb(labels)
        if self.training and self.config.label_drop_prob > 0:
            drop = rand((b, 1), generator, tokens.device) < self.config.label_drop_prob
            class_embedding = torch.where(drop, self.fake_latent.to(class_embedding.dtype), class_embedding)
        orders = self.sample_orders(b, generator)
        unknown = mask_by_order(int(math.ceil(length * self.mask_ratio(generator))), orders)
        z = self.condition(tokens, unknown, class_embedding)
        mul = self.diffusion_batch_mul
        return self.diffloss(target=tokens.reshape(b * length, -1).repeat(mul, 1), z=z.reshape(b * length, -1).repeat(mul, 1),
                             mask=unknown.reshape(-1).float().repeat(mul), generator=generator)

    def mask_ratio(self, generator: torch.Generator | None = None) -> float:
        """A draw of the left-truncated normal N(1, 0.25^2) on [mask_ratio_min, 1] (inverse CDF)."""
        truncnorm = require("scipy.stats", "recipes", "training a MAR model").truncnorm

        low = (self.config.mask_ratio_min - 1.0) / 0.25
        u = float(rand((1,), generator, torch.device("cpu")))
        return float(truncnorm.ppf(u, low, 0, loc=1.0, scale=0.25))

    # ----- generation

    @property
    def supports_density(self) -> bool:
        """Whether the head's draws come with CSpD densities (DDPM; DDIM is deterministic)."""
        return self.config.scheduler == "ddpm"

    @property
    def denoising_timesteps(self) -> tuple[int, ...]:
        """The head's sampling timesteps (its step count and spacing): CSpD's shared noise aligns two
        heads' trajectories only when these are equal."""
        return tuple(self.diffloss.scheduler.timesteps.tolist())

    def sample_orders(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """A random generation order per image [B, L] (drawn on the generator's device, returned on the model's)."""
        keys = rand((batch_size, self.seq_len), generator, self.device)
        return keys.argsort(dim=1)

    def check_generation(self, num_iter: int, cfg: float, cfg_schedule: str, temperature: float) -> None:
        if not 1 <= num_iter <= self.seq_len:
            raise MMSpecError(f"num_iter must be in 1..{self.seq_len} (the token count), got {num_iter}")
        if cfg < 1.0:
            raise MMSpecError(f"cfg must be >= 1, got {cfg}")
        if temperature <= 0:
            raise MMSpecError(f"temperature must be > 0, got {temperature}")
        cfg_scale(cfg, cfg_schedule, self.seq_len, 0)

    def propose(self, tokens: torch.Tensor, unknown: torch.Tensor, predict: torch.Tensor, class_embedding: torch.Tensor,
                cfg: float, temperature: float, noise: torch.Tensor, step_noise: torch.Tensor | None) -> LastStepGaussian:
        """One MAR forward given `unknown` [B, L]; the head samples the `predict` [B, L] positions (rows
        in `predict.nonzero()` order) with the per-position noise banks noise [B, L, C] and step_noise
        [B, L, S, C] (None: DDIM, whose tokens come with no density)."""
        z = self.condition(tokens, unknown, class_embedding)
        where = predict.nonzero(as_tuple=True)
        rows = z[: tokens.shape[0]][where]
        if cfg != 1.0:
            rows = torch.cat([rows, z[tokens.shape[0]:][where]])
        head = self.diffloss.sample(rows, temperature=temperature, cfg=cfg, noise=noise[where],
                                    step_noise=None if step_noise is None else step_noise[where])
        if head.last_mean is None:
            return LastStepGaussian(head.tokens, head.tokens.float(), torch.ones_like(head.tokens, dtype=torch.float32),
                                    torch.zeros_like(head.tokens, dtype=torch.float32))
        return LastStepGaussian(head.tokens, head.last_mean, head.last_std, head.log_var_sum)

    def noise_banks(self, batch_size: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Initial noise [B, L, C] and per-step noise [B, L, S, C] for every position (None for DDIM)."""
        from mmspec.sampling import randn

        c, s = self.token_embed_dim, self.diffloss.num_sampling_steps
        noise = randn((batch_size, self.seq_len, c), generator, self.device)
        steps = randn((batch_size, self.seq_len, s, c), generator, self.device) if self.config.scheduler == "ddpm" else None
        return noise, steps

    @torch.no_grad()
    def sample_tokens(self, batch_size: int, num_iter: int = 64, cfg: float = 1.0, cfg_schedule: str = "linear",
                      labels: torch.Tensor | None = None, temperature: float = 1.0,
                      generator: torch.Generator | None = None, progress: bool = False) -> torch.Tensor:
        """Latents [B, c, h, w] by `num_iter` steps of the cosine schedule (the official `sample_tokens`)."""
        tokens, _ = target_generate(self, batch_size, num_iter=num_iter, cfg=cfg, cfg_schedule=cfg_schedule, labels=labels,
                                    temperature=temperature, generator=generator)
        return self.unpatchify(tokens)


def tiny_mar(seed: int = 0, **overrides) -> MAR:
    """A small random MAR for tests: 4x4 tokens of 4 channels, width 32, 1+1 blocks, 10 diffusion steps."""
    config = dict(img_size=16, vae_stride=4, patch_size=1, encoder_embed_dim=32, encoder_depth=1, encoder_num_heads=4,
                  decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=4, vae_embed_dim=4, class_num=10, buffer_size=4,
                  diffloss_d=2, diffloss_w=32, num_sampling_steps=10, attn_dropout=0.0, proj_dropout=0.0)
    config.update(overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MAR(**config).eval()
        # the official init zeroes the head's adaLN and output layers (every token would be the noise)
        with torch.no_grad():
            for param in model.diffloss.net.parameters():
                if not param.abs().sum():
                    param.normal_(std=0.05)
    return model


def load_official_mar(checkpoint: str | Path | dict, ema: bool = True, **config) -> MAR:
    """A MAR built with `config` (the official build's sizes) from an official checkpoint file or dict
    (its `model_ema` weights when `ema`, else `model`; a bare state dict also works); strict names."""
    if isinstance(checkpoint, (str, Path)):
        # official checkpoints also hold the training `args` (an argparse.Namespace): allow that class only
        with torch.serialization.safe_globals([argparse.Namespace]):
            try:
                state = torch.load(checkpoint, map_location="cpu", weights_only=True)
            except Exception as err:  # noqa: BLE001 - any unpickling refusal becomes one line
                raise MMSpecError(f"cannot read {checkpoint} as a weights-only checkpoint: {str(err).splitlines()[0]}") from err
    else:
        state = checkpoint
    for key in (("model_ema", "model") if ema else ("model",)):
        if isinstance(state.get(key), dict):
            state = state[key]
            break
    model = MAR(**config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise MMSpecError(f"not a MAR state dict for this config: {len(missing)} missing (e.g. {missing[:3]}), "
                          f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})")
    return model.eval()
