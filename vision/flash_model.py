"""FLASH's trainable drafter: latent-aware visual compression + a semi-autoregressive feature head.

Wang et al., "FLASH: Latent-Aware Semi-Autoregressive Speculative Decoding for Multimodal Tasks",
arXiv 2505.12728. The paper gives two ideas; the authors' released code does not implement them
(its runnable path is plain EAGLE-1), so every choice below is ours, written from the paper:

- Latent-aware compression: learned queries C [m, H] summarise the visual embeddings F [V, H]
  of one image or video as softmax(C F^T / sqrt(H)) F ([m, H]). The sqrt(H) scaling is ours (it
  keeps the softmax from saturating at large H). F is the projector output the target consumed
  (`embeds` = target hidden_states[0] at the visual positions). Each contiguous run of visual
  placeholders (one image, or one video) is compressed on its own, always to m tokens (also when
  V < m, so training and drafting see one layout).
- Drafter sequence: [text before the image; m compressed tokens; text after]. Compressed tokens
  enter the decoder layer as they are (no fc), like MSD's visual positions. Positions (RoPE):
  text keeps its true positions, so text-to-text distances equal the target's; the m compressed
  tokens are spread evenly over the span they replace (linspace(start, end - 1, m), rounded), so
  text-to-visual distances stay close to the target's too. On a Qwen2-VL target the positions
  are the target's M-RoPE ones (`rope_positions`): text at its own, the m tokens spread over the
  block's t/h/w span, the same on all three axes. Attention is causal in sequence order.
- Text positions are EAGLE's: h_t = fc([e_{t+1}; f_t]) with e_{t+1} the target's input
  embedding of the next token and f_t the target's last hidden state, into one
  `LlamaDecoderLayer` (transformers' own, with its own rotary embedding).
- Semi-autoregressive head: the layer output z_t at text position t predicts n = semi_ar_tokens
  future features f_{t+1..t+n} at once. Offset 1 is z_t itself (so n = 1 is exactly EAGLE-1);
  offset j >= 2 is z_t + MLP(norm(z_t))_j, an MLP H -> head_hidden_size -> (n - 1) H whose output
  layer starts at zero (an untrained head repeats z_t). The frozen LM head turns each predicted
  feature into draft logits, so one forward yields n draft tokens.
- `compress=False` keeps every visual embedding at its true position (the ablation).
- The last prompt position (and everything after it) is always a text input, even if it holds
  a visual placeholder: it is the position that drafts the first new token.
- Training: EAGLE's loss (SmoothL1 on features + 0.1 x soft cross-entropy through the LM head)
  for each offset j, on position t against features[t + j] where loss_mask[t + j - 1] holds;
  offsets are weighted proportionally to offset_weight_decay^(j - 1) (default 0.8: a far offset
  only pays off when the nearer ones were accepted), normalised to sum 1, so n = 1 is exactly
  EAGLE's loss. Uniform noise goes on the input features only.

The model stores neither the target's embedding table nor its LM head: both are borrowed.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, LlamaConfig, PreTrainedConfig
from transformers import initialization as init
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

from ..cached_model import cache_argument
from ..compat import attention_implementation, set_attention_implementation
from ..errors import MMSpecError
from ..kernels.lean_llama import lean_layer_supported, llama_layer_forward
from .feature_drafter import (
    DistillBatch,
    FeatureDrafterModel,
    drafter_layer_config,
    eagle_loss,
    plain_rope_parameters,
    target_layer_shape,
    uniform_noise_like,
)
from .own_device import on_own_device
from .rope_positions import mrope_section as target_mrope_section
from .rope_positions import require_trace_positions, rotary_embedding

# ---- pure tensor functions -------------------------------------------------------------------


def compress_visual(queries: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Latent-aware compression (FLASH, arXiv 2505.12728): softmax(C F^T / sqrt(H)) F.

    queries C [m, H], features F [..., V, H] -> [..., m, H]: each output is a convex combination
    of the visual features, weighted by how well they match one learned query.
    """
    scores = torch.einsum("mh,...vh->...mv", queries.to(features.dtype), features) / math.sqrt(features.shape[-1])
    return scores.softmax(dim=-1) @ features


