"""Weight overlays: a few tensors that turn one model into another, and the low-rank updates that make them.

An overlay is a flat dict of tensors keyed by the model's parameter names (`model.state_dict()` keys):

    "<name>"          a full replacement of that parameter (same shape);
    "<name>.lora_A"   [r, in] and
    "<name>.lora_B"   [out, r], a low-rank update: weight <- weight + lora_B @ lora_A (the scale is folded into B).

`add_low_rank` trains such updates (LoRA, Hu et al. 2021) as torch parametrizations of frozen `nn.Linear`
weights, `overlay_of` reads them back out, and `apply_overlay` merges an overlay into a model, the same way at
training time (to evaluate what ships) and at load time.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn
from torch.nn.utils import parametrize

from .errors import MMSpecError

LOW_RANK_KEYS = (".lora_A", ".lora_B")


class LowRankDelta(nn.Module):
    """weight -> weight + (alpha / r) B A for a weight [out, in]; B starts at zero, so training starts at the model."""

    def __init__(self, weight: torch.Tensor, rank: int, alpha: float):
        super().__init__()
        out_features, in_features = weight.shape
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, device=weight.device, dtype=weight.dtype))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, device=weight.device, dtype=weight.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.scale * (self.lora_B @ self.lora_A)


def add_low_rank(model: nn.Module, prefix: str, suffixes: Iterable[str], rank: int, alpha: float) -> list[nn.Parameter]:
    """Freeze the weight of every `nn.Linear` under `prefix` whose name ends in one of `suffixes` and give it a
    trainable low-rank update; returns the new parameters."""
    if rank < 1:
        raise MMSpecError(f"a low-rank update needs rank >= 1, got {rank}")
    suffixes = tuple(suffixes)
    found = [(name, module) for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and name.startswith(prefix) and name.rsplit(".", 1)[-1] in suffixes]
    if not found:
        raise MMSpecError(f"no linear layer named {', '.join(suffixes)} under {prefix!r}")
    params = []
    for _, module in found:
        module.weight.requires_grad_(False)
        delta = LowRankDelta(module.weight, rank, alpha)
        parametrize.register_parametrization(module, "weight", delta)
        params += [delta.lora_A, delta.lora_B]
    return params


def overlay_of(model: nn.Module, full: Iterable[str] = ()) -> dict[str, torch.Tensor]:
    """The overlay of `model`'s low-rank updates (scale folded into B) and of the parameters named in `full`
    (as they are now), detached, in float16 as the zoo ships weights."""
    overlay = {}
    for name, module in model.named_modules():
        if parametrize.is_parametrized(module, "weight"):
            for delta in module.parametrizations.weight:
                if isinstance(delta, LowRankDelta):
                    overlay[f"{name}.weight.lora_A"] = delta.lora_A.detach().half().clone()
                    overlay[f"{name}.weight.lora_B"] = (delta.scale * delta.lora_B.detach()).half().clone()
    params = dict(model.named_parameters())
    for name in full:
        overlay[name] = params[name].detach().half().clone()
    return overlay


def remove_low_rank(model: nn.Module) -> None:
    """Drop every low-rank update, leaving the frozen weights as they were before `add_low_rank`."""
    for module in model.modules():
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)


@torch.no_grad()
def apply_overlay(model: nn.Module, overlay: dict[str, torch.Tensor]) -> None:
    """Merge `overlay` into `model` in place: replacements copied, low-rank updates added in float32.

    Every key must name a parameter of the model with a matching shape, and every update needs both factors:
    anything else is one error (an overlay made for another model must not load half-applied)."""
    state = model.state_dict(keep_vars=True)
    updates: dict[str, dict[str, torch.Tensor]] = {}
    problems = []
    for key, tensor in overlay.items():
        suffix = next((s for s in LOW_RANK_KEYS if key.endswith(s)), None)
        if suffix is not None:
            updates.setdefault(key[: -len(suffix)], {})[suffix] = tensor
        elif key not in state:
            problems.append(f"{key} (no such parameter)")
        elif tuple(state[key].shape) != tuple(tensor.shape):
            problems.append(f"{key} (shape {tuple(tensor.shape)}, the model's {tuple(state[key].shape)})")
    for name, factors in updates.items():
        if name not in state:
            problems.append(f"{name} (no such parameter)")
        elif set(factors) != set(LOW_RANK_KEYS):
            problems.append(f"{name} (a low-rank update needs both lora_A and lora_B)")
        else:
            a, b = factors[".lora_A"], factors[".lora_B"]
            if a.dim() != 2 or b.dim() != 2 or (b.shape[0], a.shape[1]) != tuple(state[name].shape) or a.shape[0] != b.shape[1]:
                problems.append(f"{name} (factors {tuple(b.shape)} @ {tuple(a.shape)}, the model's {tuple(state[name].shape)})")
    if problems:
        raise MMSpecError(f"the overlay does not fit the model: {'; '.join(problems[:4])}")
    for key, tensor in overlay.items():
        if not key.endswith(LOW_RANK_KEYS):
            state[key].copy_(tensor.to(state[key].dtype))
    for name, factors in updates.items():
        weight = state[name]
        merged = weight.float() + factors[".lora_B"].float() @ factors[".lora_A"].float()
        weight.copy_(merged.to(weight.dtype))
