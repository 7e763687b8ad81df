"""What EAGLE-style feature drafters (MSD, FLASH) share: the distillation batch, the loss, the model base.

A feature drafter reads the target's own last hidden states ("features") instead of re-reading
the picture: at position t it takes the feature f_t and the next token x_{t+1}, predicts the
feature f_{t+1}, and the target's frozen LM head turns that prediction into draft logits for
x_{t+2} (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", 2024).

Conventions used by every drafter and by the trainer (`drafter_training`):

- features = the target's `hidden_states[-1]` as transformers returns it: already through the
  final norm, so `lm_head(features)` are the target's logits;
- embeds = the target's `hidden_states[0]`: the language model's input embeddings, with the
  projected visual features already merged in at the visual placeholder positions;
- the drafter stores neither the target's embedding table nor its LM head: both are borrowed
  from the target at training and drafting time, so a saved drafter is small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from transformers import DynamicCache, LlamaConfig, PreTrainedModel

from mmspec.compat import accelerate_hook
from mmspec.devices import as_device, input_device
from mmspec.drafters.base import Drafter, DraftView
from mmspec.errors import MMSpecError
from mmspec.loading import check_finite
from mmspec.ragged import RaggedBatch
from mmspec.sampling import SamplingConfig, probabilities
from mmspec.trees import DraftTree, TreeConfig, grow_tree, level_attention_mask, node_path
from mmspec.types import Proposal, Verdict

from .rope_positions import positions_at, target_prompt_positions


@dataclass
class DistillBatch:
    """A padded batch of target traces (self-distillation data), all tensors [B, L, ...].

    `loss_mask[b, t]` marks positions whose prediction of `features[b, t + 1]` is trained: t + 1
    runs from the last prompt position (whose feature predicts the first generated token) to the
    last real token.
    """

    input_ids: torch.LongTensor  # [B, L] prompt (visual placeholders expanded) + the target's greedy continuation
    embeds: torch.Tensor  # [B, L, H] target hidden_states[0]
    features: torch.Tensor  # [B, L, H] target hidden_states[-1]
    visual_mask: torch.BoolTensor  # [B, L] True at visual placeholder positions
    attention_mask: torch.LongTensor  # [B, L] 1 on real tokens, 0 on right padding
    loss_mask: torch.BoolTensor  # [B, L]
    # [3, B, L] the target's M-RoPE positions (Qwen2-VL traces); None: sequence indices (1-D RoPE)
    position_ids: torch.LongTensor | None = None


def uniform_noise_like(features: torch.Tensor, std: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Zero-mean uniform noise with standard deviation `std` (EAGLE's feature augmentation)."""
    if std <= 0:
        return torch.zeros_like(features)
    half_width = std * math.sqrt(3.0)
    noise = torch.rand(features.shape, generator=generator, dtype=features.dtype, device=features.device)
    return (noise * 2 - 1) * half_width


def eagle_loss(
    predicted: torch.Tensor,
    target_features: torch.Tensor,
    lm_head: torch.nn.Module,
    mask: torch.Tensor,
    token_weight: float = 0.1,
) -> dict[str, torch.Tensor]:
    """EAGLE's objective: SmoothL1(predicted, target feature) + token_weight * CE(target dist, draft dist).

    predicted, target_features [..., H]; mask [...] selects the trained positions. The token term
    is the cross-entropy of the drafter's distribution against the target's full distribution
    through the frozen LM head (soft labels), not against the argmax token.
    """
    pred, target = predicted[mask], target_features[mask].to(predicted.dtype)
    if pred.shape[0] == 0:
        zero = predicted.sum() * 0
        return {"loss": zero, "feature_loss": zero, "token_loss": zero, "token_accuracy": zero.detach()}
    feature_loss = F.smooth_l1_loss(pred, target)
    # The borrowed head keeps the target's dtype (e.g. bfloat16) while the drafter trains in its own.
    head_dtype = getattr(getattr(lm_head, "weight", None), "dtype", pred.dtype)
    with torch.no_grad():
        target_logits = lm_head(target.to(head_dtype))
        target_probs = target_logits.float().softmax(-1)
    draft_logp = lm_head(pred.to(head_dtype)).float().log_softmax(-1)
    token_loss = -(target_probs * draft_logp).sum(-1).mean()
    accuracy = (draft_logp.argmax(-1) == target_logits.argmax(-1)).float().mean()
    return {
        "loss": feature_loss + token_weight * token_loss,
        "feature_loss": feature_loss.detach(),
        "token_loss": token_loss.detach(),
        "token_accuracy": accuracy.detach(),
    }


# The decoder-layer fields a feature drafter's config shares with the target's text model.
LAYER_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "hidden_act", "rms_norm_eps", "max_position_embeddings")


