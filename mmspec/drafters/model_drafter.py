"""Any transformers LM as a drafter (a small model sharing the target's vocabulary)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from ..cached_model import CachedModel
from ..devices import input_device, on_device
from ..errors import MMSpecError
from ..generation import process_prefixed_rows
from ..ragged import RaggedBatch
from ..sampling import SamplingConfig, probabilities
from ..trees import (
    DraftTree,
    TreeConfig,
    grow_tree,
    level_attention_mask,
    node_path,
    refuse_flash_attention,
)
from ..types import Proposal, Verdict
from .autoregressive import AutoregressiveDrafter, common_prefix_length
from .base import DraftView


class ModelDrafter(AutoregressiveDrafter):
    """Drafts autoregressively with its own KV cache.

    The cache is kept in step lazily: before proposing, it is cropped to the longest prefix it
    shares with the committed sequence, and only the rest is fed. After a round that accepted
    n of k drafts this feeds one or two tokens, as transformers' assisted generation does.
    An encoder-decoder drafter runs its own encoder on the caller's raw encoder inputs (as
    transformers' assisted generation runs the assistant's encoder), never on the target's states.
    """

    def __init__(self, model: PreTrainedModel, lean: bool = True) -> None:
        # lean: a plain Llama steps through `mmspec.kernels.lean_llama` (same maths, less per-call cost);
        # False keeps transformers' forward for every step (the ablation, or to debug).
        self.lm = CachedModel(model, role="drafter", lean=lean)
        self._input_device = input_device(model)  # where its inputs go; read again by `begin`, once a call
        self.vocab_size = self.lm.vocab_size
        # Drafting past an end token is wasted work: the target stops there too.
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.stop_ids = frozenset() if eos is None else frozenset([eos] if isinstance(eos, int) else eos)
        self.cached_tokens = torch.empty(0, dtype=torch.long)
        self._encoder_inputs: dict[str, Any] = {}
        self._tree_state: tuple[torch.Tensor, list[int], list[int], DraftTree] | None = None

    @property
    def drafts_trees(self) -> bool:  # type: ignore[override]
        # The tree levels go through the model with a 4-D mask and a gathered cache.
        return not self.lm.is_encoder_decoder and self.lm.sliding_window is None

    @property
    def forwards(self) -> int:  # type: ignore[override]
        return self.lm.forwards

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        self._input_device = input_device(self.lm.model)
        self.lm.cache = None
        self.cached_tokens = torch.empty(0, dtype=torch.long, device=view.sequence.device)
        # A decoder-only drafter is text-only: it never sees the target's images or features.
        self._encoder_inputs = {}
        if not self.lm.is_encoder_decoder:
            return
        # The caller's own encoder inputs (`input_ids` among them), not the target's decoder prompt or encoder states.
        inputs = {k: v for k, v in (view.inputs or {}).items() if k not in ("decoder_input_ids", "decoder_attention_mask")}
        given = inputs.get("encoder_outputs")
        if given is not None:
            states = given[0] if isinstance(given, (tuple, list)) else given.last_hidden_state
            width = getattr(self.lm.model.config, "d_model", None) or getattr(self.lm.model.config, "hidden_size", None)
            if width is not None and states.shape[-1] != width:
                raise MMSpecError(
                    f"the encoder-decoder drafter runs its own encoder (width {width}); pass the encoder inputs "
                    f"(input_features / input_ids), not the target's encoder_outputs (width {states.shape[-1]})"
                )
        device = self._input_device
        self._encoder_inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}

    def catch_up(self, sequence: torch.Tensor) -> torch.Tensor:
        """Bring the cache in line with `sequence` and return the next-token logits [B, V].

        The drafter may sit on another device than the target: tokens go to its input device, and its
        logits come back on the sequence's device (where the loop compares and samples)."""
        keep = common_prefix_length(self.cached_tokens, sequence)
        keep = min(keep, sequence.shape[0] - 1)  # feed at least one token to get next-token logits
        tokens = on_device(sequence, self._input_device)
        if self.lm.cache is None or keep == 0:
            out = self.lm.prefill(tokens[None], logits_to_keep=1, **self._encoder_inputs)
        else:
            self.lm.truncate(keep)
            out = self.lm.extend(tokens[None, keep:], logits_to_keep=1)
        return on_device(out.logits[:, -1, :], sequence.device)

    def feed(self, token: torch.Tensor) -> torch.Tensor:
        out = self.lm.extend(on_device(token[:, None], self._input_device), logits_to_keep=1)
        return on_device(out.logits[:, -1, :], token.device)

    def draft_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The drafter's logits [..., V] as its drafts are chosen from (subclasses mask tokens here)."""
        return logits

    @property
    def drafts_batches(self) -> bool:  # type: ignore[override]
        # Holes in the columns would shift a sliding window.
        return self.lm.sliding_window is None

    def propose(self, view: DraftView) -> Proposal | DraftTree:
        if view.tree is not None:
            return self.draft_tree(view.sequence, view.tree, view.sampling, view.processors)
        if view.batch is not None:
            return self.draft_rows(view.batch, view.max_tokens, view.sampling, view.generator, view.processors)
        return super().propose(view)

    def draft_rows(self, batch: RaggedBatch, max_tokens: int, sampling: SamplingConfig,
                   generator: torch.Generator | None, processors: Any) -> Proposal:
        """`max_tokens` drafts for every live row, one forward per draft. The cache holds the same columns
        as the batch, holes included (masked): each round feeds the columns it has not seen yet."""
        if max_tokens <= 0:
            return Proposal.empty(batch.tokens)
        seen = self.batch_columns(batch)
        if self.lm.cache is None:
            out = self.lm.feed_columns(seen, 0, seen.tokens[:, :0], **self._encoder_inputs)
        else:
            out = self.lm.feed_columns(seen, self.lm.length, seen.tokens[:, :0])
        logits = out.logits[:, -1, :]
        tokens, dists = [], []
        for step in range(max_tokens):
            if processors:
                drafted = torch.stack(tokens, dim=1) if tokens else None
                logits = torch.cat([
                    processors(batch.prefixes(b, batch.width - 1 + step, 1, drafted)[0], logits[b:b + 1].float())
                    for b in range(batch.size)])
            token, dist, _ = self.choose(logits, sampling, generator, want_confidence=False)
            tokens.append(token)
            if dist is not None:
                dists.append(dist)
            if step + 1 < max_tokens:
                # The drafts so far are valid columns after the batch's; this one is the newest.
                out = self.lm.extend(token[:, None], logits_to_keep=1, **self._batch_inputs(seen, torch.stack(tokens, dim=1)))
                logits = out.logits[:, -1, :]
        return Proposal(tokens=torch.stack(tokens, dim=1), probs=torch.stack(dists, dim=1) if dists else None)

    def batch_columns(self, batch: RaggedBatch) -> RaggedBatch:
        """The batch as this drafter reads it (subclasses hide columns it must not see)."""
        return batch

    def _batch_inputs(self, batch: RaggedBatch, drafts: torch.LongTensor) -> dict[str, torch.Tensor]:
        inputs = batch.feed(batch.width, drafts)
        mask, positions = inputs["attention_mask"], inputs["position_ids"][:, -1:]
        if self.lm.is_encoder_decoder:
            return {"decoder_attention_mask": mask, "decoder_position_ids": positions}
        return {"attention_mask": mask, "position_ids": positions}

    def select_rows(self, keep: torch.LongTensor) -> None:
        if self.lm.cache is not None:
            self.lm.select_rows(keep)
        self._encoder_inputs = {k: v.index_select(0, keep.to(v.device)) if isinstance(v, torch.Tensor) else v
                                for k, v in self._encoder_inputs.items()}

    def draft_tree(self, sequence: torch.LongTensor, config: TreeConfig, sampling: SamplingConfig,
                   processors: Any) -> DraftTree:
        """EAGLE-2's dynamic tree (`grow_tree`): one forward to catch up, then one per level, each feeding
        that level's expanded nodes at once with a tree attention mask on top of the drafter's cache."""
        refuse_flash_attention(self.lm.model, "drafter")
        committed = sequence[0]
        root = self.catch_up(committed)
        base = self.lm.length
        fed: list[int] = []

        def logprobs(logits: torch.Tensor, paths: list[torch.Tensor]) -> torch.Tensor:
            if processors:
                prefixes = [torch.cat([committed, path])[None] for path in paths]
                logits = process_prefixed_rows(processors, prefixes, logits[None].float())[0]
            logits = self.draft_logits(logits)
            if sampling.do_sample:
                return probabilities(logits, sampling).log()
            return logits.float().log_softmax(-1)

        def expand(level: list[int], tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
            parent_list = parents.tolist()
            depth = [len(node_path(node, parent_list)) for node in level]
            mask = level_attention_mask(parent_list, fed, level, base, self.lm.model.dtype, committed.device)
            positions = torch.tensor(depth, device=committed.device)[None] + base - 1
            out = self.lm.extend(tokens[level][None], logits_to_keep=0, attention_mask=mask, position_ids=positions)
            fed.extend(level)
            paths = [tokens[node_path(node, parent_list)] for node in level]
            return logprobs(out.logits[0], paths)

        tree, grown = grow_tree(logprobs(root, [committed[:0]])[0], config, expand, self.stop_ids)
        self.cached_tokens = committed
        self._tree_state = (committed, fed, grown, tree)
        return tree

    def observe(self, view: DraftView, verdict: Verdict | None, target_step: Any) -> None:
        """After a tree round, keep the cache entries of the accepted nodes the drafter had fed."""
        if self._tree_state is None or verdict is None or verdict.path is None:
            return
        committed, fed, grown, tree = self._tree_state
        self._tree_state = None
        slot = {node: i for i, node in enumerate(fed)}
        kept = []
        for node in verdict.path:  # fed nodes are ancestor-closed: the fed part of the path is its prefix
            if grown[node] not in slot:
                break
            kept.append(node)
        base = committed.shape[0]
        self.lm.keep_positions(base, torch.tensor([base + slot[grown[n]] for n in kept], dtype=torch.long,
                                                  device=input_device(self.lm.model)))
        self.cached_tokens = torch.cat([committed, tree.path_tokens(kept).to(committed.device)])

