"""A continuous-token model whose per-token densities are known in closed form, for proving continuous
speculative decoding: each unknown token is drawn from a Gaussian mixture whose centres move with
the sum of the known tokens (so the order and schedule matter) and with the position. It implements
what `cspd.ContinuousTokenModel` needs, with the mixture standing in for MAR's diffusion head."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mmspec.errors import MMSpecError
from mmspec.sampling import rand, randn


@dataclass
class MixtureDensity:
    tokens: torch.Tensor  # [N, C] the model's own draws
    centres: torch.Tensor  # [N, K, C]
    stds: torch.Tensor  # [K]
    log_weights: torch.Tensor  # [K]

    def log_density(self, x: torch.Tensor, inner_temperature: float = 1.0) -> torch.Tensor:
        c = x.shape[-1]
        z = (x[:, None].double() - self.centres.double()) / (self.stds.double()[None, :, None] * inner_temperature)
        per_component = (self.log_weights.double() - 0.5 * z.pow(2).sum(-1) - c * self.stds.double().log()
                         - 0.5 * c * math.log(2 * math.pi))
        return per_component.logsumexp(-1)

    def draw(self, generator: torch.Generator | None) -> torch.Tensor:
        n, _, c = self.centres.shape
        u = rand((n, 1), generator, self.centres.device)
        return pick(self.centres, self.stds, self.log_weights, u, randn((n, c), generator, self.centres.device))

    def rows(self, index: torch.Tensor) -> "MixtureDensity":
        return MixtureDensity(self.tokens[index], self.centres[index], self.stds, self.log_weights)

    @staticmethod
    def cat(parts: list["MixtureDensity"]) -> "MixtureDensity":
        return MixtureDensity(torch.cat([p.tokens for p in parts]), torch.cat([p.centres for p in parts]),
                              parts[0].stds, parts[0].log_weights)


def pick(centres: torch.Tensor, stds: torch.Tensor, log_weights: torch.Tensor, u: torch.Tensor,
         normal: torch.Tensor) -> torch.Tensor:
    """Mixture draws: component by inverse CDF of u [N, 1], then centre + std x normal [N, C]."""
    cdf = log_weights.exp().cumsum(0)
    k = torch.searchsorted(cdf, u.squeeze(-1).contiguous()).clamp_max(len(cdf) - 1)
    rows = torch.arange(len(k))
    return centres[rows, k] + stds[k][:, None] * normal


class MixtureTokenModel:
    supports_density = True

    def __init__(self, means: list[list[float]], stds: list[float], weights: list[float], coupling: float,
                 seq_len: int = 4) -> None:
        self.means = torch.tensor(means)
        self.stds = torch.tensor(stds)
        self.log_weights = torch.tensor(weights).log()
        self.coupling = coupling
        self.seq_len, self.token_embed_dim = seq_len, self.means.shape[1]
        self.device = torch.device("cpu")
        self.position_shift = torch.linspace(-0.5, 0.5, seq_len)[:, None].expand(seq_len, self.token_embed_dim)

    def check_generation(self, num_iter: int, cfg: float, cfg_schedule: str, temperature: float) -> None:
        if not 1 <= num_iter <= self.seq_len:
            raise MMSpecError(f"num_iter must be in 1..{self.seq_len}")

    def class_embedding(self, labels, batch_size: int, cfg: float) -> torch.Tensor:
        return torch.zeros(batch_size, 1)

    def sample_orders(self, batch_size: int, generator: torch.Generator | None) -> torch.Tensor:
        return rand((batch_size, self.seq_len), generator, self.device).argsort(dim=1)

    def noise_banks(self, batch_size: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-position normals and component uniforms, shared by draft and target (trajectory alignment)."""
        return (randn((batch_size, self.seq_len, self.token_embed_dim), generator, self.device),
                rand((batch_size, self.seq_len, 1), generator, self.device))

    def propose(self, tokens, unknown, predict, class_embedding, cfg, temperature, noise, step_noise) -> MixtureDensity:
        known_sum = (tokens * (~unknown)[..., None]).sum(1)  # [B, C]
        where = predict.nonzero(as_tuple=True)
        shift = self.coupling * known_sum[where[0]] + self.position_shift[where[1]]
        centres = self.means[None] + shift[:, None]
        drawn = pick(centres, self.stds, self.log_weights, step_noise[where], noise[where])
        return MixtureDensity(drawn, centres, self.stds, self.log_weights)


def energy_distance_test(x: torch.Tensor, y: torch.Tensor, permutations: int, seed: int) -> tuple[float, float]:
    """(energy distance, permutation p-value) of two samples [n, d] (Szekely & Rizzo)."""
    both = torch.cat([x, y]).double()
    d = torch.cdist(both, both)
    n, m = x.shape[0], y.shape[0]

    def statistic(in_x: torch.Tensor) -> float:  # in_x: 1.0 for rows of the first sample
        in_y = 1 - in_x
        dx = d @ in_x
        xy, xx, yy = in_y @ dx, in_x @ dx, in_y @ (d @ in_y)
        return float(2 * xy / (n * m) - xx / n**2 - yy / m**2)

    labels = torch.cat([torch.ones(n), torch.zeros(m)]).double()
    observed = statistic(labels)
    g = torch.Generator().manual_seed(seed)
    exceed = sum(statistic(labels[torch.randperm(n + m, generator=g)]) >= observed for _ in range(permutations))
    return observed, (exceed + 1) / (permutations + 1)
