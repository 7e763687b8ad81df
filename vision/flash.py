"""FLASH drafting for vision-language targets: a compressed view of the image, several tokens per forward.

Wang et al., "FLASH: Latent-Aware Semi-Autoregressive Speculative Decoding for Multimodal Tasks",
arXiv 2505.12728. The model (`FlashDrafterModel`, in `flash_model`) and its design choices are
documented there; this module runs it inside the shared draft/verify loop:

- after the target's prefill, the drafter compresses each image/video's embeddings
  (`hidden_states[0]` at the visual positions) and fills its own KV cache over
  [text; compressed visual; text] from the target's features (`hidden_states[-1]`) in one forward.
  The last prompt position waits ("pending") until the target has chosen the first new token;
- `propose(k)`: the first forward feeds the pending positions (true target features of the
  newly committed tokens) and its last output yields n = semi_ar_tokens drafts; each further
  forward feeds the n drafts just made, each paired with its predicted feature, and yields n
  more. k drafts cost ceil(k / n) forwards;
- `observe`: drops the cache entries built on drafts and predicted features, and queues the
  target's true features of the committed tokens for the next round;
- `draft_tree`: an EAGLE-2 tree, one level per forward: each node reads its token and its parent's
  first predicted feature (the head's later predictions are conditioned on no drafted token, so a tree
  cannot branch below them), under a tree attention mask.

Verification is the shared chain verifier, so decoding is lossless: greedy output equals the
target's, and sampled drafts carry their distributions q for speculative sampling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from mmspec.drafters.autoregressive import choose_draft_token
from mmspec.drafters.base import DraftView
from mmspec.errors import MMSpecError
from mmspec.policies import DraftLengthPolicy
from mmspec.ragged import RaggedBatch
from mmspec.sampling import SamplingConfig
from mmspec.trees import DraftTree, TreeConfig
from mmspec.types import Proposal

from .feature_drafter import TargetFeatureDrafter, load_drafter_model
from .flash_model import FlashConfig, FlashDrafterModel, compress_visual

__all__ = ["FlashConfig", "FlashDrafterModel", "FlashDrafter", "compress_visual", "load_flash_drafter"]


def load_flash_drafter(folder: str | Path, **kwargs: Any) -> FlashDrafterModel:
    """`FlashDrafterModel.from_pretrained(folder)` with one clear error for a missing or foreign folder."""
    return load_drafter_model(FlashDrafterModel, folder, "FLASH", **kwargs)


class FlashDrafter(TargetFeatureDrafter):
    """Runs a `FlashDrafterModel` against a vision-language target (FLASH, arXiv 2505.12728).

    The target's input embedding and LM head are borrowed at `bind`; the drafter's KV cache is
    rolled back by cropping after every verification. `forwards` counts drafter model calls,
    the prefill forward included. With a text-only prompt (or target) FLASH is EAGLE with a
    semi-autoregressive head.

    Args:
        model: a `FlashDrafterModel` (trained for this target), or the folder it was saved to.
        lean: step the model's decoder layers through `mmspec.kernels.lean_llama` (False: transformers' forward).
    """

    model_class = FlashDrafterModel
    method_name = "FLASH"

    def __init__(self, model: FlashDrafterModel | str | Path, lean: bool = True,
                 device: str | torch.device | None = None) -> None:
        super().__init__(model, lean=lean, device=device)
        self._committed = 0  # cache entries built from true target features only
        self._fed = 0  # first text position with no entry in the cache
        self._pending: torch.Tensor | None = None  # true features f_t for t = _fed, _fed + 1, ... [1, P, H]

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        super().begin(view, model_inputs)
        self._committed, self._fed, self._pending = 0, 0, None

    def read_prompt(self, sequence: torch.LongTensor, step: Any) -> None:
        """Compress the visual embeddings and cache [text; compressed visual; text] for the prompt."""
        self._require_hidden_states(step)
        if sequence.shape[0] != 1:
            raise MMSpecError(f"FLASH drafts for one sequence at a time, got a batch of {sequence.shape[0]}")
        embeds, features = step.hidden_states[0][0], step.hidden_states[-1][0]
        length = sequence.shape[1]
        visual = torch.isin(sequence[0], self.visual_ids.to(sequence.device))
        visual[length - 1] = False  # the last prompt position drafts the first token: never compressed
        self.cache = DynamicCache()
        self._read_rope_table(sequence)
        if length > 1:
            text_hidden = self.model.text_inputs(embeds[1:], features[:-1])
            rope_positions = None
            if self._rope_table is not None:
                rope_positions = self.position_ids(torch.arange(length, device=sequence.device)[None])[:, 0]
            hidden, positions, _ = self.model.assemble(text_hidden, embeds, visual, rope_positions)
            self._run(hidden[None], positions.unsqueeze(-2))
        self._committed = self.cache.get_seq_length()
        self._fed = length - 1
        self._pending = features[None, length - 1 :]

    def draft_chain(self, sequence: torch.LongTensor, max_tokens: int, sampling: SamplingConfig,
                    generator: torch.Generator | None, policy: DraftLengthPolicy) -> Proposal:
        if max_tokens <= 0:
            return Proposal.empty(sequence)
        n = self.model.config.semi_ar_tokens
        predicted = self._feed_pending(sequence)
        position = self._fed
        tokens: list[torch.Tensor] = []
        dists: list[torch.Tensor] = []
        while True:
            for j in range(n):
                logits = self.lm_head(predicted[:, j].to(self.lm_head.weight.dtype))
                token, dist, confidence = choose_draft_token(logits, sampling, generator, policy.needs_confidence)
                tokens.append(token)
                if dist is not None:
                    dists.append(dist)
                done = len(tokens) == max_tokens or int(token[0]) in self._stop_ids
                if done or (confidence is not None and not policy.keep_drafting(confidence)):
                    probs = torch.stack(dists, dim=1) if dists else None
                    return Proposal(tokens=torch.stack(tokens, dim=1), probs=probs)
            # Semi-autoregressive step: the n drafts just made, each with the feature it was read from.
            predicted = self._feed(torch.stack(tokens[-n:], dim=1), predicted, position)
            position += n

    drafts_trees = True

    def draft_tree(self, sequence: torch.LongTensor, config: TreeConfig, sampling: SamplingConfig) -> DraftTree:
        """EAGLE-2's dynamic tree, one level per drafter forward: every node reads its token and its parent's
        first predicted feature (the semi-autoregressive head's later predictions are not conditioned on a
        drafted token, so there is nothing to branch on below them)."""
        root = self._feed_pending(sequence)[0, 0]

        def run_level(tokens: torch.LongTensor, features: torch.Tensor, mask: torch.Tensor,
                      positions: torch.LongTensor) -> torch.Tensor:
            hidden = self.model.text_inputs(self.embed_tokens(tokens), features)
            return self.model(hidden, positions, attention_mask=mask, past_key_values=self.cache, lean=self.lean)[0]

        return self._grow_tree(root, sequence, config, sampling, run_level)

    def observe_chain(self, sequence: torch.LongTensor, verdict: Any, target_step: Any) -> None:
        """Forget the drafts' cache entries; queue the target's features of the newly committed tokens."""
        excess = self.cache.get_seq_length() - self._committed
        if excess > 0:
            self.cache.crop(-excess)
        # The target has now processed every committed token but the newest.
        missing = sequence.shape[1] - 1 - (self._fed + self._pending.shape[1])
        fresh = target_step.hidden_states[-1][:, :missing]
        self._pending = torch.cat([self._pending, fresh.to(self._pending.dtype)], dim=1)

    def _feed_pending(self, sequence: torch.LongTensor) -> torch.Tensor:
        """A round's first forward: the committed tokens' true features (slot t reads x_{t+1} and f_t), all cached
        as committed. Returns the n predicted features [1, n, H] after the newest committed token."""
        next_tokens = sequence[:, self._fed + 1 :]
        if next_tokens.shape[1] != self._pending.shape[1]:
            raise MMSpecError("FLASH drafter is out of step with the committed sequence (was observe() skipped?)")
        predicted = self._feed(next_tokens, self._pending, self._fed)
        self._committed, self._fed = self.cache.get_seq_length(), sequence.shape[1] - 1
        self._pending = self._pending[:, :0]
        return predicted

    def _feed(self, next_tokens: torch.LongTensor, features: torch.Tensor, position: int) -> torch.Tensor:
        """Feed text positions `position`.. with inputs fc([embed(next_tokens); features]).

        Returns the n predicted features [1, n, H] of the last fed position.
        """
        hidden = self.model.text_inputs(self.embed_tokens(next_tokens), features)
        positions = self.position_ids(torch.arange(position, position + hidden.shape[1], device=hidden.device)[None])
        return self._run(hidden, positions)

    def _run(self, hidden: torch.Tensor, positions: torch.LongTensor, key_padding: torch.Tensor | None = None) -> torch.Tensor:
        self.forwards += 1
        out = self.model(hidden, positions, key_padding=key_padding, past_key_values=self.cache, lean=self.lean)
        return self.model.semi_ar(out[:, -1])

    # --- batches: each row's prompt assembled on its own, left-padded; then one slot per batch column ----

    def read_batch_prompt(self, batch: RaggedBatch, step: Any) -> None:
        self._require_hidden_states(step)
        embeds, features = step.hidden_states[0], step.hidden_states[-1]
        rows, places = [], []
        for b in range(batch.size):
            valid = batch.mask[b].bool()
            tokens, row_embeds, row_features = batch.tokens[b][valid], embeds[b][valid], features[b][valid]
            visual = torch.isin(tokens, self.visual_ids.to(tokens.device))
            visual[-1] = False  # the last prompt position drafts the first token: never compressed
            text_hidden = self.model.text_inputs(row_embeds[1:], row_features[:-1])
            # An M-RoPE drafter takes the target's 3-D positions of this row's prompt (the batch's table).
            rope = self.target.batch_rope_table[:, b][:, valid] if self.model.config.mrope_section else None
            hidden, positions, _ = self.model.assemble(text_hidden, row_embeds, visual, rope)
            rows.append(hidden)
            places.append(positions)
        width = max(r.shape[0] for r in rows)
        hidden = torch.stack([torch.cat([r.new_zeros(width - r.shape[0], r.shape[1]), r]) for r in rows])
        positions = torch.stack([torch.nn.functional.pad(p, (width - p.shape[-1], 0)) for p in places], dim=-2)
        mask = torch.stack([torch.cat([batch.mask.new_zeros(width - r.shape[0]), batch.mask.new_ones(r.shape[0])]) for r in rows])
        self.cache = DynamicCache()
        self._start_batch(mask, batch.width, features[:, -1:])
        if width:
            self.forwards += 1
            self.model(hidden, positions, key_padding=mask, past_key_values=self.cache, lean=self.lean)

    def draft_rows(self, batch: RaggedBatch, max_tokens: int, sampling: SamplingConfig,
                   generator: torch.Generator | None) -> Proposal:
        if max_tokens <= 0:
            return Proposal.empty(batch.tokens)
        n = self.model.config.semi_ar_tokens
        tokens_in, features, positions = self._take_true_slots(batch)
        predicted = self._run(self.model.text_inputs(self.embed_tokens(tokens_in), features), positions, self._slot_mask)
        tokens: list[torch.Tensor] = []
        dists: list[torch.Tensor] = []
        while True:
            for j in range(n):
                logits = self.lm_head(predicted[:, j].to(self.lm_head.weight.dtype))
                token, dist, _ = choose_draft_token(logits, sampling, generator, False)
                tokens.append(token)
                if dist is not None:
                    dists.append(dist)
                if len(tokens) == max_tokens:
                    return Proposal(tokens=torch.stack(tokens, dim=1), probs=torch.stack(dists, dim=1) if dists else None)
            # Semi-autoregressive step: the n drafts just made, each with the feature it was read from.
            mask, positions = self._draft_slots(batch, len(tokens) - n, n)
            hidden = self.model.text_inputs(self.embed_tokens(torch.stack(tokens[-n:], dim=1)), predicted)
            predicted = self._run(hidden, positions, mask)