def visual_runs(visual: torch.Tensor) -> list[tuple[int, int]]:
    """Contiguous runs of True in a 1-D bool mask, as half-open (start, end) pairs."""
    flags = visual.long().tolist()
    runs, start = [], None
    for i, flag in enumerate(flags + [0]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i))
            start = None
    return runs


def spread_positions(start: int, end: int, count: int, device: torch.device | str | None = None) -> torch.LongTensor:
    """`count` positions spread evenly over [start, end - 1] (RoPE positions of a compressed block), on `device`."""
    if count == 1:
        return torch.tensor([(start + end - 1) // 2], device=device)
    # linspace in float64 on any device gives the same rounding as on the CPU.
    return torch.linspace(start, end - 1, count, dtype=torch.float64, device=device).round().long()


def causal_bias(query_length: int, past_length: int, key_padding: torch.Tensor | None, dtype: torch.dtype,
                batch: int = 1, device: torch.device | str | None = None) -> torch.Tensor:
    """Additive attention mask [B, 1, q, past + q] on `device`: query i sees keys <= past + i (and no padding).

    Explicit, because with a cache and q > 1 SDPA's own `is_causal` aligns the wrong corner.
    Works with the eager and SDPA attention implementations.
    """
    if key_padding is not None:
        device = key_padding.device
    keys = past_length + query_length
    allowed = torch.ones(query_length, keys, dtype=torch.bool, device=device).tril(diagonal=past_length)
    allowed = allowed.expand(batch, 1, query_length, keys)
    if key_padding is not None:
        allowed = allowed & key_padding.bool()[:, None, None, :]
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min)


def offset_weights(num_offsets: int, decay: float) -> list[float]:
    """Loss weights of offsets 1..n: proportional to decay^(j-1), summing to 1."""
    raw = [decay**j for j in range(num_offsets)]
    return [w / sum(raw) for w in raw]


# ---- config and model ------------------------------------------------------------------------


class FlashConfig(PreTrainedConfig):
    """Configuration of `FlashDrafterModel` (FLASH, arXiv 2505.12728).

    Layer shapes copy the target's text model (`from_target_config`). FLASH options:
    num_queries (m compressed visual tokens per image/video), semi_ar_tokens (n features per
    forward), compress (False keeps all visual embeddings), head_hidden_size (semi-AR MLP width),
    offset_weight_decay (loss weight of offset j is proportional to decay^(j-1)), token_weight
    (EAGLE's weight of the token term).
    """

    model_type = "mmspec_flash"

    def __init__(
        self,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        rms_norm_eps: float = 1e-6,
        rope_parameters: dict[str, Any] | None = None,
        max_position_embeddings: int = 4096,
        vocab_size: int | None = None,
        num_queries: int = 64,
        semi_ar_tokens: int = 3,
        compress: bool = True,
        head_hidden_size: int | None = None,
        offset_weight_decay: float = 0.8,
        token_weight: float = 0.1,
        initializer_range: float = 0.02,
        mrope_section: list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        if num_queries < 1 or semi_ar_tokens < 1:
            raise MMSpecError(f"num_queries and semi_ar_tokens must be >= 1, got {num_queries}, {semi_ar_tokens}")
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters or {"rope_type": "default", "rope_theta": 10000.0}
        self.max_position_embeddings = max_position_embeddings
        self.vocab_size = vocab_size
        self.num_queries = num_queries
        self.semi_ar_tokens = semi_ar_tokens
        self.compress = compress
        self.head_hidden_size = head_hidden_size or 2 * hidden_size
        self.offset_weight_decay = offset_weight_decay
        self.token_weight = token_weight
        self.initializer_range = initializer_range
        # The target's M-RoPE split (Qwen2-VL): the drafter rotates by the target's 3-D positions.
        # None (drafters saved before it existed, LLaVA-family targets): 1-D sequence indices.
        self.mrope_section = list(mrope_section) if mrope_section else None
        super().__init__(**kwargs)

    def layer_config(self) -> LlamaConfig:
        """The `LlamaConfig` the single decoder layer and its rotary embedding are built from."""
        config = drafter_layer_config(self, rope_parameters=dict(self.rope_parameters), num_hidden_layers=1)
        chosen = attention_implementation(self)
        set_attention_implementation(config, chosen if chosen in ("eager", "sdpa") else "sdpa")
        return config


AutoConfig.register(FlashConfig.model_type, FlashConfig, exist_ok=True)


class FlashDrafterModel(FeatureDrafterModel):
    """FLASH's drafter (Wang et al., arXiv 2505.12728): see the module docstring for the design.

    Building blocks, used alike by `training_loss` and the runtime `FlashDrafter`:
    `text_inputs` (EAGLE's fc), `assemble` (one example's drafter sequence), `forward` (the
    decoder layer, optionally over a KV cache) and `semi_ar` (n predicted features per position).
    """

    config_class = FlashConfig
    kind = "flash"
    _supports_sdpa = True

    def __init__(self, config: FlashConfig) -> None:
        super().__init__(config)
        hidden, n = config.hidden_size, config.semi_ar_tokens
        layer_config = config.layer_config()
        self.queries = nn.Parameter(torch.empty(config.num_queries, hidden))
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = LlamaDecoderLayer(layer_config, layer_idx=0)
        self.rotary = rotary_embedding(layer_config, config.mrope_section)
        if n > 1:
            self.head_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
            self.head_in = nn.Linear(hidden, config.head_hidden_size)
            self.head_out = nn.Linear(config.head_hidden_size, (n - 1) * hidden)
        self.post_init()

    @classmethod
    def from_target_config(
        cls, text_config: PreTrainedConfig, num_queries: int = 64, semi_ar_tokens: int = 3, compress: bool = True,
        **options: Any,
    ) -> "FlashDrafterModel":
        """A fresh drafter shaped like the target's text model (`config.get_text_config()`)."""
        config = FlashConfig(
            **target_layer_shape(text_config),
            rope_parameters=plain_rope_parameters(text_config),
            vocab_size=text_config.vocab_size,
            num_queries=num_queries,
            semi_ar_tokens=semi_ar_tokens,
            compress=compress,
            mrope_section=target_mrope_section(text_config),
            **options,
        )
        return cls(config)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if module is self:
            init.normal_(self.queries, std=self.config.initializer_range)
        elif module is getattr(self, "head_out", None):
            # transformers' init helpers skip tensors loaded from a checkpoint.
            init.zeros_(module.weight)  # an untrained semi-AR head repeats the layer output
            init.zeros_(module.bias)

    # ---- building blocks -----------------------------------------------------------------

    @on_own_device
    def text_inputs(self, next_embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """EAGLE's input at text position t: fc([e_{t+1}; f_t]), [..., H]."""
        dtype = self.fc.weight.dtype
        return self.fc(torch.cat([next_embeds.to(dtype), features.to(dtype)], dim=-1))

    @on_own_device
    def compress(self, visual_embeds: torch.Tensor) -> torch.Tensor:
        """One image's or video's embeddings [V, H] -> the drafter's visual tokens [m, H] (or [V, H] uncompressed)."""
        visual_embeds = visual_embeds.to(self.queries.dtype)
        return compress_visual(self.queries, visual_embeds) if self.config.compress else visual_embeds

    @on_own_device
    def assemble(
        self, text_hidden: torch.Tensor, embeds: torch.Tensor, visual: torch.Tensor,
        rope_positions: torch.LongTensor | None = None,
    ) -> tuple[torch.Tensor, torch.LongTensor, torch.LongTensor]:
        """One example's drafter sequence in position order.

        text_hidden [T, H]: `text_inputs` for positions 0..T-1 (visual slots ignored); embeds
        [>=T, H]: the target's input embeddings; visual [>=T] bool; rope_positions [3, >=T]: the
        target's M-RoPE positions of indices 0..T-1 (Qwen2-VL), None for 1-D RoPE. Returns hidden
        [S, H], RoPE positions [S] ([3, S] with rope_positions) and sources [S] (the text position
        of each entry, -1 for visual).
        """
        length = text_hidden.shape[0]
        device = text_hidden.device

        def at(indices: torch.LongTensor) -> torch.LongTensor:
            return indices if rope_positions is None else rope_positions[:, indices].to(device)

        hidden, positions, sources = [], [], []
        cursor = 0
        for start, end in visual_runs(visual[:length]):
            text = torch.arange(cursor, start, device=device)
            hidden += [text_hidden[cursor:start], self.compress(embeds[start:end])]
            block = hidden[-1].shape[0]
            if not self.config.compress:
                block_positions = at(torch.arange(start, end, device=device))
            elif rope_positions is None:
                block_positions = spread_positions(start, end, block, device=device)
            else:
                # M-RoPE: each compressed token summarises the whole block (a softmax over all of it),
                # not one (t, h, w) cell, so it takes one position on all three axes; the m of them
                # are spread over the target's positional span of the block (its smallest to largest
                # t/h/w position), as the 1-D case spreads them over the block's indices: text keeps
                # its distances to the visual span, and the text after it still comes after.
                span = rope_positions[:, start:end]
                lowest, highest = int(span.min()), int(span.max())
                block_positions = spread_positions(lowest, highest + 1, block, device=device).expand(3, -1)
            positions += [at(text), block_positions]
            sources += [text, torch.full((block,), -1, dtype=torch.long, device=device)]
            cursor = end
        tail = torch.arange(cursor, length, device=device)
        hidden.append(text_hidden[cursor:length])
        positions.append(at(tail))
        sources.append(tail)
        return torch.cat(hidden), torch.cat(positions, dim=-1), torch.cat(sources)

    @on_own_device
    def forward(
        self,
        hidden: torch.Tensor,
        position_ids: torch.LongTensor,
        key_padding: torch.Tensor | None = None,
        past_key_values: Any = None,
        attention_mask: torch.Tensor | None = None,
        lean: bool = True,
    ) -> torch.Tensor:
        """The decoder layer over hidden [B, S, H] at positions [B, S] ([3, B, S] for M-RoPE); causal in sequence order.

        With `past_key_values` (a DynamicCache) the new entries attend to the cached ones too. An additive
        `attention_mask` [B, 1, S, past + S] replaces the causal one (a draft tree's: each node sees its ancestors).
        `lean`: in eval mode, run the layer through `mmspec.kernels.lean_llama` (False: transformers' forward).
        """
        batch, length, _ = hidden.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        mask = attention_mask
        if mask is None:
            mask = causal_bias(length, past, key_padding, hidden.dtype, batch, device=hidden.device)
        position_embeddings = self.rotary(hidden, position_ids)
        if lean and lean_layer_supported(self.layer):  # drafting: the layer's maths without transformers' per-call machinery
            return llama_layer_forward(self.layer, hidden, position_embeddings, mask, past_key_values)
        out = self.layer(
            hidden,
            attention_mask=mask,
            position_ids=position_ids,
            **{cache_argument(self.layer): past_key_values},
            use_cache=past_key_values is not None,
            position_embeddings=position_embeddings,
        )
        return out[0] if isinstance(out, tuple) else out

    @on_own_device
    def semi_ar(self, hidden: torch.Tensor) -> torch.Tensor:
        """Layer outputs [..., H] -> predicted features of the next n positions [..., n, H]."""
        first = hidden[..., None, :]
        if self.config.semi_ar_tokens == 1:
            return first
        residual = self.head_out(F.silu(self.head_in(self.head_norm(hidden))))
        later = hidden[..., None, :] + residual.unflatten(-1, (self.config.semi_ar_tokens - 1, hidden.shape[-1]))
        return torch.cat([first, later], dim=-2)

    # ---- training ------------------------------------------------------------------------

    def predict(self, batch: DistillBatch, input_features: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced predictions at every text position: ([B, L, n, H], valid [B, L]).

        predictions[b, t, j - 1] is the drafter's guess of features[b, t + j]. Position t is valid
        when it is a text input position: real, not the last real token (it needs x_{t+1}), and
        not compressed. A position whose own feature is a training target (loss_mask[t - 1]: the
        last prompt position onwards) is never compressed, matching the runtime, which always
        keeps the last prompt position as the text input that drafts the first token.
        """
        features = batch.features if input_features is None else input_features
        batch_size, length, hidden_size = features.shape
        text_hidden = self.text_inputs(batch.embeds[:, 1:], features[:, :-1])
        is_target = F.pad(batch.loss_mask.bool()[:, :-1], (1, 0), value=False)
        visual = batch.visual_mask.bool() & ~is_target
        require_trace_positions(self.config.mrope_section, batch.position_ids, batch.visual_mask)
        mrope = bool(self.config.mrope_section) and batch.position_ids is not None
        rows = []
        for b in range(batch_size):
            inputs = int(batch.attention_mask[b].sum()) - 1
            rope_positions = batch.position_ids[:, b] if mrope else None
            rows.append(self.assemble(text_hidden[b, :inputs], batch.embeds[b], visual[b], rope_positions))
        width = max(row[0].shape[0] for row in rows)
        hidden = text_hidden.new_zeros(batch_size, width, hidden_size)
        positions = torch.zeros(*((3,) if mrope else ()), batch_size, width, dtype=torch.long, device=features.device)
        sources = torch.full((batch_size, width), -1, dtype=torch.long, device=features.device)
        padding = torch.zeros(batch_size, width, dtype=torch.bool, device=features.device)
        for b, (row_hidden, row_positions, row_sources) in enumerate(rows):
            size = row_hidden.shape[0]
            hidden[b, :size], positions[..., b, :size], sources[b, :size] = row_hidden, row_positions, row_sources
            padding[b, :size] = True
        predicted = self.semi_ar(self.forward(hidden, positions, key_padding=padding))
        out = predicted.new_zeros(batch_size, length, self.config.semi_ar_tokens, hidden_size)
        valid = torch.zeros(batch_size, length, dtype=torch.bool, device=features.device)
        is_text = sources >= 0
        b_index, s_index = is_text.nonzero(as_tuple=True)
        out[b_index, sources[b_index, s_index]] = predicted[b_index, s_index]
        valid[b_index, sources[b_index, s_index]] = True
        return out, valid

    def training_loss(
        self,
        batch: DistillBatch,
        embed_tokens: torch.nn.Module,
        lm_head: torch.nn.Module,
        noise_std: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> dict[str, torch.Tensor]:
        """EAGLE's loss on each of the n offsets, weighted by `offset_weights` (FLASH, arXiv 2505.12728).

        Offset j at position t predicts features[t + j]; it is trained where position t is a text
        input and loss_mask[t + j - 1] holds (the usual mask shifted by j - 1). Uniform noise of
        std `noise_std` is added to the input features only. `embed_tokens` is unused: the
        batch's `embeds` already hold the target's input embeddings. Returns "loss", offset 1's
        "feature_loss" / "token_loss" / "token_accuracy", and "token_accuracy_j" per offset.
        """
        del embed_tokens
        noisy = batch.features + uniform_noise_like(batch.features, noise_std, generator)
        predicted, valid = self.predict(batch, input_features=noisy)
        length = batch.features.shape[1]
        weights = offset_weights(self.config.semi_ar_tokens, self.config.offset_weight_decay)
        result: dict[str, torch.Tensor] = {}
        total = predicted.sum() * 0
        for j, weight in enumerate(weights, start=1):
            if j >= length:
                break
            mask = valid[:, : length - j] & batch.loss_mask.bool()[:, j - 1 : length - 1]
            terms = eagle_loss(predicted[:, : length - j, j - 1], batch.features[:, j:], lm_head, mask, self.config.token_weight)
            total = total + weight * terms["loss"]
            result[f"token_accuracy_{j}"] = terms["token_accuracy"]
            if j == 1:
                result.update({key: terms[key] for key in ("feature_loss", "token_loss", "token_accuracy")})
        result["loss"] = total
        return result
