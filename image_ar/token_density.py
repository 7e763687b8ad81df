"""Per-token densities of continuous AR image models, as continuous speculative decoding uses them.

A density holds, for N token positions, the model's own draw (`tokens` [N, C]), a log-density
`log_density(x, inner_temperature)` [N] and fresh draws `draw(generator)` [N, C].

`LastStepGaussian` is the density CSpD (Wang et al. 2024; MarkXCloud/CSpD, MIT) assigns to a token
sampled by a diffusion head: the Gaussian of the last denoising step N(mean, std^2), with the
trajectory's variance correction exp(sum_t log var_t) over the earlier steps (denoising trajectory
alignment makes draft and target share the noise, so the ratio of their trajectories' densities
reduces to the ratio of their variances):

    log p~(x) = -1/2 |(x - mean) / (std T)|^2 - sum log std + sum_{t >= 1} log var_t

T is the "inner temperature" of the official runner (42 there); T = 1 gives the plain density.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.sampling import randn


@dataclass
class LastStepGaussian:
    tokens: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    log_var_sum: torch.Tensor

    def log_density(self, x: torch.Tensor, inner_temperature: float = 1.0) -> torch.Tensor:
        z = (x.float() - self.mean) / (self.std * inner_temperature)
        return -0.5 * z.pow(2).sum(-1) - self.std.log().sum(-1) + self.log_var_sum.sum(-1)

    def draw(self, generator: torch.Generator | None) -> torch.Tensor:
        return self.mean + self.std * randn(tuple(self.mean.shape), generator, self.mean.device)

    def rows(self, index: torch.Tensor) -> "LastStepGaussian":
        return LastStepGaussian(self.tokens[index], self.mean[index], self.std[index], self.log_var_sum[index])

    @staticmethod
    def cat(parts: list["LastStepGaussian"]) -> "LastStepGaussian":
        return LastStepGaussian(*(torch.cat([getattr(p, name) for p in parts])
                                  for name in ("tokens", "mean", "std", "log_var_sum")))