def target_layer_shape(text_config: Any) -> dict[str, Any]:
    """`LAYER_FIELDS` of the target's text model (`config.get_text_config()`): a drafter layer is sized like it."""
    heads = text_config.num_attention_heads
    return dict(
        hidden_size=text_config.hidden_size,
        intermediate_size=text_config.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=getattr(text_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(text_config, "head_dim", None) or text_config.hidden_size // heads,
        hidden_act=getattr(text_config, "hidden_act", "silu"),
        rms_norm_eps=getattr(text_config, "rms_norm_eps", 1e-6),
        max_position_embeddings=text_config.max_position_embeddings,
    )


def plain_rope_parameters(text_config: Any) -> dict[str, Any]:
    """The target's RoPE settings without M-RoPE's (Qwen2-VL): a drafter's positions are sequence indices."""
    rope = dict(getattr(text_config, "rope_parameters", None) or {})
    for key in ("mrope_section", "mrope_interleaved"):
        rope.pop(key, None)
    return rope or {"rope_type": "default", "rope_theta": float(getattr(text_config, "rope_theta", 10000.0))}


def drafter_layer_config(config: Any, **settings: Any) -> LlamaConfig:
    """The `LlamaConfig` a drafter's decoder layer and rotary embedding are built from: its config's
    `LAYER_FIELDS` plus `settings`."""
    return LlamaConfig(**{name: getattr(config, name) for name in LAYER_FIELDS}, **settings)


class FeatureDrafterModel(PreTrainedModel):
    """Base class of trainable feature drafters; `kind` names it for `mmspec train-drafter --kind`.

    Subclasses define `training_loss(batch, embed_tokens, lm_head, noise_std=0.0, generator=None)`: their
    paper's objective on a `DistillBatch`, returning at least {"loss": ...}; the generic trainer does the
    rest (optimiser, schedule, checkpoints).
    """

    kind: str = ""
    base_model_prefix = "drafter"



@dataclass
class BorrowedTargetParts:
    """What a feature drafter takes from its target at `bind`: nothing of it is copied or saved."""

    embed_tokens: torch.nn.Module
    lm_head: torch.nn.Module
    visual_ids: torch.LongTensor  # placeholder ids of visual tokens (empty for a text-only target)
    stop_ids: set[int]  # drafting past an end token is wasted work: the target stops there too


def borrow_target_parts(model: PreTrainedModel, drafter_hidden_size: int, name: str) -> BorrowedTargetParts:
    """The target's embedding, LM head, visual placeholder ids and end ids, after checking the width."""
    from .models import feature_token_ids  # local: models imports transformers' vision classes

    width = model.config.get_text_config().hidden_size
    if width != drafter_hidden_size:
        raise MMSpecError(
            f"the {name} drafter was built for hidden size {drafter_hidden_size}, the target's language model has "
            f"{width}: train a drafter for this target"
        )
    lm_head = model.get_output_embeddings()
    if lm_head is None:
        raise MMSpecError(f"{type(model).__name__} has no LM head for the {name} drafter to borrow")
    device = input_device(model)  # where the token ids it is compared with live (the embedding may be offloaded: meta)
    try:
        visual_ids = torch.tensor(sorted(feature_token_ids(model)), dtype=torch.long, device=device)
    except MMSpecError:  # a text-only target: the drafter is then plain EAGLE
        visual_ids = torch.empty(0, dtype=torch.long, device=device)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    stop_ids = set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))
    return BorrowedTargetParts(model.get_input_embeddings(), lm_head, visual_ids, stop_ids)


def load_drafter_model(model_class: type, folder: str | Path, name: str, **kwargs: Any) -> Any:
    """`model_class.from_pretrained(folder)` in eval mode, with one clear error for a missing or foreign folder."""
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        raise MMSpecError(f"no {name} drafter in {str(folder)!r} (config.json not found)")
    try:
        model = model_class.from_pretrained(str(path), **kwargs)
    except Exception as err:  # wrong model type, missing or mismatched weights
        raise MMSpecError(f"could not load a {name} drafter from {str(folder)!r}: {str(err).strip().splitlines()[0]}") from err
    check_finite(model, str(folder), f"{name} drafter")
    return model.eval()


def as_drafter_model(model: Any, model_class: type, name: str) -> Any:
    """A runtime drafter's model argument (a trained model or its folder) as an eval-mode `model_class`."""
    if isinstance(model, (str, Path)):
        model = load_drafter_model(model_class, model, name)
    if not isinstance(model, model_class):
        raise MMSpecError(f"the {name} drafter needs a {model_class.__name__}, got {type(model).__name__}")
    return model.eval()


