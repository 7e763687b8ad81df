"""A lean greedy step loop over a Whisper decoder's own weights, for drafting.

Why: on a small decoder (the one-layer AR fast decoder of Hybrid Decoding) a transformers
forward costs ~1-2 ms per token on this CPU, almost all of it per-call machinery (cache objects,
mask building, module dispatch) rather than arithmetic. Drafting calls it once per token, so that
overhead decides whether hybrid decoding pays. This module runs the same maths with plain tensor
ops: the cross-attention keys/values are projected once per utterance, the self-attention cache is
two growing tensors per layer, and every projection is one `F.linear` on the module's weights.

It reads a `WhisperDecoder` (pre-norm layers: self-attention, cross-attention, GELU MLP, final
layer norm, learned positions) and never modifies it. Optionally its linear layers and head run as
weight-only int8 copies (`mmspec.kernels.int8_linear`): on a CPU a draft step reads every weight once, so
4x fewer bytes make it several times cheaper. Drafts only: the target verifies every
token, so a rare float-rounding difference from the transformers forward could change a draft,
never the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import MMSpecError


def _linear(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    # An int8 layer of a model at compute type int8 (`precision.RowInt8Linear`) runs itself.
    return F.linear(x, layer.weight, layer.bias) if isinstance(layer, nn.Linear) else layer(x)


def _norm(x: torch.Tensor, layer: nn.LayerNorm) -> torch.Tensor:
    return F.layer_norm(x, layer.normalized_shape, layer.weight, layer.bias, layer.eps)


@dataclass
class LeanDecoderState:
    """Per-utterance caches: cross-attention K/V (fixed) and self-attention K/V (growing), per layer."""

    cross: list[tuple[torch.Tensor, torch.Tensor]]
    self_kv: list[tuple[torch.Tensor, torch.Tensor] | None] = field(default_factory=list)
    length: int = 0  # decoder positions consumed so far


class LeanWhisperDecoder:
    """Greedy steps of a Whisper decoder (+ its output projection) with hand-rolled caches.

    Args:
        decoder: a transformers `WhisperDecoder` (e.g. `model.model.decoder` of a `WhisperForCausalLM`).
        proj_out: the output projection (`model.proj_out`; tied to the token embeddings in Whisper).
        head_weight: rows to project onto instead of `proj_out.weight` (a reduced drafting vocabulary;
            logits then follow these rows' order, with no bias).
        linears: optional {linear module of the decoder: a callable to run instead} (e.g. int8 copies).
        head: optional callable to run instead of the head projection (over the same rows as `head_weight`).
    """

    def __init__(self, decoder: nn.Module, proj_out: nn.Linear, head_weight: torch.Tensor | None = None,
                 linears: dict[nn.Module, Callable] | None = None, head: Callable | None = None) -> None:
        activation = getattr(decoder.config, "activation_function", "gelu")
        if activation != "gelu":
            raise MMSpecError(f"the lean decoder implements Whisper's GELU MLP, not {activation!r}")
        self.decoder, self.proj_out = decoder, proj_out
        self.head_weight = head_weight
        self.linears = linears or {}
        self.head = head
        self.heads = decoder.config.decoder_attention_heads
        self.embed_scale = math.sqrt(decoder.config.d_model) if decoder.config.scale_embedding else 1.0

    def _split(self, x: torch.Tensor) -> torch.Tensor:  # [B, L, D] -> [B, H, L, D/H]
        b, length, d = x.shape
        return x.view(b, length, self.heads, d // self.heads).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:  # [B, H, L, D/H] -> [B, L, D]
        b, h, length, dh = x.shape
        return x.transpose(1, 2).reshape(b, length, h * dh)

    def start(self, encoder_states: torch.Tensor) -> LeanDecoderState:
        """Project the encoder states [B, T, D] into each layer's cross-attention keys and values."""
        cross = []
        for layer in self.decoder.layers:
            attn = layer.encoder_attn
            # Once per utterance over every frame, by the layers as the model runs them (at its compute type) and
            # laid out as transformers' Whisper lays them out (contiguous [B, H, T, D/H]): a target with these very
            # layers can take them as its own (a self-drafter hands them over, see
            # WhisperTarget.reuse_cross_attention), and attention reads them faster.
            cross.append(tuple(self._split(_linear(encoder_states, proj)).contiguous()
                               for proj in (attn.k_proj, attn.v_proj)))
        return LeanDecoderState(cross=cross, self_kv=[None] * len(cross))

    @staticmethod
    def truncate(state: LeanDecoderState, length: int) -> None:
        """Keep the self-attention cache of the first `length` positions only (drop rejected drafts)."""
        if not 0 <= length <= state.length:
            raise MMSpecError(f"cannot truncate a {state.length}-position cache to {length}")
        state.self_kv = [None if kv is None or length == 0 else (kv[0][:, :, :length], kv[1][:, :, :length])
                         for kv in state.self_kv]
        state.length = length

    def embed(self, tokens: torch.LongTensor, start: int) -> torch.Tensor:
        """Token embeddings of `tokens` [B, n] (scaled as Whisper does) plus the positions from `start`."""
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        h = F.embedding(tokens, self.decoder.embed_tokens.weight) * self.embed_scale
        return h + self.decoder.embed_positions.weight[positions]

    def run_layers(self, state: LeanDecoderState, h: torch.Tensor) -> torch.Tensor:
        """The decoder layers over `h` [B, n, D], the newest n positions (their keys/values join the cache);
        returns the last layer's output [B, n, D] before the final layer norm."""
        n = h.shape[1]
        for index, layer in enumerate(self.decoder.layers):
            attn = layer.self_attn
            x = _norm(h, layer.self_attn_layer_norm)
            q, k, v = (self._split(self._linear(x, proj)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
            past = state.self_kv[index]
            if past is not None:
                k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
            state.self_kv[index] = (k, v)
            # The new queries are the last n positions: causal among themselves, free over the past.
            causal = n > 1
            if causal and past is not None:
                mask = torch.ones(n, k.shape[2], dtype=torch.bool, device=h.device).tril(k.shape[2] - n)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            else:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            h = h + self._linear(self._merge(out), attn.out_proj)
            cross = layer.encoder_attn
            x = _norm(h, layer.encoder_attn_layer_norm)
            out = F.scaled_dot_product_attention(self._split(self._linear(x, cross.q_proj)), *state.cross[index])
            h = h + self._linear(self._merge(out), cross.out_proj)
            x = _norm(h, layer.final_layer_norm)
            h = h + self._linear(F.gelu(self._linear(x, layer.fc1)), layer.fc2)
        state.length += n
        return h

    def _linear(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        fast = self.linears.get(layer)
        return fast(x) if fast is not None else _linear(x, layer)

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return _norm(h, self.decoder.layer_norm)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of final-normed `hidden` [..., D]: over the head rows if given, else the whole output projection."""
        if self.head is not None:
            return self.head(hidden)
        # (a bfloat16 model keeps a float32 head: the hidden state meets the head's dtype)
        if self.head_weight is not None and self.head_weight is not self.proj_out.weight:
            return F.linear(hidden.to(self.head_weight.dtype), self.head_weight)
        return F.linear(hidden.to(self.proj_out.weight.dtype), self.proj_out.weight, self.proj_out.bias)

    def step(self, state: LeanDecoderState, tokens: torch.LongTensor) -> torch.Tensor:
        """Feed tokens [B, n] (the prompt at first, then one token); logits [B, V] at the last position."""
        h = self.run_layers(state, self.embed(tokens, state.length))
        return self.logits(self.final_norm(h[:, -1]))
