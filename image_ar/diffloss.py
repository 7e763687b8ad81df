"""MAR's per-token diffusion head, `DiffLoss` (Li et al. 2024, "Autoregressive Image Generation without
Vector Quantization"; LTH14/mar `models/diffloss.py`, MIT), written anew with the official names so a
MAR checkpoint's `diffloss.*` keys load:

    net.time_embed.mlp.{0,2}, net.cond_embed, net.input_proj,
    net.res_blocks.{i}.{in_ln, mlp.{0,2}, adaLN_modulation.1},
    net.final_layer.{norm_final, linear, adaLN_modulation.1}

The net predicts the noise and a learned-range variance (2 x token channels) for one token given the
MAR decoder's output `z` for that position. Sampling runs on diffusers' schedulers configured to the
official schedule: 1000 training steps, the cosine ("squaredcos_cap_v2") betas, "linspace" spacing
(the official respacing of "100" picks exactly round(linspace(0, 999, 100))), epsilon prediction, no
clipping, learned-range variance for DDPM; DDIM (eta 0) is offered as a deterministic alternative.

Each DDPM step samples x_prev ~ N(mean, exp(log_var)) with the scheduler's mean and variance;
`step_gaussian` exposes that Gaussian (test: it is exactly what `DDPMScheduler.step` samples) because
continuous speculative decoding needs the densities of the last step and the trajectory's variances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from diffusers import DDIMScheduler, DDPMScheduler
from torch import nn

from mmspec.compat import scheduler_variance
from mmspec.errors import MMSpecError
from mmspec.sampling import randint, randn

SCHEDULERS = ("ddpm", "ddim")


SPACINGS = ("linspace", "leading")


def cosine_scheduler(kind: str = "ddpm", num_train_timesteps: int = 1000, timestep_spacing: str = "linspace"
                     ) -> DDPMScheduler | DDIMScheduler:
    """A diffusers scheduler with MAR's diffusion settings (see the module docstring).

    `timestep_spacing` "linspace" (official) starts sampling at t = 999, where the cosine schedule's
    alpha_bar is 2.4e-9: x_0 is read from the noise prediction with a gain of 1 / sqrt(alpha_bar) = 2e4,
    so a head that is not near exact there (a small or briefly trained one) sends the draw off to
    hundreds of standard deviations. "leading" (t = 980, 960, ..., 0 for 50 steps; Stable Diffusion's
    choice) starts where the gain is 33."""
    if timestep_spacing not in SPACINGS:
        raise MMSpecError(f"unknown timestep_spacing {timestep_spacing!r} (known: {', '.join(SPACINGS)})")
    common = dict(num_train_timesteps=num_train_timesteps, beta_schedule="squaredcos_cap_v2",
                  prediction_type="epsilon", clip_sample=False, timestep_spacing=timestep_spacing)
    if kind == "ddpm":
        return DDPMScheduler(variance_type="learned_range", **common)
    if kind == "ddim":
        return DDIMScheduler(set_alpha_to_one=True, **common)
    raise MMSpecError(f"unknown diffusion scheduler {kind!r} (known: {', '.join(SCHEDULERS)})")


@dataclass
class StepCoefficients:
    """The scalars of one DDPM step's Gaussian, read from the scheduler once per timestep (the sampling
    loop reuses them for every call instead of asking the scheduler at each step)."""

    sqrt_alpha: torch.Tensor
    sqrt_one_minus_alpha: torch.Tensor
    x0_coef: torch.Tensor
    x_coef: torch.Tensor
    min_log: torch.Tensor  # learned-range bounds: log posterior variance (clamped as the scheduler does)
    max_log: torch.Tensor  # and log beta_t

    @classmethod
    def of(cls, scheduler: DDPMScheduler, t: int, device: torch.device) -> "StepCoefficients":
        with torch.device(scheduler.timesteps.device):  # the scheduler's bookkeeping tensors live with its timesteps
            prev_t = int(scheduler.previous_timestep(t))
            min_log = scheduler_variance(scheduler, t, "fixed_small").log()
            max_log = scheduler_variance(scheduler, t, "fixed_large_log")
        alphas = scheduler.alphas_cumprod.to(device=device, dtype=torch.float32)
        alpha_t = alphas[t]
        alpha_prev = alphas[prev_t] if prev_t >= 0 else torch.ones((), device=device)
        beta_t = 1 - alpha_t / alpha_prev
        return cls(sqrt_alpha=alpha_t.sqrt(), sqrt_one_minus_alpha=(1 - alpha_t).sqrt(),
                   x0_coef=alpha_prev.sqrt() * beta_t / (1 - alpha_t),
                   x_coef=(1 - beta_t).sqrt() * (1 - alpha_prev) / (1 - alpha_t),
                   min_log=min_log.to(device=device, dtype=torch.float32),
                   max_log=max_log.to(device=device, dtype=torch.float32))

    def gaussian(self, model_output: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log_var) for the net's output [N, 2C] at x [N, C]: see `step_gaussian`."""
        channels = x.shape[-1]
        eps, predicted_variance = model_output[:, :channels].float(), model_output[:, channels:].float()
        x = x.float()
        x0 = (x - self.sqrt_one_minus_alpha * eps) / self.sqrt_alpha
        mean = self.x0_coef * x0 + self.x_coef * x
        frac = (predicted_variance + 1) / 2  # the scheduler's learned-range interpolation
        return mean, frac * self.max_log + (1 - frac) * self.min_log


