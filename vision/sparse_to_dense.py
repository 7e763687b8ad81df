"""Sparse-to-Dense (StD) self-speculation for Video-LLMs.

Zhang et al., "Sparse-to-Dense: A Free Lunch for Lossless Acceleration of Video Understanding
in LLMs", ACL 2025 (arXiv 2505.19155). The drafter is the target itself reading a sparse KV
cache; the verifier is the target with its dense cache. Design, as in the paper:

- At prefill, for every layer and every KV-head group, visual KV entries are ranked by the mean
  attention the text query tokens (the prompt text after the visual span) pay to them; the top-K
  are kept together with all text KV. Ranking is captured from the target's own prefill pass,
  so no extra forward is spent on it.
- Drafting: gamma tokens, one forward each, against the sparse cache; positions stay the true
  positions so RoPE is unchanged.
- Verification: one dense forward over the drafts (the shared loop).
- New tokens go to both caches. Our choice: after each verification the sparse cache receives
  the *dense* KV of the committed tokens (already computed by the verify pass) instead of its own
  sparse-attention KV, so it costs nothing and keeps the drafter as close to the target as
  possible; the drafts' own sparse KV is discarded on rollback.

Lossless by construction: every committed token is checked by the dense target.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from mmspec.cached_model import cache_argument, model_vocab_size
from mmspec.compat import attention_implementation, cache_layers
from mmspec.drafters.autoregressive import choose_draft_token
from mmspec.drafters.base import Drafter, DraftView
from mmspec.errors import MMSpecError
from mmspec.policies import DraftLengthPolicy
from mmspec.ragged import RaggedBatch
from mmspec.sampling import SamplingConfig
from mmspec.types import Proposal

from .attention_scoring import SCORING_ATTENTION, ImportanceCapture, _active_capture
from .models import feature_token_ids


def select_kv_positions(importance: torch.Tensor, visual_positions: torch.Tensor, text_positions: torch.Tensor, keep: int) -> torch.Tensor:
    """Prompt positions to keep per KV head: the top-`keep` visual ones by importance, plus all text.

    importance [B, H_kv, num_visual] -> LongTensor [B, H_kv, keep + num_text], sorted by position.
    """
    batch, kv_heads, num_visual = importance.shape
    keep = min(keep, num_visual)
    top = importance.topk(keep, dim=-1).indices
    # The positions live with the prompt, the scores with the layer (another GPU under a device map).
    chosen_visual = visual_positions.to(top.device)[top]
    text = text_positions.to(top.device).view(1, 1, -1).expand(batch, kv_heads, -1)
    return torch.cat([chosen_visual, text], dim=-1).sort(dim=-1).values


def gather_positions(states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """states [B, H_kv, L, D] -> [B, H_kv, P, D] at per-head positions [B, H_kv, P]."""
    return states.gather(2, positions[..., None].expand(-1, -1, -1, states.shape[-1]))


# Per model: how many captures are in flight and the attention kernel to restore after the last. The scoring
# kernel is SDPA for every thread without an active capture, so one switch serves concurrent calls.
_SCORING_USERS: dict[int, tuple[int, str]] = {}
_SCORING_LOCK = threading.Lock()


def enter_scoring(model: PreTrainedModel) -> None:
    """Run `model`'s language layers through the scoring attention until the matching `leave_scoring`."""
    with _SCORING_LOCK:
        users, saved = _SCORING_USERS.get(id(model), (0, ""))
        if users == 0:
            saved = attention_implementation(model.config.get_text_config())
            model.set_attn_implementation(language_attention_setting(model, SCORING_ATTENTION))
        _SCORING_USERS[id(model)] = (users + 1, saved)


def leave_scoring(model: PreTrainedModel) -> None:
    """The last call capturing on `model` gives it back its own attention kernel."""
    with _SCORING_LOCK:
        users, saved = _SCORING_USERS[id(model)]
        if users == 1:
            del _SCORING_USERS[id(model)]
            model.set_attn_implementation(language_attention_setting(model, saved))
        else:
            _SCORING_USERS[id(model)] = (users - 1, saved)


def language_attention_setting(model: PreTrainedModel, implementation: str) -> str | dict:
    """`set_attn_implementation` argument that targets only the language model of a multimodal model."""
    return {"text_config": implementation} if "text_config" in getattr(model.config, "sub_configs", {}) else implementation


