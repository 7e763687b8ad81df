"""Llama decoder maths with plain tensor ops, for drafters' many small forwards.

Why: a drafter runs a small model once per draft token, and on a small model transformers' module
machinery (kwarg plumbing and deprecation wrappers, output capture, mask building, the attention-interface
dispatch) is a large share of a forward: on a 2-core CPU one step of the 2-layer, 256-wide text drafter
took 1.5-1.8 ms through it and 1.1-1.3 ms here; the one-layer, 512-wide MSD / FLASH layer about 1.5 ms
against 0.7 ms for its linear layers and attention. This module computes the same products and sums, in the
same order, on the modules' own weights, with fewer tensor ops (each costs a dispatch that rivals a small model's
arithmetic): the rotary embedding as one roll and a sine with `rotate_half`'s signs folded in (negating a factor is
exact), no float32 casts of float32 values, no transposes of a single position's heads:

- `llama_layer_forward(layer, ...)`: one transformers `LlamaDecoderLayer` (RMSNorm, q/k/v, RoPE,
  SDPA, o_proj, RMSNorm, gated MLP), updating a transformers `DynamicCache` as the layer would;
- `LeanCausalLM(model)`: a `LlamaForCausalLM` forward (embedding, layers, norm, head) on top of a
  `DynamicCache`, used by `CachedModel` for a drafter's incremental steps.

Nothing in transformers is modified: the model and its cache stay what they are, so transformers'
own forward can take over at any time (prefills, batches, anything this does not cover). Drafters use it
wherever it applies: a rounding difference there could change a draft, never the output. A target verifies
through it only where it is bitwise the model's own forward (float32 on a CPU, a chain of tokens: see
`Target._lean_covers` and its tests), so the verified logits are the ones transformers' forward gives.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from ..compat import accelerate_hook, attention_implementation

# Attention implementations whose maths SDPA reproduces (eager computes the same softmax(QK^T)V).
SDPA_EQUIVALENT = ("sdpa", "eager", "", None)


def has_hooks(module: nn.Module) -> bool:
    """Whether forward hooks are registered on `module` itself (a lean forward would not call them)."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


def plain_modules(module: nn.Module) -> bool:
    """No hooks anywhere (accelerate's bring offloaded weights; a user's expect to be called) and every linear
    layer a plain `nn.Linear` (quantised layers keep their weights in another form)."""
    for part in module.modules():
        if accelerate_hook(part) is not None or has_hooks(part) or (isinstance(part, nn.Linear) and type(part) is not nn.Linear):
            return False
    return True


# Layers whose structure was checked (weights, hooks, attention implementation), checked once each: a drafter
# asks before every forward, and walking the modules costs more than a small forward saves.
_CHECKED_LAYERS: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()


def lean_layer_supported(layer: nn.Module) -> bool:
    """Whether `llama_layer_forward` computes what `layer` does: a transformers `LlamaDecoderLayer` in eval mode,
    with SDPA or eager attention, plain weights and no hooks."""
    if type(layer) is not LlamaDecoderLayer or layer.training or has_hooks(layer):
        return False
    plain = _CHECKED_LAYERS.get(layer)
    if plain is None:
        implementation = attention_implementation(layer.self_attn.config)
        plain = _CHECKED_LAYERS[layer] = implementation in SDPA_EQUIVALENT and plain_modules(layer)
    return plain