def step_gaussian(scheduler: DDPMScheduler, model_output: torch.Tensor, t: int, x: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, log_var) of the Gaussian `scheduler.step` draws x_prev from at timestep t.

    The mean is the DDPM posterior mean at the scheduler's predicted x_0 (formula 7 of Ho et al.
    2020, over the respaced step t -> previous_timestep(t)); the log-variance is the scheduler's own
    learned-range interpolation. At the last step (no previous timestep) no noise is added, as in
    `step`, and the log-variance is only a density parameter.
    """
    return StepCoefficients.of(scheduler, t, x.device).gaussian(model_output, x)


@dataclass
class HeadSample:
    """Tokens drawn by the diffusion head, with the parameters of their last denoising step.

    `last_mean`/`last_std` [N, C]: the Gaussian of the final step (the sample equals its mean: no
    noise is added at t = 0; std includes the sampling temperature); `log_var_sum` [N, C]: the sum of
    the log-variances of all earlier steps (the trajectory's variance). None for DDIM.
    """

    tokens: torch.Tensor
    last_mean: torch.Tensor | None = None
    last_std: torch.Tensor | None = None
    log_var_sum: torch.Tensor | None = None


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class TimestepEmbedder(nn.Module):
    """Sinusoidal timestep features (cos first, then sin) through a 2-layer MLP."""

    def __init__(self, hidden_size: int, frequency_embedding_size: int = 256) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden_size), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size))
        self.frequency_embedding_size = frequency_embedding_size

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.frequency_embedding_size // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        features = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if self.frequency_embedding_size % 2:
            features = F.pad(features, (0, 1))
        return self.mlp(features.to(self.mlp[0].weight.dtype))


class ResBlock(nn.Module):
    """LayerNorm -> adaLN (shift, scale) -> MLP, added back through an adaLN gate."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.in_ln = nn.LayerNorm(channels, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(channels, channels), nn.SiLU(), nn.Linear(channels, channels))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(channels, 3 * channels))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.modulated(x, self.adaLN_modulation(y))

    def modulated(self, x: torch.Tensor, modulation: torch.Tensor) -> torch.Tensor:
        """The block given its adaLN output [N, 3C] (shift, scale, gate)."""
        shift, scale, gate = modulation.chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, model_channels: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(model_channels, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(model_channels, out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(model_channels, 2 * model_channels))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.modulated(x, self.adaLN_modulation(c))

    def modulated(self, x: torch.Tensor, modulation: torch.Tensor) -> torch.Tensor:
        shift, scale = modulation.chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class SimpleMLPAdaLN(nn.Module):
    """The denoiser: input projection, `num_res_blocks` adaLN residual MLP blocks conditioned on
    time + z, and a final adaLN layer giving [eps, variance logits]."""

    def __init__(self, in_channels: int, model_channels: int, out_channels: int, z_channels: int,
                 num_res_blocks: int) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.time_embed = TimestepEmbedder(model_channels)
        self.cond_embed = nn.Linear(z_channels, model_channels)
        self.input_proj = nn.Linear(in_channels, model_channels)
        self.res_blocks = nn.ModuleList(ResBlock(model_channels) for _ in range(num_res_blocks))
        self.final_layer = FinalLayer(model_channels, out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.time_embed.mlp[0].weight, std=0.02)
        nn.init.normal_(self.time_embed.mlp[2].weight, std=0.02)
        # adaLN gates and the output start at zero, as in DiT: every block starts as the identity
        for layer in [block.adaLN_modulation[-1] for block in self.res_blocks] + [
                self.final_layer.adaLN_modulation[-1], self.final_layer.linear]:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        y = self.time_embed(t) + self.cond_embed(c)
        x = self.input_proj(x)
        for block in self.res_blocks:
            x = block(x, y)
        return self.final_layer(x, y)

    def forward_with_cfg(self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor, cfg_scale: float) -> torch.Tensor:
        """Rows [cond; uncond] share x (the first half); eps is guided, the variance logits stay per row."""
        half = x[: len(x) // 2]
        return self.guide(self.forward(torch.cat([half, half]), t, c), cfg_scale)

    def guide(self, out: torch.Tensor, cfg_scale: float) -> torch.Tensor:
        """[cond; uncond] outputs -> both halves carry the guided eps; the variance logits stay per row."""
        eps, rest = out[:, : self.in_channels], out[:, self.in_channels:]
        cond, uncond = eps.chunk(2)
        guided = uncond + cfg_scale * (cond - uncond)
        return torch.cat([torch.cat([guided, guided]), rest], dim=1)


class SamplingDenoiser:
    """`SimpleMLPAdaLN` for one sampling call over fixed conditions c [N, D] and timesteps [S]: the
    same arithmetic as its forward, with what does not change from step to step done once. The time
    embeddings of all S steps and the condition embedding are computed up front, and the adaLN layers
    of every block, which all read SiLU(y), run as one matrix product per step. On a CPU the head's
    per-step cost is mostly the count of small products, not their size."""

    def __init__(self, net: SimpleMLPAdaLN, timesteps: torch.Tensor, c: torch.Tensor) -> None:
        self.net = net
        self.time = net.time_embed(timesteps.to(c.device))  # [S, W]
        self.cond = net.cond_embed(c)  # [N, W]
        layers = [block.adaLN_modulation[-1] for block in net.res_blocks] + [net.final_layer.adaLN_modulation[-1]]
        self.weight = torch.cat([layer.weight for layer in layers])
        self.bias = torch.cat([layer.bias for layer in layers])
        self.sizes = [layer.out_features for layer in layers]

    def __call__(self, x: torch.Tensor, step: int) -> torch.Tensor:
        """The net's output [N, 2C] at x [N, C] on the `step`-th timestep."""
        y = F.silu(self.time[step] + self.cond)
        *blocks, final = F.linear(y, self.weight, self.bias).split(self.sizes, dim=-1)
        h = self.net.input_proj(x)
        for block, modulation in zip(self.net.res_blocks, blocks):
            h = block.modulated(h, modulation)
        return self.net.final_layer.modulated(h, final)


class DiffLoss(nn.Module):
    """The diffusion head of MAR: training loss and per-token sampling through a diffusers scheduler."""

    def __init__(self, target_channels: int, z_channels: int, depth: int, width: int,
                 num_sampling_steps: int | str = 100, scheduler: str = "ddpm", timestep_spacing: str = "linspace") -> None:
        super().__init__()
        self.in_channels = target_channels
        self.net = SimpleMLPAdaLN(in_channels=target_channels, model_channels=width, out_channels=2 * target_channels,
                                  z_channels=z_channels, num_res_blocks=depth)
        self.num_sampling_steps = int(num_sampling_steps)
        if not 1 <= self.num_sampling_steps <= 1000:
            raise MMSpecError(f"num_sampling_steps must be in 1..1000, got {num_sampling_steps}")
        self.scheduler_kind = scheduler
        self.scheduler = cosine_scheduler(scheduler, timestep_spacing=timestep_spacing)
        self.scheduler.set_timesteps(self.num_sampling_steps)
        self.train_scheduler = cosine_scheduler("ddpm")

    def _step_coefficients(self, device: torch.device) -> list[StepCoefficients]:
        """Each sampling timestep's Gaussian coefficients, kept until the timesteps or the device change."""
        key = (tuple(self.scheduler.timesteps.tolist()), str(device))
        if getattr(self, "_coefficients_key", None) != key:
            self._coefficients = [StepCoefficients.of(self.scheduler, t, device) for t in key[0]]
            self._coefficients_key = key
        return self._coefficients

    def forward(self, target: torch.Tensor, z: torch.Tensor, mask: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """Noise-prediction MSE plus the variational bound on the learned variance (the mean's
        gradient stopped there), as the official "hybrid" loss; masked mean over tokens."""
        steps = self.train_scheduler.config.num_train_timesteps
        t = randint(steps, (target.shape[0],), generator, target.device)
        noise = randn(tuple(target.shape), generator, target.device, target.dtype)
        x_t = self.train_scheduler.add_noise(target, noise, t)
        out = self.net(x_t, t, z)
        eps, var_logits = out[:, : self.in_channels], out[:, self.in_channels:]
        loss = (eps - noise).pow(2).mean(-1) + self._vb(target, x_t, t, eps.detach(), var_logits)
        if mask is not None:
            return (loss * mask).sum() / mask.sum().clamp_min(1)
        return loss.mean()

    def _vb(self, x0: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, eps: torch.Tensor,
            var_logits: torch.Tensor) -> torch.Tensor:
        """KL(q(x_{t-1} | x_t, x_0) || p(x_{t-1} | x_t)) in bits per dimension (Gaussian NLL of x_0 at t = 0)."""
        alphas = self.train_scheduler.alphas_cumprod.to(x0.device)
        a_t = alphas[t][:, None]
        a_prev = torch.where(t > 0, alphas[(t - 1).clamp_min(0)], torch.ones_like(alphas[t]))[:, None]
        beta = 1 - a_t / a_prev
        posterior_var = beta * (1 - a_prev) / (1 - a_t)
        # the official clips the t = 0 posterior variance to that of t = 1
        alphas1 = alphas[1] if len(alphas) > 1 else alphas[0]
        var1 = (1 - alphas1 / alphas[0]) * (1 - alphas[0]) / (1 - alphas1)
        min_log = torch.where(t[:, None] > 0, posterior_var.clamp_min(1e-20).log(), var1.log())
        max_log = beta.log()
        frac = (var_logits + 1) / 2
        log_var = frac * max_log + (1 - frac) * min_log

        def mean_from(noise: torch.Tensor) -> torch.Tensor:
            x0_hat = (x_t - (1 - a_t).sqrt() * noise) / a_t.sqrt()
            return (a_prev.sqrt() * beta / (1 - a_t)) * x0_hat + ((1 - beta).sqrt() * (1 - a_prev) / (1 - a_t)) * x_t

        true_mean = (a_prev.sqrt() * beta / (1 - a_t)) * x0 + ((1 - beta).sqrt() * (1 - a_prev) / (1 - a_t)) * x_t
        mean = mean_from(eps)
        kl = 0.5 * (-1.0 + log_var - min_log + (min_log - log_var).exp() + (true_mean - mean).pow(2) * (-log_var).exp())
        nll = 0.5 * (math.log(2 * math.pi) + log_var + (x0 - mean).pow(2) * (-log_var).exp())
        per_dim = torch.where(t[:, None] > 0, kl, nll) / math.log(2.0)
        return per_dim.mean(-1)

    @torch.no_grad()
    def sample(self, z: torch.Tensor, temperature: float = 1.0, cfg: float = 1.0, noise: torch.Tensor | None = None,
               step_noise: torch.Tensor | None = None, generator: torch.Generator | None = None) -> HeadSample:
        """Tokens [N, C] for conditions z [N, D] (or [2N, D] as [cond; uncond] when cfg != 1).

        `noise` [N, C] is the initial noise and `step_noise` [N, S, C] the noise of each of the S
        sampling steps; both are drawn from `generator` when not given. Passing the same noise to two
        heads aligns their denoising trajectories (continuous speculative decoding).
        """
        guided = cfg != 1.0
        n = z.shape[0] // 2 if guided else z.shape[0]
        channels, steps = self.in_channels, self.num_sampling_steps
        if noise is None:
            noise = randn((n, channels), generator, z.device)
        if step_noise is None and self.scheduler_kind == "ddpm":
            step_noise = randn((n, steps, channels), generator, z.device)
        x = noise.to(device=z.device, dtype=torch.float32)
        log_var_sum = torch.zeros_like(x)
        mean = log_var = None
        timesteps = self.scheduler.timesteps.tolist()
        denoise = SamplingDenoiser(self.net, self.scheduler.timesteps, z)
        gaussians = self._step_coefficients(z.device) if self.scheduler_kind == "ddpm" else None
        for i, t in enumerate(timesteps):
            rows = (torch.cat([x, x]) if guided else x).to(z.dtype)
            out = denoise(rows, i)
            out = (self.net.guide(out, cfg) if guided else out)[:n].float()
            if gaussians is None:
                x = self.scheduler.step(out[:, :channels], t, x, eta=0.0).prev_sample
                continue
            mean, log_var = gaussians[i].gaussian(out, x)
            if i == steps - 1:  # the last step adds no noise
                x = mean
            else:
                log_var_sum = log_var_sum + log_var
                x = mean + (0.5 * log_var).exp() * step_noise[:, i].to(mean) * temperature
        if self.scheduler_kind == "ddim":
            return HeadSample(tokens=x.to(z.dtype))
        return HeadSample(tokens=x.to(z.dtype), last_mean=mean, last_std=(0.5 * log_var).exp() * temperature,
                          log_var_sum=log_var_sum)