class SparseToDenseDrafter(Drafter):
    """The target drafting with top-K visual KV per layer and KV-head group (see module docstring).

    Args:
        model: the target model itself (StD is self-speculative).
        kv_budget: KV entries kept per layer and head group, text included (the paper's K + m_t;
            default 1024). Visual entries kept = kv_budget - number of text tokens (at least 1).
        visual_keep: keep exactly this many visual entries instead (overrides kv_budget).
    """

    drafts_from_prompt = False

    def __init__(self, model: PreTrainedModel, kv_budget: int = 1024, visual_keep: int | None = None) -> None:
        if kv_budget < 1 or (visual_keep is not None and visual_keep < 1):
            raise MMSpecError("Sparse-to-Dense needs a positive KV budget")
        self.model = model
        self.kv_budget = kv_budget
        self.visual_keep = visual_keep
        self.vocab_size = model_vocab_size(model)
        self.visual_ids = feature_token_ids(model)
        self.forwards = 0
        self.target: Any = None
        self.sparse_cache: DynamicCache | None = None
        self.kept_visual = 0
        self.num_visual = 0

    def bind(self, target: Any) -> None:
        if target.model is not self.model:
            raise MMSpecError("Sparse-to-Dense drafts with the target's own weights: build it with the target model")
        self.target = target

    def _split(self, tokens: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A prompt's visual columns, text columns and text query columns (the text after the visual span)."""
        is_visual = torch.isin(tokens, torch.tensor(sorted(self.visual_ids), device=tokens.device))
        visual, text = columns[is_visual], columns[~is_visual]
        if visual.numel() == 0:
            raise MMSpecError("Sparse-to-Dense needs visual tokens in the prompt (an image or a video)")
        queries = text[text > visual[0]]
        if queries.numel() == 0:
            queries = text[-1:] if text.numel() else visual[-1:]
        return visual, text, queries

    def _start_capture(self, rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        """Score visual keys during the target's prefill (through the attention interface, no patching)."""
        self._rows = rows
        self.num_visual = rows[0][0].numel()
        self.kept_visual = self.visual_keep or max(1, self.kv_budget - rows[0][1].numel())
        self._capture = ImportanceCapture([(queries, visual) for visual, _, queries in rows])
        enter_scoring(self.model)
        self._capture_token = _active_capture.set(self._capture)

    def _end_capture(self) -> None:
        _active_capture.reset(self._capture_token)
        leave_scoring(self.model)

    def _kept(self, row: int, layer_idx: int) -> torch.Tensor:
        """Row `row`'s kept prompt columns at one layer, per KV head [1, H_kv, n]."""
        visual, text, _ = self._rows[row]
        kept_visual = self.visual_keep or max(1, self.kv_budget - text.numel())
        return select_kv_positions(self._capture.per_layer[layer_idx][row], visual, text, kept_visual)

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        """Score the prompt's visual keys during the target's prefill: each row keeps its own top-K."""
        tokens = view.sequence
        mask = torch.ones_like(tokens) if view.batch is None else view.batch.mask
        columns = [mask[b].nonzero().flatten() for b in range(tokens.shape[0])]
        self._start_capture([self._split(tokens[b][kept], kept) for b, kept in enumerate(columns)])

    def propose(self, view: DraftView) -> Proposal:
        if view.batch is not None:
            return self.draft_rows(view.batch, view.max_tokens, view.sampling, view.generator)
        return self.draft_chain(view.sequence, view.max_tokens, view.sampling, view.generator, view.policy)

    def observe(self, view: DraftView, verdict: Any, target_step: Any) -> None:
        if verdict is None:  # the target's prefill: keep its top-K visual entries
            self._end_capture()
            if view.batch is None:
                self._sparse_prompt()
            else:
                self._sparse_batch_prompt(view.batch)
        elif view.batch is None:  # (a batch mirrors its committed columns when it next drafts)
            self._mirror_chain()

    def _sparse_prompt(self) -> None:
        dense = self.target.cache
        self.sparse_cache = DynamicCache()
        for layer_idx, (keys, values) in enumerate(cache_layers(dense)):
            keep = self._kept(0, layer_idx)
            self.sparse_cache.update(gather_positions(keys, keep), gather_positions(values, keep), layer_idx)
        self._sparse_prompt_length = self.sparse_cache.get_seq_length()
        self._synced = dense.get_seq_length()  # dense positions mirrored into the sparse cache
        self._prompt_length = self._synced
        self._rope_deltas = getattr(getattr(self.model, "model", None), "rope_deltas", None)

    def draft_chain(self, sequence: torch.LongTensor, max_tokens: int, sampling: SamplingConfig,
                    generator: torch.Generator | None, policy: DraftLengthPolicy) -> Proposal:
        if max_tokens <= 0:
            return Proposal.empty(sequence)
        token = sequence[:, -1]
        position = sequence.shape[1] - 1
        tokens, dists = [], []
        for step in range(max_tokens):
            logits = self._sparse_step(token, position)
            token, dist, confidence = choose_draft_token(logits, sampling, generator, policy.needs_confidence)
            tokens.append(token)
            if dist is not None:
                dists.append(dist)
            if confidence is not None and not policy.keep_drafting(confidence):
                break
            position += 1
        probs = torch.stack(dists, dim=1) if dists else None
        return Proposal(tokens=torch.stack(tokens, dim=1), probs=probs)

    def _mirror_chain(self) -> None:
        """Drop the drafts' sparse KV; mirror the dense KV of newly committed tokens."""
        dense = self.target.cache
        self._truncate_sparse(self._sparse_prompt_length + (self._synced - self._prompt_length))
        new_length = dense.get_seq_length()
        for layer_idx, (keys, values) in enumerate(cache_layers(dense)):
            self.sparse_cache.update(keys[:, :, self._synced:new_length], values[:, :, self._synced:new_length], layer_idx)
        self._synced = new_length

    def _sparse_step(self, token: torch.Tensor, position: int | torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """One drafting forward of `token` [B] at true `position` (or per-row positions [B, 1]), attending to
        the whole sparse cache, or to the entries `keys` [B, cache + 1] marks (a batch's padding and holes)."""
        kv_length = self.sparse_cache.get_seq_length() + 1
        if keys is None:
            keys = torch.ones(token.shape[0], kv_length, dtype=torch.bool, device=token.device)
        positions = self._position_ids(position, token) if isinstance(position, int) else position
        self.forwards += 1
        out = self.model(
            input_ids=token[:, None],
            **{cache_argument(self.model): self.sparse_cache},
            position_ids=positions,
            attention_mask=keys.bool()[:, None, None, :],
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :]

    def _position_ids(self, position: int, token: torch.Tensor) -> torch.Tensor:
        """Position ids [B, 1] (or [3, B, 1] for M-RoPE) of `token` [B], on its device.

        Built on the token's device: a CPU tensor here meets the rotary embedding's `inv_freq` on the
        model's device (on a GPU: "Expected all tensors to be on the same device, ... mat2 is on cpu").
        """
        batch = token.shape[0]
        if self._rope_deltas is None:
            return torch.full((batch, 1), position, dtype=torch.long, device=token.device)
        # Qwen2-VL style M-RoPE: text after the visual span sits at position + rope delta on all 3 axes.
        shifted = (position + self._rope_deltas.to(token.device)).view(1, -1, 1).expand(3, batch, 1)
        return shifted.long()

    def _truncate_sparse(self, length: int) -> None:
        excess = self.sparse_cache.get_seq_length() - length
        if excess > 0:
            self.sparse_cache.crop(-excess)

    # --- batches: each row keeps its own top-K visual entries; rows are padded apart (masked) -------

    drafts_batches = True

    def _sparse_batch_prompt(self, batch: RaggedBatch) -> None:
        dense = self.target.cache
        self.sparse_cache = DynamicCache()
        for layer_idx, (layer_keys, layer_values) in enumerate(cache_layers(dense)):
            kept = [self._kept(b, layer_idx) for b in range(batch.size)]
            width = max(k.shape[-1] for k in kept)
            keys, values = [], []
            for b, keep in enumerate(kept):
                padded = torch.nn.functional.pad(keep, (0, width - keep.shape[-1]))  # pads read column 0, masked
                keys.append(gather_positions(layer_keys[b:b + 1], padded.to(layer_keys.device)))
                values.append(gather_positions(layer_values[b:b + 1], padded.to(layer_values.device)))
            self.sparse_cache.update(torch.cat(keys), torch.cat(values), layer_idx)
        counts = torch.tensor([k.shape[-1] for k in kept], device=batch.mask.device)
        self._sparse_mask = (torch.arange(width, device=batch.mask.device)[None] < counts[:, None]).long()
        self._synced = dense.get_seq_length()
        self._rope_deltas = None

    def draft_rows(self, batch: RaggedBatch, max_tokens: int, sampling: SamplingConfig,
                   generator: torch.Generator | None) -> Proposal:
        if max_tokens <= 0:
            return Proposal.empty(batch.tokens)
        self._mirror_committed(batch)
        token, tokens, dists = batch.tokens[:, -1], [], []
        for step in range(max_tokens):
            keys = torch.cat([self._sparse_mask, self._sparse_mask.new_ones((batch.size, step + 1))], dim=1)
            positions = batch.next_positions(step + 1)[:, -1:] - 1  # the newest token's, then each draft's
            positions = self.target.batch_position_ids(positions, batch, prefill=False, model_inputs={})
            token, dist, _ = choose_draft_token(self._sparse_step(token, positions, keys), sampling, generator, False)
            tokens.append(token)
            if dist is not None:
                dists.append(dist)
        return Proposal(tokens=torch.stack(tokens, dim=1), probs=torch.stack(dists, dim=1) if dists else None)

    def _mirror_committed(self, batch: RaggedBatch) -> None:
        """Drop the last drafts' sparse KV; copy in the dense KV of the columns committed since (holes masked)."""
        self._truncate_sparse(self._sparse_mask.shape[1])
        dense = self.target.cache
        new_length = dense.get_seq_length()
        for layer_idx, (keys, values) in enumerate(cache_layers(dense)):
            self.sparse_cache.update(keys[:, :, self._synced:new_length], values[:, :, self._synced:new_length], layer_idx)
        self._sparse_mask = torch.cat([self._sparse_mask, batch.mask[:, self._synced:new_length]], dim=1)
        self._synced = new_length

    def select_rows(self, keep: torch.LongTensor) -> None:
        self.sparse_cache.batch_select_indices(keep.to(self._sparse_mask.device))
        self._sparse_mask = self._sparse_mask.index_select(0, keep.to(self._sparse_mask.device))

    @property
    def kept_fraction(self) -> float:
        """Share of visual KV entries the drafter reads."""
        return min(self.kept_visual, self.num_visual) / self.num_visual if self.num_visual else 0.0