def rms_norm(norm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """`norm(hidden)` for a `LlamaRMSNorm`: its float32 round trip is two no-op casts on float32 input, skipped here
    (the same operations on the same values otherwise). Any other norm runs its own forward."""
    if type(norm) is not LlamaRMSNorm or hidden.dtype is not torch.float32:
        return norm.forward(hidden)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return norm._parameters["weight"] * (hidden * torch.rsqrt(variance + norm.variance_epsilon))


class Rotation:
    """The rotary embedding of one forward, shaped once for every layer: cos [B, 1, L, D] and the sine with the sign
    of transformers' `rotate_half` folded in, so that `rotate(x)` = x * cos + roll(x, D/2) * signed sine (4 tensor ops
    where `apply_rotary_pos_emb` takes 8, with the same products and sums: negating a factor is exact)."""

    __slots__ = ("cos", "half", "signed_sin")

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """From cos and sin [B, 1, L, D]."""
        self.half = sin.shape[-1] // 2
        self.cos = cos
        self.signed_sin = sin * _half_signs(sin.shape[-1], sin.dtype, sin.device)

    @classmethod
    def of(cls, position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> "Rotation":
        """From a rotary embedding module's output: (cos, sin) [B, L, D]."""
        cos, sin = position_embeddings
        return cls(cos.unsqueeze(1), sin.unsqueeze(1))

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.cos + x.roll(self.half, -1) * self.signed_sin


def plain_rotary(rotary: nn.Module) -> bool:
    """Whether `rotary` is a transformers `LlamaRotaryEmbedding` of the default kind (fixed frequencies, no scaling):
    then `default_rotation` computes what its forward does."""
    return (type(rotary) is LlamaRotaryEmbedding and getattr(rotary, "rope_type", None) == "default"
            and getattr(rotary, "attention_scaling", None) == 1.0)


def default_rotation(rotary: nn.Module, positions: torch.Tensor, dtype: torch.dtype) -> Rotation:
    """The `Rotation` at `positions` (float32 [L] for one row of consecutive positions, else long [B, L]) of a
    `plain_rotary` module: its forward's products of positions and frequencies, cos and sin over the same
    [B, L, D] elements in the same order (so the same vectorised kernels), without its per-call wrappers."""
    inv_freq = rotary._buffers["inv_freq"]
    if inv_freq.dtype is not torch.float32:
        inv_freq = inv_freq.float()
    if positions.dim() == 1:  # whole numbers, exact in float32 as the forward's long-to-float cast gives them
        freqs = torch.outer(positions, inv_freq)[None, None]
    else:
        freqs = positions[:, None, :, None].float() * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    if dtype is not torch.float32:
        cos, sin = cos.to(dtype), sin.to(dtype)
    return Rotation(cos, sin)


_SIGNS: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}


def _half_signs(width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[-1] * (width / 2) + [1] * (width / 2): the signs `rotate_half` gives the two halves."""
    key = (width, dtype, device)
    signs = _SIGNS.get(key)
    if signs is None:
        signs = _SIGNS[key] = torch.ones(width, dtype=dtype, device=device).index_fill_(
            0, torch.arange(width // 2, device=device), -1)
    return signs


def llama_layer_forward(layer: LlamaDecoderLayer, hidden: torch.Tensor,
                        position_embeddings: tuple[torch.Tensor, torch.Tensor] | Rotation,
                        attention_mask: torch.Tensor | None, cache: Any = None) -> torch.Tensor:
    """`layer(hidden, ...)` as transformers computes it: hidden [B, L, H] -> [B, L, H].

    position_embeddings: (cos, sin) [B, L, D] from the model's rotary embedding, or their `Rotation` (made once for
    all layers); attention_mask: an additive [B, 1, L, past + L] mask, or None: one query sees every key; several
    queries without a cache see causally (as SDPA's `is_causal`); cache: a `DynamicCache` updated with this layer's
    keys and values (None: no cache).
    """
    # Submodules and weights straight from the modules' own dicts: `nn.Module.__getattr__` is a Python call per
    # attribute (about 30 a layer), and `module(x)` two more around `forward`. The checks `lean_layer_supported`
    # made (plain linear layers, no hooks) are what lets this skip them.
    parts = layer._modules
    attention, mlp = parts["self_attn"], parts["mlp"]
    projections, mlp_parts = attention._modules, mlp._modules
    q, k, v, o = (projections["q_proj"]._parameters, projections["k_proj"]._parameters,
                  projections["v_proj"]._parameters, projections["o_proj"]._parameters)
    gate_w, up_w, down_w = (mlp_parts["gate_proj"]._parameters, mlp_parts["up_proj"]._parameters,
                            mlp_parts["down_proj"]._parameters)
    batch, length, _ = hidden.shape
    shape = (batch, length, -1, attention.head_dim)
    residual = hidden
    x = rms_norm(parts["input_layernorm"], hidden)
    if length == 1:  # [B, 1, heads * D] read as [B, heads, 1, D] directly: the same elements in the same order
        shape = (batch, -1, 1, attention.head_dim)
        query = F.linear(x, q["weight"], q["bias"]).view(shape)
        key = F.linear(x, k["weight"], k["bias"]).view(shape)
        value = F.linear(x, v["weight"], v["bias"]).view(shape)
    else:
        query = F.linear(x, q["weight"], q["bias"]).view(shape).transpose(1, 2)
        key = F.linear(x, k["weight"], k["bias"]).view(shape).transpose(1, 2)
        value = F.linear(x, v["weight"], v["bias"]).view(shape).transpose(1, 2)
    rotation = position_embeddings if isinstance(position_embeddings, Rotation) else Rotation.of(position_embeddings)
    query, key = rotation.rotate(query), rotation.rotate(key)
    if cache is not None:
        key, value = cache.update(key, value, attention.layer_idx)
    if attention_mask is not None and attention_mask.shape[-1] != key.shape[-2]:
        attention_mask = attention_mask[..., : key.shape[-2]]
    # As transformers' SDPA path: no mask over several queries means causal (callers with a cache pass a mask).
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=attention.scaling,
                                         is_causal=attention_mask is None and length > 1,
                                         enable_gqa=key.shape[1] != query.shape[1])
    out = out.reshape(batch, 1, -1) if length == 1 else out.transpose(1, 2).reshape(batch, length, -1)
    hidden = residual + F.linear(out, o["weight"], o["bias"])
    x = rms_norm(parts["post_attention_layernorm"], hidden)
    gate = F.linear(x, gate_w["weight"], gate_w["bias"])
    up = F.linear(x, up_w["weight"], up_w["bias"])
    return hidden + F.linear(mlp_parts["act_fn"].forward(gate) * up, down_w["weight"], down_w["bias"])


def causal_mask(query_length: int, past_length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """Additive mask [1, 1, q, past + q]: query i sees keys <= past + i. None for one query (it sees everything)."""
    if query_length == 1:
        return None
    # The lowest value above the diagonal past + i (the keys query i must not see), zero on and below it.
    blocked = torch.full((1, 1, query_length, past_length + query_length), torch.finfo(dtype).min, dtype=dtype, device=device)
    return blocked.triu_(past_length + 1)


class LeanCausalLM:
    """Incremental forwards of a transformers `LlamaForCausalLM` over its `DynamicCache`, without the module machinery.

    `supports(model)` says whether a model qualifies: a plain Llama (no sliding window), every layer a
    `LlamaDecoderLayer` in eval mode, no hooks. `CachedModel` checks again for hooks on the model itself
    before each step (registered later, they send the step through the model's own forward).
    """

    def __init__(self, model: LlamaForCausalLM) -> None:
        self.model = model
        self.decoder = model.model
        self.layers = list(self.decoder.layers[: model.config.num_hidden_layers])
        # Held once, as the layers are: each step reads them without `nn.Module.__getattr__`.
        self.embed_tokens, self.rotary_emb, self.norm = self.decoder.embed_tokens, self.decoder.rotary_emb, self.decoder.norm
        self.plain_rotary = plain_rotary(self.rotary_emb)
        self.lm_head = model.lm_head

    @staticmethod
    def supports(model: nn.Module) -> bool:
        if type(model) is not LlamaForCausalLM or model.training:
            return False
        if getattr(model.config, "sliding_window", None) is not None:
            return False
        layers = model.model.layers[: model.config.num_hidden_layers]
        return plain_modules(model) and all(lean_layer_supported(layer) for layer in layers)

    def forward(self, input_ids: torch.LongTensor, cache: Any, logits_to_keep: int = 1,
                attention_mask: torch.Tensor | None = None, position_ids: torch.LongTensor | None = None) -> torch.Tensor:
        """Logits [B, logits_to_keep or L, V] of `input_ids` [B, L] fed on top of `cache` (updated in place).

        attention_mask: an additive [B, 1, L, past + L] mask (a draft tree's), else causal; position_ids
        [B, L]: default past + 0..L-1.
        """
        hidden = self.hidden_states(input_ids, cache, attention_mask, position_ids)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        head = self.lm_head._parameters
        return F.linear(hidden, head["weight"], head["bias"])

    def hidden_states(self, input_ids: torch.LongTensor, cache: Any, attention_mask: torch.Tensor | None = None,
                      position_ids: torch.LongTensor | None = None) -> torch.Tensor:
        """The base model's last hidden state [B, L, H] (after the final norm), as `model.model(...)` returns it."""
        past = cache.get_seq_length()
        hidden = F.embedding(input_ids, self.embed_tokens._parameters["weight"], self.embed_tokens.padding_idx)
        length = input_ids.shape[1]
        if attention_mask is None:
            attention_mask = causal_mask(length, past, hidden.dtype, hidden.device)
        elif attention_mask.dtype is not hidden.dtype:
            attention_mask = attention_mask.to(hidden.dtype)
        if self.plain_rotary:
            positions = position_ids if position_ids is not None else torch.arange(
                past, past + length, dtype=torch.float32, device=hidden.device)
            rotation = default_rotation(self.rotary_emb, positions, hidden.dtype)
        else:
            if position_ids is None:
                position_ids = torch.arange(past, past + length, device=hidden.device)[None]
            rotation = Rotation.of(self.rotary_emb(hidden, position_ids))
        for layer in self.layers:
            hidden = llama_layer_forward(layer, hidden, rotation, attention_mask, cache)
        return rms_norm(self.norm, hidden)
