"""Weight-only int8 copies of linear layers, for drafting on a CPU.

Why: a drafter's step multiplies one token's vector by every weight matrix, so on a CPU it is bound by
reading the weights: whisper-tiny.en's 51864 x 384 output head costs ~8 ms a step in float32 on the
2-core machine, its weight read once per step. Stored as int8 with one scale per output row (the
weight-only int8 scheme of gpt-fast / torchao) the same product is 0.6 ms through PyTorch's
`torch._weight_int8pack_mm` kernel (bfloat16 activations), and a 1536 x 384 MLP matrix 20 us against 56 us.

Drafts only: the rounding (weights to 1/254 of each row's largest magnitude, activations to bfloat16)
can change a draft, never the output, since the target verifies every draft with its own weights.
The originals are never modified: `Int8Linear` holds a copy, made once.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


def int8_drafting_available(device: torch.device | str) -> bool:
    """Whether weight-only int8 products run here: PyTorch's CPU kernel (other devices keep their weights)."""
    return torch.device(device).type == "cpu" and hasattr(torch, "_weight_int8pack_mm")


class Int8Linear:
    """`y = x @ W.T + b` with W stored as int8 rows times a bfloat16 scale per row; x of any float dtype
    [..., in] -> y [..., out] in x's dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        w = weight.detach().float()
        scales = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
        # The CPU kernel needs the inner size to be a multiple of 16 (it crashes otherwise): zero columns pad it.
        self.pad = -w.shape[1] % 16
        w = F.pad(w, (0, self.pad))
        self.qweight = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.scales = scales.to(torch.bfloat16)  # the kernel's scale dtype is the activations'
        self.bias = None if bias is None else bias.detach()
        self.source = weight  # the weights this copy was made from (to tell when it is stale)

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        rows = (F.pad(rows, (0, self.pad)) if self.pad else rows).contiguous()
        y = torch._weight_int8pack_mm(rows, self.qweight, self.scales).view(*x.shape[:-1], self.out_features).to(x.dtype)
        return y if self.bias is None else y + self.bias


def int8_linears(modules: list[nn.Linear], known: dict[nn.Linear, Int8Linear] | None = None) -> dict[nn.Linear, Callable]:
    """{module: its int8 copy} for every linear in `modules`, reusing the copies in `known` that are still of the
    module's current weight."""
    known = known or {}
    result: dict[nn.Linear, Callable] = {}
    for module in modules:
        copy = known.get(module)
        if copy is None or copy.source is not module.weight:
            copy = Int8Linear(module.weight, module.bias)
        result[module] = copy
    return result

