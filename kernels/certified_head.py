"""Exact greedy choices over a large output head at bfloat16 cost, on a CPU.

Why: greedy verification needs only each row's argmax over the output head's logits, yet a float32
head is the biggest product of a verification forward: whisper-tiny.en's 51864 x 384 head takes
~24 ms for 24 rows on the 2-core machine, against ~7 ms in bfloat16.

How: the bfloat16 product gives every logit to within a radius that follows from rounding alone
(inputs and output to bfloat16, float32 accumulation, and the float32 reference's own accumulation),
bounded through Cauchy-Schwarz by the row's weight norm times the hidden state's norm. A logit more than
twice the radius below its row's best cannot be the float32 argmax; the few that remain (the
candidates) are computed again in float32. The returned logits are float32 on the candidates and below
the best candidate's float32 logit everywhere else, so `argmax` gives the float32 head's choice. They
are NOT logits for anything else (probabilities, top-k): use them for greedy choices only.

A candidate's float32 logit is its own dot product, whose summation order differs from the full head's:
two logits within float32 rounding of each other may come out in either order, as they already may
between `generate`'s one-row head product and a verification forward's (k + 1)-row one.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
import torch.nn.functional as F

_BF16_UNIT = 2.0 ** -8  # bfloat16 unit roundoff (8 significant bits, round to nearest)
_FP32_UNIT = 2.0 ** -24
# Above this many candidates in a call, one float32 product of the whole head is cheaper than the gathers.
MAX_CANDIDATES = 4096


def _gamma(n: int) -> float:
    """Higham's gamma_n: the relative bound of n float32 roundings in a sum."""
    return n * _FP32_UNIT / (1 - n * _FP32_UNIT)


def certified_head_available(weight: torch.Tensor) -> bool:
    """Whether `CertifiedHead` serves this head weight: float32 on a CPU (elsewhere the float32 head stays)."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2


_HEADS: dict[int, tuple[weakref.ref, "CertifiedHead"]] = {}
_NORM_ROWS = 4096  # rows per float64 slice: a whole 51864-row head in float64 would be a 160 MB copy


def _max_row_norm(weight: torch.Tensor) -> float:
    """The largest row norm of `weight`, each row's computed in float64 (a slice at a time: the same values)."""
    return max(float(weight[start:start + _NORM_ROWS].double().norm(dim=1).max())
               for start in range(0, weight.shape[0], _NORM_ROWS))


def certified_head_for(weight: torch.Tensor) -> "CertifiedHead":
    """The `CertifiedHead` of `weight`, made once per weight tensor and kept while the tensor lives and is
    unchanged (targets are made per call; the bfloat16 copy and norms take ~50 ms for a 51864-row head)."""
    known = _HEADS.get(id(weight))
    if known is not None and known[0]() is weight and not known[1].is_stale(weight):
        return known[1]
    for key in [key for key, (ref, _) in _HEADS.items() if ref() is None]:
        del _HEADS[key]
    head = CertifiedHead(weight)
    _HEADS[id(weight)] = (weakref.ref(weight), head)
    return head


class CertifiedHead:
    """Greedy-exact logits of `hidden @ weight.T` (a head without bias), from a bfloat16 product.

    `weight` [V, D] float32 is read, never modified; its bfloat16 copy and row norms are made once
    (`source` tells when they are stale). `calls`, `rows`, `candidates` and `fallbacks` count the work.
    """

    def __init__(self, weight: torch.Tensor) -> None:
        if not certified_head_available(weight):
            raise ValueError("CertifiedHead needs a float32 [vocab, hidden] weight on a CPU")
        self.source = weight
        self._version = weight._version
        self.weight = weight.detach()
        self.weight_bf16 = self.weight.to(torch.bfloat16).contiguous()
        inner = self.weight.shape[1]
        # |bf16 product - float32 product| <= scale * |W_r| * |h| + OUTPUT * |bf16 logit|: two input roundings, the
        # accumulation (products of bfloat16 values are exact in float32; 2 * inner roundings covers paired
        # dot-product instructions) and the float32 reference's own accumulation. Norms in float64, rounded up.
        u = _BF16_UNIT
        self.scale = (2 * u + u * u + (1 + u) ** 2 * _gamma(2 * inner) + _gamma(inner)) * (1 + 1e-6)
        self.output = u / (1 - u)
        self.max_row_norm = _max_row_norm(self.weight) * (1 + 1e-6)
        self.calls = self.rows = self.candidates = self.fallbacks = 0

    def is_stale(self, weight: torch.Tensor) -> bool:
        return weight is not self.source or weight._version != self._version

    def logits(self, hidden: torch.Tensor, process: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """hidden [..., D] -> float32 logits [..., V] whose argmax over V is the float32 head's.

        `process` (optional) maps logits [..., V] to processed ones and must only mask (set entries to -inf,
        leave the rest as they are; e.g. Whisper's token suppression): the argmax is then the processed
        float32 logits' argmax, and the result comes back processed.
        """
        shape = hidden.shape
        rows = hidden.reshape(-1, shape[-1]).float()
        approx = F.linear(rows.to(torch.bfloat16), self.weight_bf16).float()
        self.calls += 1
        self.rows += rows.shape[0]
        norms = rows.double().norm(dim=1)
        if not bool(torch.isfinite(norms).all()):
            return self._exact(rows, shape, process)
        # One radius per row: the largest any of its logits can have (the candidates are recomputed anyway).
        radius = (self.scale * self.max_row_norm * norms + self.output * approx.abs().amax(dim=1).double()) * (1 + 1e-6) + 1e-30
        if process is not None:
            approx = process(approx.view(*shape[:-1], -1)).reshape(rows.shape[0], -1)
        best = approx.amax(dim=1)
        if not bool(torch.isfinite(best).all()):
            return self._exact(rows, shape, process)  # a row with every token masked: let the full head decide
        # A logit below best - 2 * radius cannot beat the best one's float32 value (best - radius at least).
        # (one float32 step down: the float32 floor must not exceed the float64 one)
        floor = (best.double() - 2 * radius).float()
        floor = torch.nextafter(floor, torch.full_like(floor, -float("inf")))
        row_ids, token_ids = (approx >= floor[:, None]).nonzero(as_tuple=True)
        if row_ids.numel() > MAX_CANDIDATES:
            return self._exact(rows, shape, process)
        self.candidates += row_ids.numel()
        exact = (self.weight.index_select(0, token_ids) * rows.index_select(0, row_ids)).sum(dim=1)
        approx[row_ids, token_ids] = exact
        return approx.view(*shape[:-1], -1)

    def _exact(self, rows: torch.Tensor, shape: torch.Size, process: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
        self.fallbacks += 1
        logits = F.linear(rows, self.weight).view(*shape[:-1], -1)
        return logits if process is None else process(logits)