class TargetFeatureDrafter(Drafter):
    """What the MSD and FLASH runtime drafters share: a trained feature-drafter model that drafts from
    the target's own features and through the target's LM head, borrowed at `bind` (never copied).

    Subclasses set `model_class` (the trained model's class) and `method_name` (for messages).
    """

    needs_target_hidden_states = True
    drafts_from_prompt = False
    vocab_size = None  # drafts through the target's own LM head: vocabularies always agree
    model_class: type = FeatureDrafterModel
    method_name = "feature"

    def __init__(self, model: FeatureDrafterModel | str | Path, lean: bool = True,
                 device: str | torch.device | None = None) -> None:
        self.model = as_drafter_model(model, self.model_class, self.method_name)
        # A device of its own (`drafter_device`): the network stays there, and its methods take the loop's
        # tensors there and hand their results back (`own_device`). None: it follows the target's LM head.
        self.device = None if device is None else as_device(device, "drafter_device")
        if self.device is not None:
            self.model.to(self.device)
        # The model's decoder layers step through `mmspec.kernels.lean_llama` (False: transformers' forward).
        self.lean = lean
        self.forwards = 0
        self.target: Any = None
        self.cache: DynamicCache | None = None
        self._model_inputs: dict[str, Any] = {}
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # the target's M-RoPE prompt positions

    def begin(self, view: DraftView, model_inputs: dict[str, Any]) -> None:
        """A new prompt: no cache and no prompt positions yet; the target's inputs are kept for its M-RoPE positions."""
        self.cache, self._model_inputs, self._rope_table = None, model_inputs, None

    # Each shape has its own steps in the subclasses: one sequence (`read_prompt`, `draft_chain`, `draft_tree`,
    # `observe_chain`) and a batch (`read_batch_prompt`, `draft_rows`; `observe_rows` and `select_rows` here).

    def propose(self, view: DraftView) -> Proposal | DraftTree:
        if view.tree is not None:
            return self.draft_tree(view.sequence, view.tree, view.sampling)
        if view.batch is not None:
            return self.draft_rows(view.batch, view.max_tokens, view.sampling, view.generator)
        return self.draft_chain(view.sequence, view.max_tokens, view.sampling, view.generator, view.policy)

    def observe(self, view: DraftView, verdict: Verdict | None, target_step: Any) -> None:
        if verdict is None:  # the target's prefill
            if view.batch is None:
                self.read_prompt(view.sequence, target_step)
            else:
                self.read_batch_prompt(view.batch, target_step)
        elif view.batch is None:
            self.observe_chain(view.sequence, verdict, target_step)
        else:
            self.observe_rows(view.batch, verdict, target_step)

    def position_ids(self, indices: torch.LongTensor) -> torch.LongTensor:
        """Rotary positions of sequence `indices` [B, L]: the target's own (3-D) under M-RoPE, else the indices."""
        return positions_at(indices, self._rope_table)

    def _require_hidden_states(self, step: Any) -> None:
        if step.hidden_states is None:
            raise MMSpecError(f"{self.method_name} needs the target's hidden states (run it through SpeculativeDecoder)")

    def _read_rope_table(self, sequence: torch.LongTensor) -> None:
        """At the target's prefill: a drafter of an M-RoPE target takes the target's positions of the prompt."""
        if self.model.config.mrope_section:
            self._rope_table = target_prompt_positions(self.target.model, sequence, self._model_inputs)

    def bind(self, target: Any) -> None:
        parts = borrow_target_parts(target.model, self.model.config.hidden_size, self.method_name)
        self.embed_tokens, self.lm_head = parts.embed_tokens, parts.lm_head
        self.visual_ids, self._stop_ids = parts.visual_ids, parts.stop_ids
        # Next to the head it feeds: where accelerate runs it when the head is offloaded (its weight then reads meta).
        if self.device is None:
            hook = accelerate_hook(self.lm_head)
            self.model.to(getattr(hook, "execution_device", None) or self.lm_head.weight.device)
        self.target = target

    def _grow_tree(self, root: torch.Tensor, sequence: torch.LongTensor, config: TreeConfig, sampling: SamplingConfig,
                   run_level: Callable[[torch.LongTensor, torch.Tensor, torch.Tensor, torch.LongTensor], torch.Tensor],
                   ) -> DraftTree:
        """EAGLE-2's dynamic tree below the newest committed token of `sequence`, whose predicted feature is `root` [H].

        Each level's expanded nodes go through the drafter in one forward on top of the cache:
        `run_level(tokens [1, L], parent features [1, L, H], tree mask, positions)` returns their predicted
        features [L, H]. A node at depth d holds the token of sequence position base + d and is fed in the slot
        of position base + d - 1 (a slot consumes the next token and the feature of its own position).
        """
        base = sequence.shape[1] - 1
        past = self.cache.get_seq_length()
        fed: list[int] = []
        predicted: dict[int, torch.Tensor] = {-1: root}

        def logprobs(hidden: torch.Tensor) -> torch.Tensor:
            logits = self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()
            return probabilities(logits, sampling).log() if sampling.do_sample else logits.log_softmax(-1)

        def expand(level: list[int], tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
            parent_list = parents.tolist()
            depths = [len(node_path(node, parent_list)) for node in level]
            features = torch.stack([predicted[parent_list[node]] for node in level])[None]
            mask = level_attention_mask(parent_list, fed, level, past, features.dtype, features.device)
            positions = self.position_ids(torch.tensor(depths, device=features.device)[None] + base - 1)
            self.forwards += 1
            out = run_level(tokens[level][None], features, mask, positions)
            fed.extend(level)
            for row, node in enumerate(level):
                predicted[node] = out[row]
            return logprobs(out)

        tree, _ = grow_tree(logprobs(root[None])[0], config, expand, self._stop_ids)
        return tree

    # --- batches (`mmspec.ragged`) ------------------------------------------------------------------
    # After the prompt, the drafter's cache gains one true slot per batch column: slot c consumes the
    # token of column c and the target's feature of the row's previous valid column (holes masked). Draft
    # slots read predicted features and are cropped after each round; the true features of the round's
    # columns are queued by `observe_rows` for the next round's first forward.

    drafts_batches = True

    def _start_batch(self, slot_mask: torch.Tensor, batch_columns: int, pending: torch.Tensor) -> None:
        """After the prompt's slots: the cache's padding mask [B, D], batch columns covered, queued features [B, m, H]."""
        self._slot_mask, self._batch_fed, self._pending = slot_mask, batch_columns, pending

    def _batch_rope(self, positions: torch.LongTensor, prompt_columns: torch.LongTensor | None = None) -> torch.LongTensor:
        """Rotary positions of a batch's slots: 1-D `positions` [B, m] as they are, or for an M-RoPE drafter the
        target's own [3, B, m]: its prompt table at `prompt_columns` [B, m], else text position + row delta."""
        if not self.model.config.mrope_section:
            return positions
        table, deltas = self.target.batch_rope_table, self.target.batch_rope_deltas
        if prompt_columns is not None:
            return table.to(positions.device).gather(2, prompt_columns[None].expand(3, *prompt_columns.shape))
        return (positions + deltas.to(positions.device))[None].expand(3, *positions.shape)

    def _take_true_slots(self, batch: RaggedBatch) -> tuple[torch.LongTensor, torch.Tensor, torch.LongTensor]:
        """The batch columns not fed yet: their tokens [B, m], queued features [B, m, H] and slot positions [B, m]."""
        start, count = self._batch_fed, batch.width - self._batch_fed
        features, self._pending = self._pending[:, :count], self._pending[:, count:]
        self._slot_mask = torch.cat([self._slot_mask, batch.mask[:, start:]], dim=1)
        self._batch_fed = batch.width
        # A slot sits one position before the token it consumes.
        return batch.tokens[:, start:], features, self._batch_rope((batch.column_positions(start) - 1).clamp(min=0))

    def _draft_slots(self, batch: RaggedBatch, first: int, count: int) -> tuple[torch.Tensor, torch.LongTensor]:
        """Padding mask and positions [B, count] for draft slots `first`..`first + count - 1` of this round."""
        mask = torch.cat([self._slot_mask, self._slot_mask.new_ones((batch.size, first + count))], dim=1)
        return mask, self._batch_rope(batch.next_positions(first + count)[:, first:] - 1)

    def observe_rows(self, batch: RaggedBatch, verdict: Verdict, target_step: Any) -> None:
        """Crop the draft slots; queue the features the round's columns read: a draft column the column
        before it, the new token's column the row's last accepted one."""
        excess = self.cache.get_seq_length() - self._slot_mask.shape[1]
        if excess > 0:
            self.cache.crop(-excess)
        features = target_step.hidden_states[-1]  # the verify forward's columns: newest token, then the drafts
        rows = torch.arange(features.shape[0], device=features.device)
        last = features[rows, verdict.num_accepted.to(features.device)]
        self._pending = torch.cat([self._pending, features[:, :-1].to(self._pending.dtype), last[:, None].to(self._pending.dtype)], dim=1)

    def select_rows(self, keep: torch.LongTensor) -> None:
        self.cache.batch_select_indices(keep.to(self._pending.device))
        self._slot_mask = self._slot_mask.index_select(0, keep.to(self._slot_mask.device))
        self._pending = self._pending.index_select(0, keep.to(self._pending.device))

