"""Class-conditional target with classifier-free guidance inside, and its face to the core loop.

`CFGTarget` runs the conditional and the unconditional rows in ONE forward
(batch = [cond rows; uncond rows], the uncond rows labelled `config.null_class`) and returns
guided logits `uncond + scale * (cond - uncond)`. Every consumer (the target's verification, a
drafter's own guided model) goes through it, so all see the same guided model. With
guidance_scale == 1 the guided logits equal the conditional ones, and the unconditional rows are skipped.

`GuidedImageTarget` shows a `CFGTarget` to the core loop (`mmspec.decoding`) as a token sequence:

    sequence = [condition, t_1, ..., t_n]       the condition (a class label for LlamaGen, a prompt
                                                index for Janus) sits at position 0, image tokens follow
    prefill  = the condition (+ drafts riding along); score = [t_n, drafts...]
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mmspec.errors import MMSpecError
from mmspec.stats import SpecStats
from mmspec.targets import Target, TargetStep

from .llamagen import LlamaGenCache, LlamaGenForClassConditional


def guided_logits(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    return uncond + scale * (cond - uncond)


class CFGTarget:
    """A class-conditional AR image model plus its KV cache, seen through classifier-free guidance.

    Cache bookkeeping counts positions the model has consumed: 1 class position + image tokens.
    `length` is the number of *image tokens* in the cache.
    """

    def __init__(self, model: LlamaGenForClassConditional, guidance_scale: float = 1.0) -> None:
        self.model = model.eval()
        self.config = model.config
        self.guidance_scale = float(guidance_scale)
        self.cache: LlamaGenCache | None = None
        self.batch = 0
        self.forwards = 0

    def for_call(self, guidance_scale: float | None = None,
                 prompts: Sequence[torch.Tensor | Sequence[int]] | None = None) -> "CFGTarget":
        """This target for one generation call: the same model, the call's own guidance scale (None: this
        one's), cache and counters, so calls running at once through one pipeline never share them.
        `prompts`: for text-conditional subclasses (Janus); a class-conditional model takes none."""
        if prompts is not None:
            raise MMSpecError(f"{type(self).__name__} is class-conditional: it takes class labels, not prompts")
        call = copy.copy(self)
        call.guidance_scale = self.guidance_scale if guidance_scale is None else float(guidance_scale)
        call.cache, call.batch, call.forwards = None, 0, 0
        return call

    @property
    def uses_guidance(self) -> bool:
        return self.guidance_scale != 1.0

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def num_tokens(self) -> int:
        return int(self.config.block_size)

    @property
    def grid_size(self) -> int:
        return int(self.config.grid_size)

    @property
    def length(self) -> int:
        if self.cache is None:
            return 0
        return self.cache.get_seq_length() - self.config.cls_token_num

    def _rows(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat([tensor, tensor]) if self.uses_guidance else tensor

    def _guide(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.uses_guidance:
            return logits
        cond, uncond = logits.chunk(2)
        return guided_logits(cond, uncond, self.guidance_scale)

    def labels_with_null(self, class_labels: torch.LongTensor) -> torch.LongTensor:
        if not self.uses_guidance:
            return class_labels
        if self.config.class_dropout_prob <= 0:
            raise MMSpecError("classifier-free guidance needs a model trained with a null class (class_dropout_prob > 0)")
        return torch.cat([class_labels, torch.full_like(class_labels, self.config.null_class)])

    @torch.no_grad()
    def start(self, class_labels: torch.LongTensor, tokens: torch.LongTensor | None = None) -> torch.Tensor:
        """Prefill the class position (plus optional image tokens [B, T]); guided logits [B, 1 + T, V]."""
        class_labels = torch.as_tensor(class_labels, dtype=torch.long, device=self.model.device).reshape(-1)
        if int(class_labels.min()) < 0 or int(class_labels.max()) >= self.config.num_classes:
            raise MMSpecError(f"class labels must be in [0, {self.config.num_classes}), got {class_labels.tolist()}")
        self.batch = class_labels.shape[0]
        out = self.model(
            class_labels=self.labels_with_null(class_labels),
            input_ids=None if tokens is None else self._rows(tokens),
            past_key_values=LlamaGenCache(),
            use_cache=True,
        )
        self.forwards += 1
        self.cache = out.cache
        return self._guide(out.logits)

    @torch.no_grad()
    def extend(self, tokens: torch.LongTensor) -> torch.Tensor:
        """Feed image tokens [B, T] after the cache; guided logits [B, T, V]."""
        if self.cache is None:
            raise RuntimeError("extend() called before start()")
        out = self.model(input_ids=self._rows(tokens), past_key_values=self.cache, use_cache=True)
        self.forwards += 1
        return self._guide(out.logits)

    def token_embeddings(self) -> torch.Tensor:
        """The model's input embedding of every image code [V, D]: what GSD's latent filter compares."""
        return self.model.get_input_embeddings().weight.detach()

    def truncate(self, length: int) -> None:
        """Roll the cache back to hold the class position and the first `length` image tokens."""
        if length > self.length:
            raise RuntimeError(f"cannot truncate a cache of {self.length} image tokens to {length}")
        self.cache.crop(self.config.cls_token_num + length)

    @torch.no_grad()
    def full_logits(self, class_labels: torch.LongTensor, tokens: torch.LongTensor) -> torch.Tensor:
        """Guided logits for a whole prefix, without a cache: [B, 1 + T, V] (for tests and scoring)."""
        out = self.model(class_labels=self.labels_with_null(class_labels), input_ids=self._rows(tokens))
        return self._guide(out.logits)


@dataclass
class ImageTokensOutput:
    """Generated token grids [B, h, w] and the statistics of the run."""

    tokens: torch.LongTensor
    stats: SpecStats


class GuidedImageTarget(Target):
    """The core loop's `Target` over a `CFGTarget` (LlamaGen, or any subclass such as Janus's).

    Cache positions count the condition position(s) + image tokens, the same unit as the core's
    sequence, so the core's `truncate(length - rejected)` rolls back exactly the rejected drafts.
    """

    # The method's own guidance and sampling decide; a Janus checkpoint's text generation config
    # (its guidance_scale, text sampling settings) is not applied to the image head.
    reads_generation_config = False

    def __init__(self, cfg: CFGTarget) -> None:
        super().__init__(cfg.model)
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size  # the image head, not e.g. Janus's text head

    @property
    def length(self) -> int:  # type: ignore[override]
        # One sequence entry for the condition, however many cache positions it fills (Janus: a prompt).
        return 0 if self.cfg.cache is None else 1 + self.cfg.length

    def initial_sequence(self, input_ids: torch.LongTensor | None, model_inputs: dict[str, Any]) -> torch.LongTensor:
        if input_ids is None or input_ids.dim() != 2 or input_ids.shape[1] != 1:
            raise MMSpecError("image decoding starts from conditions: input_ids must be [[condition], ...]")
        return input_ids

    # A batch of conditions decodes in lockstep (plain AR: no drafts, no holes, no early stops), one forward
    # per token for all rows; image drafters draft one grid at a time.

    def _feed_rows(self, batch: Any, start: int, drafts: torch.Tensor, **model_inputs: Any) -> TargetStep:
        if drafts.shape[1] or (start and not bool(batch.mask.bool().all())):
            raise MMSpecError("a batch of image conditions decodes plain AR (method ar); draft one condition at a time")
        return self._score(batch.tokens[:, -1:]) if start else self._start_sequence(batch.tokens, **model_inputs)

    def select_rows(self, keep: torch.LongTensor) -> None:
        raise MMSpecError("image grids have no end token: every row of a batch runs to the last token")

    def _start_sequence(self, sequence: torch.LongTensor, num_logits: int = 1, **model_inputs: Any) -> TargetStep:
        tokens = sequence[:, 1:] if sequence.shape[1] > 1 else None
        logits = self.cfg.start(sequence[:, 0], tokens)
        self.forwards += 1
        return TargetStep(logits=logits[:, -num_logits:])

    def _score(self, tokens: torch.LongTensor) -> TargetStep:
        logits = self.cfg.extend(tokens)
        self.forwards += 1
        return TargetStep(logits=logits)

    def truncate(self, length: int) -> None:
        self.cfg.truncate(length - 1)
