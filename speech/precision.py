"""Compute types: the precision a Whisper model runs at, chosen by the user (as faster-whisper's `compute_type`).

  float32   the weights as loaded, float32 arithmetic (the default).
  bfloat16  the model cast to bfloat16 (weights and activations), except the output head, which stays
            float32 (`Float32Head`: the bfloat16 hidden state times the float32 head weights, float32
            logits); the decoder's attention runs query row by query row (`ROW_ATTENTION`, below) and
            its linear layers token row by token row (`RowByRowLinear`).
  int8      every linear layer of the encoder and of the decoder layers runs as int8 x int8 products:
            weights quantised once, symmetrically, one scale per output row; activations quantised on
            the fly, one scale per input row (per token / per frame); exact int32 accumulation
            (`torch._int_mm`), then rescaled to float32 and the bias added. Layer norms, attention,
            convolutions, embeddings and the output head stay float32 (the head's greedy choices come
            from the certified bfloat16 head on a CPU, see `mmspec.kernels.certified_head`). The decoder's
            attention runs query row by query row (`ROW_ATTENTION`, below). Over the encoder's [frames x width]
            the layers keep their intermediates in reused buffers (`_scratch`; the same values): a fresh buffer
            that size cost more than the int8 product. A self-drafter drafts through these same layers: weight-only
            int8 copies of them made a drafting step cheaper but lowered acceptance (alpha 0.77 -> 0.69 on tiny.en's
            held-out clips), for no net gain.

Each compute type is a different model, with its own greedy output: "exact" (hybrid strict) means
identical to the greedy `generate` of the same model at the same compute type, never to float32's.

Why per-row activation scales: a verification forward scores k + 1 positions at once where greedy
`generate` scores one. With one scale per input row and integer accumulation, every output row of an
int8 layer depends on its own input row only, bit for bit, whatever else is in the batch; a per-tensor
scale (`torch.ao`'s dynamic quantisation) would make a position's result depend on the drafts beside it.
Attention is the other place where rows meet: SDPA over several query rows rounds differently from SDPA
over one, and an activation that rounds to the other side of an int8 step turns a last-bit difference
into a visible one (a tied choice between "." and "," then flips). So an int8 model's decoder attends
row by row (`row_attention`, registered with transformers' `AttentionInterface`, not patched in): each
query row is one SDPA call over exactly the keys it may see, the very call greedy decoding makes when it
reaches that position. Every decoder row then comes out bit for bit as in one-token-at-a-time decoding,
whatever the verification batches together; only the head's near-ties (float32 rounding of the last
product, as at float32) remain. A prefill is the exception: the prompt's rows attend in one call, which
greedy decoding's own prefill makes too (drafts never join a prefill at these compute types).
The bfloat16 products, unlike int8's, round differently with the number of rows (a 10-row product of
the decoder's layers differed from ten 1-row ones in the last bit; an output head over bfloat16 logits,
8 bits, then turned ties the other way on 2 of 22 tiny.en clips). So a bfloat16 decoder attends row by
row, runs each linear layer one token row at a time (the 1-row product greedy decoding makes; the
cross-attention projections of the encoder states one recording at a time) and keeps a float32 head,
whose greedy choice the certified head serves as at float32. This costs bfloat16 verification passes
part of their advantage (a pass runs k + 1 one-row products per layer); int8 is the fast exact setting.
At float32 the products themselves round differently with the number
of rows (the BLAS picks other kernels), so row-by-row attention would not make it exact; it keeps SDPA,
and its exactness stays what the tests and benches measure.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from ..errors import MMSpecError

COMPUTE_TYPES = ("float32", "int8", "bfloat16")
DEFAULT_COMPUTE_TYPE = "float32"


def check_compute_type(compute_type: str | None) -> str:
    """The compute type by name (None: float32); one clear error for anything else."""
    if compute_type is None:
        return DEFAULT_COMPUTE_TYPE
    if compute_type not in COMPUTE_TYPES:
        raise MMSpecError(f"unknown compute type {compute_type!r}; choose from {', '.join(COMPUTE_TYPES)}")
    return compute_type


def int8_products_available(device: torch.device | str) -> bool:
    """Whether int8 x int8 -> int32 products run here (PyTorch's CPU kernel)."""
    return torch.device(device).type == "cpu" and hasattr(torch, "_int_mm")


_TINY = torch.finfo(torch.float32).tiny
_LARGE = 1 << 16  # elements of an int8 layer's operands above which its intermediates reuse buffers (`_scratch`)
_buffers = threading.local()


def _scratch(name: str, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A reused buffer of `shape` for an int8 layer's intermediates, one per name and thread, grown as needed.

    Why: the encoder's products are [1500 frames x width] per window; a fresh tensor that large is new memory
    from the system each time (zeroed page by page), which cost more than the int8 product itself. The
    intermediates (|x| and quotients, int32 sums, the scale grid) never leave the layer, so they can live in
    buffers kept between calls; the layer's result is always a fresh tensor."""
    numel = math.prod(shape)
    held: dict[tuple[str, bool], torch.Tensor] = _buffers.__dict__.setdefault("held", {})
    key = (name, torch.is_inference_mode_enabled())  # an inference tensor cannot be written outside inference mode
    buffer = held.get(key)
    if buffer is None or buffer.dtype != dtype or buffer.device != device or buffer.numel() < numel:
        buffer = held[key] = torch.empty(numel, dtype=dtype, device=device)
    return buffer[:numel].view(shape)


class RowInt8Linear(nn.Module):
    """A linear layer as int8 products: `y = (q(x) @ Wq.T) * sx * sw + b` (see the module docstring).

    Made from an `nn.Linear` (float weights, copied; the original is not changed). Input [..., in] in any
    float dtype; output [..., out] in float32.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        scales = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
        qweight = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("qweight", qweight.contiguous())  # [out, in]; the kernel reads its transpose
        self.register_buffer("weight_scales", scales)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    @staticmethod
    def quantise_rows(x: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """int8 rows of x [M, in] (symmetric, one scale per row) and the scales [M]; `out`: a float32 buffer
        [M, in] for the intermediates (see `_scratch`).

        No clamp to [-127, 127]: a row's largest |x| divided by its own scale (that value / 127, rounded) is 127
        within two roundings, so every quotient already rounds into the range; non-finite input stays
        non-finite either way. The values are those of `reference_row_int8_linear`, bit for bit."""
        work = torch.abs(x, out=out) if out is not None else x.abs()
        scales = work.amax(dim=1).clamp_min_(_TINY).div_(127)
        quotients = torch.div(x, scales[:, None], out=work).round_()
        return quotients.to(torch.int8), scales

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32:
            rows = rows.float()
        m, n = rows.shape[0], self.out_features
        # (buffers written with out= carry no autograd history: only when none is being recorded)
        large = m * max(n, self.in_features) >= _LARGE and not (torch.is_grad_enabled() and rows.requires_grad)
        q, row_scales = self.quantise_rows(rows, _scratch("quantise", rows.shape, torch.float32, rows.device) if large else None)
        if large:  # the encoder's [frames, width] products: int32 sums and the scale grid in reused buffers
            sums = torch._int_mm(q, self.qweight.t(), out=_scratch("sums", (m, n), torch.int32, rows.device))
            grid = torch.mul(row_scales[:, None], self.weight_scales[None, :], out=_scratch("grid", (m, n), torch.float32, rows.device))
        else:
            sums = torch._int_mm(q, self.qweight.t())
            grid = row_scales[:, None] * self.weight_scales[None, :]
        y = sums.float().mul_(grid)  # the one fresh [M, out] tensor: the result
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights x int8 rows"


class RowByRowLinear(nn.Module):
    """A linear layer of a bfloat16 decoder run on one row at a time, as greedy decoding runs it (see the module
    docstring): `per_token` (the layers over token positions) one token of one recording per product; else (the
    cross-attention projections of the encoder states) one recording per product."""

    def __init__(self, linear: nn.Linear, per_token: bool = True) -> None:
        super().__init__()
        self.linear, self.per_token = linear, per_token
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or (x.shape[0] == 1 and (x.shape[1] == 1 or not self.per_token)):
            return self.linear(x)
        if not self.per_token:
            return torch.cat([self.linear(x[b:b + 1]) for b in range(x.shape[0])])
        return torch.cat([torch.cat([self.linear(x[b:b + 1, t:t + 1]) for t in range(x.shape[1])], dim=1)
                          for b in range(x.shape[0])])


class Float32Head(nn.Linear):
    """An output head kept in float32 in a bfloat16 model: float32 logits of a hidden state of any dtype."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=torch.float32)
        self.weight = nn.Parameter(weight.detach().float().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight)


def reference_row_int8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What `RowInt8Linear` computes, in plain float64 arithmetic (for tests): the same roundings, exact sums."""
    w_scales = weight.double().abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
    wq = torch.round(weight.double() / w_scales[:, None]).clamp(-127, 127)
    rows = x.reshape(-1, x.shape[-1]).double()
    x_scales = rows.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
    xq = torch.round(rows / x_scales[:, None]).clamp(-127, 127)
    y = (xq @ wq.T) * x_scales[:, None] * w_scales[None, :]
    y = y if bias is None else y + bias.double()
    return y.view(*x.shape[:-1], weight.shape[0])


ROW_ATTENTION = "mmspec_row_sdpa"


_prefill = threading.local()  # whether the decoder forward now running is a prefill (`row_attention`)


def row_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs: object) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, one query row at a time in a decoder (see the module docstring); the
    encoder's attention, any single-row call and a decoder prefill are plain SDPA.

    A prefill (a forward whose self-attention has no past: as many keys as query rows) attends in one call:
    its rows are the prompt, which greedy decoding feeds in one forward too, so both make this same call
    (drafts never join a prefill at these compute types: `WhisperTarget.drafts_can_join_prefill`). Row by
    row, a prompt of a few hundred tokens (the previous text of long audio) cost more than all its decoding.
    The cross-attention of a layer follows its self-attention in the same forward: it reads the flag the
    self-attention left."""
    rows = query.shape[2]
    if not getattr(module, "is_decoder", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)  # type: ignore[arg-type]
    causal = kwargs.pop("is_causal", None)
    causal = getattr(module, "is_causal", True) if causal is None else causal
    keys = key.shape[2]
    if causal:
        _prefill.active = keys == rows
    if rows == 1 or getattr(_prefill, "active", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, is_causal=causal, **kwargs)  # type: ignore[arg-type]
    outputs = []
    for row in range(rows):
        seen = keys - rows + row + 1 if causal else keys  # the keys this row's position may attend to
        mask = None if attention_mask is None else attention_mask[:, :, row:row + 1, :seen]
        out, _ = sdpa_attention_forward(module, query[:, :, row:row + 1].contiguous(), key[:, :, :seen].contiguous(),  # type: ignore[arg-type]
                                        value[:, :, :seen].contiguous(), mask, **kwargs)
        outputs.append(out)
    return torch.cat(outputs, dim=1), None  # [batch, rows, heads, head dim], as sdpa_attention_forward returns


AttentionInterface.register(ROW_ATTENTION, row_attention)
# transformers builds no attention mask for an attention name its mask interface does not know: without this, a batch's
# left padding and a ragged batch's rejected drafts would be attended to
ALL_MASK_ATTENTION_FUNCTIONS.register(ROW_ATTENTION, sdpa_mask)


def quantisable_linears(model: PreTrainedModel) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, linear) of every linear layer inside the encoder's and the decoder's layers."""
    found = []
    for stack in (model.get_encoder(), model.get_decoder()):
        for layer in stack.layers:
            for parent in layer.modules():
                for name, child in parent.named_children():
                    if isinstance(child, nn.Linear):
                        found.append((parent, name, child))
    return found


def quantise_int8(model: PreTrainedModel) -> PreTrainedModel:
    """`model` with its encoder and decoder layers' linears replaced by `RowInt8Linear` (in place; returned)."""
    device = next(model.parameters()).device
    if not int8_products_available(device):
        raise MMSpecError(f"compute type int8 runs on a CPU (PyTorch's int8 product kernel); the model is on {device}: "
                          "use float32 or bfloat16 there")
    for parent, name, linear in quantisable_linears(model):
        setattr(parent, name, RowInt8Linear(linear))
    model.set_attn_implementation(ROW_ATTENTION)
    return model


def apply_compute_type(model: PreTrainedModel, compute_type: str | None) -> PreTrainedModel:
    """`model` at `compute_type` (in place; returned): bfloat16 casts it, int8 quantises its layers' linears."""
    compute_type = check_compute_type(compute_type)
    current = compute_type_of(model)
    if current == compute_type:
        return model
    if current != "float32":
        raise MMSpecError(f"the model already runs at compute type {current}; load it again for {compute_type}")
    if compute_type == "bfloat16":
        head = model.get_output_embeddings()
        if head.bias is not None:
            raise MMSpecError("compute type bfloat16 keeps the output head in float32, and expects one without a bias")
        kept = Float32Head(head.weight)  # copied before the cast (a tied head shares the embeddings' tensor)
        model = model.to(torch.bfloat16)
        model.set_output_embeddings(kept)
        for layer in model.get_decoder().layers:
            found = [(parent, name, child) for parent in layer.modules() for name, child in parent.named_children()
                     if isinstance(child, nn.Linear)]
            for parent, name, child in found:  # replaced after the walk: a wrapper holds the layer it replaces
                cross = parent is getattr(layer, "encoder_attn", None) and name in ("k_proj", "v_proj")
                setattr(parent, name, RowByRowLinear(child, per_token=not cross))
        model.set_attn_implementation(ROW_ATTENTION)
    elif compute_type == "int8":
        model = quantise_int8(model)
    return model


def compute_type_of(model: PreTrainedModel) -> str:
    """The compute type a model runs at: int8 if its layers were quantised here, else its float dtype's."""
    if any(isinstance(m, RowInt8Linear) for m in model.modules()):
        return "int8"
    dtype = next(model.parameters()).dtype
    return {torch.bfloat16: "bfloat16", torch.float32: "float32"}.get(dtype, str(dtype).removeprefix("torch."))


def has_compute_type_layers(model: nn.Module) -> bool:
    """Whether `apply_compute_type` replaced layers of `model` (int8 or bfloat16: not saved as such)."""
    return any(isinstance(m, (RowInt8Linear, RowByRowLinear, Float32Head)) for m in model.modules())

