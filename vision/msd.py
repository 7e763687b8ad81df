"""MSD: an EAGLE-style feature drafter that keeps text and visual tokens apart.

Lin et al., "Speculative Decoding Reimagined for Multimodal Large Language Models" (arXiv
2505.14260). The drafter is one decoder layer reading the target's own last hidden states
("features", see `feature_drafter`). Slot t of the drafter consumes token x_{t+1} and predicts
the target's feature f_{t+1}:

- if x_{t+1} is text: the slot input is fc([embed(x_{t+1}); f_t]) (EAGLE);
- if x_{t+1} is a visual placeholder: the slot input is the projected visual embedding the target
  consumed at that position (the target's hidden_states[0]); fc is bypassed, so visual content
  enters the drafter as the target saw it instead of being mixed with a text-trained fusion.

Slot t sits at position t (the position of the feature it reads), with a causal mask, as in
EAGLE; on a Qwen2-VL target that is the target's own M-RoPE position of token t (`rope_positions`).
Training (in `drafter_training`) uses EAGLE's loss on self-distilled traces, with MSD's two-stage
curriculum: text-only traces first, then a rising share of multimodal ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, DynamicCache, LlamaConfig, PretrainedConfig
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from mmspec.cached_model import cache_argument, with_cache
from mmspec.compat import set_attention_implementation
from mmspec.drafters.autoregressive import choose_draft_token
from mmspec.drafters.base import DraftView
from mmspec.kernels.lean_llama import Rotation, lean_layer_supported, llama_layer_forward
from mmspec.policies import DraftLengthPolicy
from mmspec.ragged import RaggedBatch
from mmspec.sampling import SamplingConfig
from mmspec.trees import DraftTree, TreeConfig
from mmspec.types import Proposal

from .feature_drafter import (
    DistillBatch,
    FeatureDrafterModel,
    TargetFeatureDrafter,
    drafter_layer_config,
    eagle_loss,
    load_drafter_model,
    plain_rope_parameters,
    target_layer_shape,
    uniform_noise_like,
)
from .own_device import on_own_device
from .rope_positions import mrope_section, require_trace_positions, rotary_embedding


class MSDConfig(PretrainedConfig):
    """Shape of an MSD drafter: a Llama-style decoder block sized like the target's language model.

    Build it from the target with `MSDConfig.from_text_config(model.config.get_text_config())`.
    """

    model_type = "mmspec_msd"

    def __init__(
        self,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 1,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        max_position_embeddings: int = 4096,
        attention_bias: bool = False,
        initializer_range: float = 0.02,
        target_vocab_size: int | None = None,
        target_model_type: str | None = None,
        mrope_section: list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.attention_bias = attention_bias
        self.initializer_range = initializer_range
        # Recorded so a drafter can be checked against the target it is paired with.
        self.target_vocab_size = target_vocab_size
        self.target_model_type = target_model_type
        # The target's M-RoPE split (Qwen2-VL): the drafter rotates by the target's 3-D positions.
        # None (drafters saved before it existed, LLaVA-family targets): 1-D sequence indices.
        self.mrope_section = list(mrope_section) if mrope_section else None
        super().__init__(**kwargs)

    @classmethod
    def from_text_config(cls, text_config: PretrainedConfig, **options: Any) -> "MSDConfig":
        """Size the drafter like the target's language model; `options` override any field."""
        rope = plain_rope_parameters(text_config)
        fields = dict(
            **target_layer_shape(text_config),
            rope_theta=float(rope.get("rope_theta", getattr(text_config, "rope_theta", 10000.0))),
            target_vocab_size=text_config.vocab_size,
            target_model_type=getattr(text_config, "model_type", None),
            mrope_section=mrope_section(text_config),
        )
        fields.update(options)
        return cls(**fields)

    def layer_config(self) -> LlamaConfig:
        """The LlamaConfig the decoder layer and rotary embedding are built from."""
        config = drafter_layer_config(
            self,
            vocab_size=self.target_vocab_size or 1,
            num_hidden_layers=self.num_hidden_layers,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            attention_bias=self.attention_bias,
        )
        # Additive float masks (below) work with both; sdpa is the faster one.
        set_attention_implementation(config, "sdpa")
        return config


def msd_slot_inputs(
    fused: torch.Tensor, visual_embeds: torch.Tensor | None = None, visual_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """MSD's modality split: fc output at text slots, the target's visual embedding at visual slots.

    fused [B, L, H] = fc([embed(x_{t+1}); f_t]); visual_embeds [B, L, H]; visual_mask [B, L] (True where
    x_{t+1} is a visual placeholder).
    """
    if visual_mask is None or visual_embeds is None or not bool(visual_mask.any()):
        return fused
    return torch.where(visual_mask[..., None], visual_embeds.to(fused.dtype), fused)


def causal_attention_mask(
    padding_mask: torch.Tensor | None, batch: int, query_length: int, past_length: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """Additive mask [B, 1, Q, past + Q]: query i sees keys <= past + i that are not padding.

    padding_mask [B, past + Q] (1 = real) or None. Returns None when every key is visible
    (one query, no padding), which lets attention skip the mask.
    """
    total = past_length + query_length
    if query_length == 1 and padding_mask is None:
        return None
    keys = torch.arange(total, device=device)
    queries = torch.arange(query_length, device=device) + past_length
    allowed = (keys[None, :] <= queries[:, None])[None, None].expand(batch, 1, query_length, total)
    if padding_mask is not None:
        allowed = allowed & padding_mask[:, None, None, -total:].bool()
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)


class MSDDrafterModel(FeatureDrafterModel):
    """MSD's drafter network: `fc: Linear(2H, H)` and one Llama decoder layer (arXiv 2505.14260).

    It owns neither an embedding table nor an LM head: both are borrowed from the target.
    `forward` maps slot inputs (see `slot_inputs`) to predicted target features.
    """

    config_class = MSDConfig
    kind = "msd"
    _supports_sdpa = True

    def __init__(self, config: MSDConfig) -> None:
        super().__init__(config)
        layer_config = config.layer_config()
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(layer_config, layer_idx=i) for i in range(config.num_hidden_layers))
        self.rotary_emb = rotary_embedding(layer_config, config.mrope_section)
        self.post_init()

    @classmethod
    def from_target_config(cls, text_config: PretrainedConfig, **options: Any) -> "MSDDrafterModel":
        """A freshly initialised drafter sized for a target whose language model has `text_config`."""
        return cls(MSDConfig.from_text_config(text_config, **options))

    @on_own_device
    def slot_inputs(
        self,
        token_embeds: torch.Tensor,
        features: torch.Tensor,
        visual_mask: torch.Tensor | None = None,
        visual_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Slot inputs [B, L, H] from embed(x_{t+1}), f_t and, for visual x_{t+1}, the target's visual embedding."""
        dtype = self.fc.weight.dtype
        fused = self.fc(torch.cat([token_embeds.to(dtype), features.to(dtype)], dim=-1))
        return msd_slot_inputs(fused, visual_embeds, visual_mask)

    @on_own_device
    def forward(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: DynamicCache | None = None,
        use_cache: bool = False,
        lean: bool = True,
    ) -> BaseModelOutputWithPast:
        """Predicted features [B, L, H] for slot inputs [B, L, H] at `position_ids` [B, L] ([3, B, L] for M-RoPE).

        attention_mask [B, past + L] marks real slots (1) against right padding (0); None = no padding; a 4-D
        additive mask [B, 1, L, past + L] (a draft tree's) is used as it is. `lean`: in eval mode, run the layers
        through `mmspec.kernels.lean_llama` (False: transformers' forward).
        """
        batch, length, _ = inputs_embeds.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if attention_mask is not None and attention_mask.dim() == 4:
            mask = attention_mask.to(inputs_embeds.dtype)
        else:
            mask = causal_attention_mask(attention_mask, batch, length, past, inputs_embeds.dtype, inputs_embeds.device)
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids)
        hidden = inputs_embeds
        rotation: Rotation | None = None  # shaped once for all lean layers
        for layer in self.layers:
            if lean and lean_layer_supported(layer):  # drafting: the layer's maths without transformers' per-call machinery
                rotation = rotation or Rotation.of(position_embeddings)
                hidden = llama_layer_forward(layer, hidden, rotation, mask, past_key_values)
                continue
            hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, **{cache_argument(layer): past_key_values},
                           use_cache=use_cache, position_embeddings=position_embeddings)
        return with_cache(BaseModelOutputWithPast, past_key_values, last_hidden_state=hidden)

    def training_loss(
        self,
        batch: DistillBatch,
        embed_tokens: nn.Module,
        lm_head: nn.Module,
        noise_std: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> dict[str, torch.Tensor]:
        """EAGLE's loss on every slot the batch's loss_mask selects, with uniform noise on the input features."""
        dtype = self.fc.weight.dtype
        with torch.no_grad():
            token_embeds = embed_tokens(batch.input_ids[:, 1:]).to(dtype)
        features = batch.features[:, :-1].to(dtype)
        features = features + uniform_noise_like(features, noise_std, generator)
        inputs = self.slot_inputs(token_embeds, features, batch.visual_mask[:, 1:], batch.embeds[:, 1:])
        slots = inputs.shape[1]
        require_trace_positions(self.config.mrope_section, batch.position_ids, batch.visual_mask)
        positions = torch.arange(slots, device=inputs.device)[None].expand(inputs.shape[0], -1)
        if self.config.mrope_section and batch.position_ids is not None:
            positions = batch.position_ids[..., :-1].to(inputs.device)  # slot t sits at the target's position t
        predicted = self(inputs, positions, attention_mask=batch.attention_mask[:, 1:]).last_hidden_state
        return eagle_loss(predicted, batch.features[:, 1:], lm_head, batch.loss_mask[:, :-1])


AutoConfig.register(MSDConfig.model_type, MSDConfig, exist_ok=True)
AutoModel.register(MSDConfig, MSDDrafterModel, exist_ok=True)


class MSDDrafter(TargetFeatureDrafter):
    """Runtime MSD drafting over a vision-language target: chain drafts from the target's features.

    State kept between rounds: the drafter's KV cache over its "true" slots (those whose input
    feature is the target's real feature) and the target features not yet fed. Each round feeds
    the newly committed slots in one forward, then drafts k tokens by feeding its own predicted
    features forward; after verification the draft slots are cropped from its cache and the
    target's real features of the committed tokens are queued (Lin et al. 2025; EAGLE, Li et al. 2024).

    Args:
        model: a trained `MSDDrafterModel`, or the folder it was saved to.
        lean: step the model's decoder layers through `mmspec.kernels.lean_llama` (False: transformers' forward).
    """

    model_class = MSDDrafterModel
    method_name = "MSD"

    def __init__(self, model: MSDDrafterModel | str | Path, lean: bool = True,
                 device: str | torch.device | None = None) -> None:
        super().__init__(model, lean=lean, device=device)
        self._fed = 0  # true slots in the cache
        self._features: torch.Tensor | None = None  # target features of indices _fed, _fed + 1, ...
        self._last_hidden: torch.Tensor | None = None  # the newest true slot's predicted feature

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        super().begin(view, model_inputs)
        self._fed, self._features, self._last_hidden = 0, None, None

    def read_prompt(self, sequence: torch.LongTensor, step: Any) -> None:
        """Build the drafter's cache over the prompt's slots from the target's prefill hidden states."""
        self._require_hidden_states(step)
        length = sequence.shape[1]
        embeds, self._features = step.hidden_states[0][:, :length], step.hidden_states[-1][:, :length]
        self.cache, self._fed = DynamicCache(), 0
        self._read_rope_table(sequence)
        if length >= 2:
            # Slots 0..L-2 consume the prompt's tokens 1..L-1; visual ones bring the target's visual embedding.
            visual = torch.isin(sequence[:, 1:], self.visual_ids.to(sequence.device))
            self._feed(sequence[:, 1:], visual, embeds[:, 1:])

    def draft_chain(self, sequence: torch.LongTensor, max_tokens: int, sampling: SamplingConfig,
                    generator: torch.Generator | None, policy: DraftLengthPolicy) -> Proposal:
        if max_tokens <= 0:
            return Proposal.empty(sequence)
        # The target has features for every committed token but the newest: feed those slots first.
        hidden = self._feed(sequence[:, self._fed + 1 :])
        position = sequence.shape[1] - 1
        tokens, dists = [], []
        for i in range(max_tokens):
            logits = self.lm_head(hidden.to(self.lm_head.weight.dtype))
            token, dist, confidence = choose_draft_token(logits, sampling, generator, policy.needs_confidence)
            tokens.append(token)
            if dist is not None:
                dists.append(dist)
            if i + 1 == max_tokens or int(token[0]) in self._stop_ids:
                break
            if confidence is not None and not policy.keep_drafting(confidence):
                break
            # The next slot reads the drafted token and the drafter's own predicted feature.
            inputs = self.model.slot_inputs(self.embed_tokens(token[:, None]), hidden[:, None])
            hidden = self._forward(inputs, position)
            position += 1
        probs = torch.stack(dists, dim=1) if dists else None
        return Proposal(tokens=torch.stack(tokens, dim=1), probs=probs)

    drafts_trees = True

    def draft_tree(self, sequence: torch.LongTensor, config: TreeConfig, sampling: SamplingConfig) -> DraftTree:
        """EAGLE-2's dynamic tree: each level's expanded nodes go through the drafter in one forward, each
        slot reading its token and its parent's predicted feature, with a tree attention mask."""
        root_hidden = self._feed(sequence[:, self._fed + 1 :])

        def run_level(tokens: torch.LongTensor, features: torch.Tensor, mask: torch.Tensor,
                      positions: torch.LongTensor) -> torch.Tensor:
            inputs = self.model.slot_inputs(self.embed_tokens(tokens), features)
            out = self.model(inputs, positions, attention_mask=mask, past_key_values=self.cache, use_cache=True, lean=self.lean)
            return out.last_hidden_state[0]

        return self._grow_tree(root_hidden[0], sequence, config, sampling, run_level)

    def observe_chain(self, sequence: torch.LongTensor, verdict: Any, target_step: Any) -> None:
        """Crop the draft slots; queue the target's true features of the newly committed tokens."""
        excess = self.cache.get_seq_length() - self._fed
        if excess > 0:
            self.cache.crop(-excess)
        # The verify forward covered [newest committed token, drafts]: its first positions are now committed.
        known = self._fed + self._features.shape[1]
        needed = sequence.shape[1] - 1 - known
        if needed > 0:
            self._features = torch.cat([self._features, target_step.hidden_states[-1][:, :needed]], dim=1)

    def _feed(
        self, next_tokens: torch.LongTensor, visual_mask: torch.Tensor | None = None, visual_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Feed true slots consuming `next_tokens` [B, m] with queued target features; last predicted feature [B, H]."""
        count = next_tokens.shape[1]
        if count == 0:
            return self._last_hidden
        features, self._features = self._features[:, :count], self._features[:, count:]
        inputs = self.model.slot_inputs(self.embed_tokens(next_tokens), features, visual_mask, visual_embeds)
        hidden = self._forward(inputs, self._fed)
        self._fed += count
        self._last_hidden = hidden
        return hidden

    def _forward(self, inputs: torch.Tensor, start: int) -> torch.Tensor:
        """Run slots at true positions start, start + 1, ... on top of the cache; last output [B, H]."""
        indices = torch.arange(start, start + inputs.shape[1], device=inputs.device)[None].expand(inputs.shape[0], -1)
        return self._slot_forward(inputs, self.position_ids(indices))


    # --- batches: slots in the batch's columns; a row's first column, pads and holes are masked --------

    def read_batch_prompt(self, batch: RaggedBatch, step: Any) -> None:
        self._require_hidden_states(step)
        embeds, features = step.hidden_states[0], step.hidden_states[-1]
        first = (batch.mask.cumsum(-1) == 1) & batch.mask.bool()
        self._start_batch(batch.mask.masked_fill(first, 0), batch.width, features[:, -1:])
        previous = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
        visual = torch.isin(batch.tokens, self.visual_ids.to(batch.tokens.device))
        inputs = self.model.slot_inputs(self.embed_tokens(batch.tokens), previous, visual, embeds)
        self.cache = DynamicCache()
        previous_columns = (torch.arange(batch.width, device=batch.tokens.device) - 1).clamp(min=0).expand(batch.size, -1)
        positions = self._batch_rope((batch.column_positions(0) - 1).clamp(min=0), previous_columns)
        self._slot_forward(inputs, positions, self._slot_mask)

    def draft_rows(self, batch: RaggedBatch, max_tokens: int, sampling: SamplingConfig,
                   generator: torch.Generator | None) -> Proposal:
        if max_tokens <= 0:
            return Proposal.empty(batch.tokens)
        tokens_in, features, positions = self._take_true_slots(batch)
        hidden = self._slot_forward(self.model.slot_inputs(self.embed_tokens(tokens_in), features), positions, self._slot_mask)
        tokens, dists = [], []
        for i in range(max_tokens):
            token, dist, _ = choose_draft_token(self.lm_head(hidden.to(self.lm_head.weight.dtype)), sampling, generator, False)
            tokens.append(token)
            if dist is not None:
                dists.append(dist)
            if i + 1 < max_tokens:
                mask, positions = self._draft_slots(batch, i, 1)
                hidden = self._slot_forward(self.model.slot_inputs(self.embed_tokens(token[:, None]), hidden[:, None]),
                                            positions, mask)
        return Proposal(tokens=torch.stack(tokens, dim=1), probs=torch.stack(dists, dim=1) if dists else None)

    def _slot_forward(self, inputs: torch.Tensor, positions: torch.LongTensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run slots at `positions` on top of the cache (a batch's `mask` hides its pads and holes); last output [B, H]."""
        self.forwards += 1
        return self.model(inputs, positions, attention_mask=mask, past_key_values=self.cache, use_cache=True,
                          lean=self.lean).last_hidden_state[:, -1]


def load_msd_drafter(folder: str | Path, **kwargs: Any) -> MSDDrafterModel:
    """`MSDDrafterModel.from_pretrained(folder)` with one clear error for a missing or foreign folder."""
    return load_drafter_model(MSDDrafterModel, folder, "MSD", **kwargs)

