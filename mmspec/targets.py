"""The target side of the loop: prefill once, then score k + 1 positions per round."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers import PreTrainedModel
from transformers.generation.logits_process import LogitsProcessorList

from . import compat
from .cached_model import CachedModel
from .devices import input_device
from .errors import MMSpecError
from .generation import MASKING_PROCESSORS, build_logits_processors, process_prefixed_rows, process_rows
from .kernels.certified_head import CertifiedHead, certified_head_available, certified_head_for
from .kernels.lean_llama import has_hooks
from .ragged import RaggedBatch
from .trees import DraftTree, refuse_flash_attention, tree_attention_mask
from .types import Verdict

# Inputs with one entry per prompt token, [B, L]: extended over drafts that join the prefill.
PER_TOKEN_INPUTS = ("mm_token_type_ids", "token_type_ids")
# Model classes whose logits are `lm_head` / `proj_out` (a Linear) over their base model's last hidden state and
# nothing more (transformers 5.x: no scaling, soft-capping or bias), so greedy verification may take argmaxes from a
# `CertifiedHead`. Exact class names: a subclass may compute its logits differently.
PLAIN_HEAD_CLASSES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
    "LlavaForConditionalGeneration", "LlavaNextForConditionalGeneration", "LlavaNextVideoForConditionalGeneration",
    "LlavaOnevisionForConditionalGeneration", "VideoLlavaForConditionalGeneration",
    "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
    "WhisperForConditionalGeneration",
})


@dataclass
class TargetStep:
    """What one target forward produced, handed to drafters in `observe()`."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None


class Target(CachedModel):
    """Wraps a transformers LM (decoder-only or encoder-decoder) as the verifier.

    The committed sequence always has one more token than the cache: the newest token is fed
    at the start of the next `verify()` call, together with the drafts.

    Logits come back processed as `generate` processes them: `processors` (set per call by the
    loop from the generation settings, see `build_logits_processors`) run on every returned row
    with the token prefix that row follows.
    """

    # Whether the model's shipped `generation_config` (sampling, penalties, ...) applies to this
    # decoding, as in its `generate`; False for targets whose settings come from elsewhere.
    reads_generation_config: bool = True
    # Whether `start` / `verify` serve a ragged batch on this target (batch size > 1, see `mmspec.ragged`).
    decodes_batches: bool = True
    # Below this many head weights (vocabulary x width) the float32 head is a small part of a forward: keep it.
    certified_head_min_size: int = 1 << 22

    def __init__(self, model: PreTrainedModel, output_hidden_states: bool = False) -> None:
        # lean: a plain Llama verifies chains through `mmspec.kernels.lean_llama` where that is bitwise its own
        # forward (see `_lean_covers`): the same logits without transformers' per-call machinery.
        super().__init__(model, role="target", lean=True)
        self.output_hidden_states = output_hidden_states
        self.processors = LogitsProcessorList()
        self._tokens: torch.LongTensor | None = None  # the tokens fed so far, for the processors' prefixes
        # Set by the loop per call: only each row's argmax of the processed logits will be read (greedy rule).
        self.certify_greedy = False
        self.use_certified_head = True  # False: always the model's own float32 head (e.g. to measure the difference)
        self.certified_head: CertifiedHead | None = None

    def input_names(self) -> set[str] | None:
        """Model-input names a call may pass (None: what the model's forward takes)."""
        return None

    def build_logits_processors(self, config: Any, prompt_length: int, user_processors: list[Any],
                                encoder_input_ids: torch.LongTensor | None = None) -> LogitsProcessorList:
        """The logits processors `generate` would use for this call (targets with their own rules override)."""
        return build_logits_processors(self.model, config, prompt_length, user_processors, encoder_input_ids)

    def initial_sequence(self, input_ids: torch.LongTensor | None, model_inputs: dict[str, Any]) -> torch.LongTensor:
        """The token sequence decoding continues: the prompt, or the decoder prompt of an encoder-decoder."""
        if not self.is_encoder_decoder:
            if input_ids is None:
                raise MMSpecError("input_ids is required for a decoder-only target")
            return input_ids
        decoder_ids = model_inputs.pop("decoder_input_ids", None)
        if decoder_ids is None:
            start = self.model.generation_config.decoder_start_token_id
            if start is None:
                start = self.model.config.decoder_start_token_id
            if start is None:
                raise MMSpecError("the encoder-decoder target has no decoder_start_token_id; pass decoder_input_ids")
            batch = input_ids.shape[0] if input_ids is not None else 1
            decoder_ids = torch.full((batch, 1), int(start), dtype=torch.long, device=input_device(self.model))
        if input_ids is not None:
            model_inputs["input_ids"] = input_ids
        return decoder_ids

    # --- the loop's four calls: start, verify, rollback, select_rows (one of each for every shape) -------------

    def start(self, prompt: torch.Tensor | RaggedBatch, drafts: torch.Tensor | None = None,
              **model_inputs: Any) -> TargetStep:
        """The prefill of one sequence's prompt [1, L] or of a ragged batch's left-padded prompts, with `drafts`
        [B, k] appended when they ride along: then it is the first verification too, logits [B, k + 1, V] from the
        prompt's last token on (else [B, 1, V]). Drafts that may not join the prefill (`drafts_can_join_prefill`)
        are scored in a second forward."""
        if isinstance(prompt, RaggedBatch):
            return self._feed_rows(prompt, 0, prompt.tokens[:, :0] if drafts is None else drafts, **model_inputs)
        if drafts is None:
            return self._start_sequence(prompt, 1, **model_inputs)
        return self._start_sequence(torch.cat([prompt, drafts], dim=1), drafts.shape[1] + 1, **model_inputs)

    def verify(self, committed: torch.Tensor | RaggedBatch, drafts: torch.Tensor | DraftTree) -> TargetStep:
        """ONE forward over the newest committed token and the drafts: of one sequence [1, L] (a chain [1, k]:
        logits [1, k + 1, V]; a `DraftTree`: logits [1, N + 1, V], see `_score_tree`) or of each row of a ragged
        batch (drafts [B, k]: logits [B, k + 1, V])."""
        if isinstance(committed, RaggedBatch):
            assert isinstance(drafts, torch.Tensor)
            return self._feed_rows(committed, committed.width - 1, drafts)
        if isinstance(drafts, DraftTree):
            return self._score_tree(committed, drafts)
        return self._score(torch.cat([committed[:, -1:], drafts], dim=1))

    def rollback(self, drafts: torch.Tensor | DraftTree, verdict: Verdict) -> None:
        """After verifying one sequence's drafts: drop the rejected ones from the cache (of a tree, every node off
        the accepted path). The cache then holds every committed token but the newest. A batch keeps its rejected
        drafts as masked holes instead (`mmspec.ragged`)."""
        if not isinstance(drafts, DraftTree):
            self.truncate(self.length - (drafts.shape[1] - verdict.first_accepted()))
            return
        path, root = verdict.path or [], self.length - drafts.size - 1
        self.keep_positions(root + 1, torch.tensor(path, dtype=torch.long, device=input_device(self.model)) + root + 1)
        if self._tokens is not None:
            self._tokens = torch.cat([self._tokens, drafts.path_tokens(path)[None].to(self._tokens.device)], dim=1)

    # (`select_rows`, from `CachedModel`: rows of a batch that finished leave the cache.)

    def _start_sequence(self, sequence: torch.LongTensor, num_logits: int = 1, **model_inputs: Any) -> TargetStep:
        """Prefill all of `sequence`, keeping the logits of its last `num_logits` positions."""
        num_drafts = num_logits - 1
        # A prefill that fills a sliding window drops states before they are recorded: drafts that
        # might be rejected must then come in a second forward.
        beyond_window = self.sliding_window is not None and sequence.shape[1] >= self.sliding_window
        if num_drafts > 0 and (beyond_window or not self.drafts_can_join_prefill(sequence[:, -num_drafts:], model_inputs)):
            first = self._start_sequence(sequence[:, :-num_drafts], 1, **model_inputs)
            rest = self._score(sequence[:, -num_drafts:])
            hidden = None
            if first.hidden_states is not None and rest.hidden_states is not None:
                hidden = tuple(torch.cat(pair, dim=1) for pair in zip(first.hidden_states, rest.hidden_states))
            return TargetStep(logits=torch.cat([first.logits, rest.logits], dim=1), hidden_states=hidden)
        self._tokens = self._tokens_for_processors(sequence)
        for name in PER_TOKEN_INPUTS:
            value = model_inputs.get(name)
            if value is not None and value.shape[-1] < sequence.shape[-1]:
                # The drafts riding along with the prefill are text.
                pad = value.new_zeros((*value.shape[:-1], sequence.shape[-1] - value.shape[-1]))
                model_inputs[name] = torch.cat([value, pad], dim=-1)
        certify = self._certifies()
        out = self.prefill(sequence, logits_to_keep=num_logits, head=not certify, **self._hidden_request(), **model_inputs)
        return self._finish(out, num_logits, sequence.shape[1] - num_logits, certify)

    def drafts_can_join_prefill(self, drafts: torch.Tensor, model_inputs: dict[str, Any]) -> bool:
        """Whether drafts may be appended to the prompt in the prefill forward.

        Safe by default only for text-only decoder inputs and for encoder-decoders (whose extra
        inputs feed the encoder). Multimodal targets opt in through their adapter's Target, which
        knows which draft tokens would be mistaken for image or video slots.
        """
        return self.is_encoder_decoder or not model_inputs

    def _score(self, tokens: torch.LongTensor) -> TargetStep:
        """One forward over [last committed token, drafts...]: logits [B, k + 1, V]."""
        first_position = self.length
        certify = self._certifies()
        out = self.extend(tokens, logits_to_keep=0, head=not certify, **self._hidden_request())
        if self._tokens is not None:
            self._tokens = torch.cat([self._tokens[:, :first_position], tokens], dim=1)
        return self._finish(out, tokens.shape[1], first_position, certify)

    def _tokens_for_processors(self, sequence: torch.LongTensor) -> torch.LongTensor | None:
        """The fed tokens to keep from a prefill on: only processors read them, so with none (fixed for a call before
        its prefill) none are kept and the rounds skip that bookkeeping."""
        return sequence if self.processors else None

    def _finish(self, out: Any, num_logits: int, first_position: int, certify: bool) -> TargetStep:
        """The step of one sequence's forward: logits of its last `num_logits` positions, the first of which predicts
        the token after `first_position`, processed (from a `CertifiedHead` when `certify`: `out` is the base model's)."""
        process = None
        if self.processors:
            fed = self._tokens
            if fed is None:
                raise MMSpecError("logits processors were set on the target after its prefill; set them before `start`")

            def process(logits: torch.Tensor) -> torch.Tensor:
                return process_rows(self.processors, fed, first_position, logits)
        if certify:
            return self._certified_logits(out.last_hidden_state[:, -num_logits:], process)
        step = self._step(out, num_logits)
        return step if process is None else TargetStep(logits=process(step.logits), hidden_states=step.hidden_states)

    def _hidden_request(self) -> dict[str, bool]:
        return {"output_hidden_states": True} if self.output_hidden_states else {}

    def _feed_rows(self, batch: RaggedBatch, start: int, drafts: torch.Tensor, **model_inputs: Any) -> TargetStep:
        """A ragged batch's forward over its columns from `start` on (0: the prefill) and `drafts` [B, k]: logits
        [B, k + 1, V], each row's processed with that row's own prefixes."""
        for name in PER_TOKEN_INPUTS:
            value = model_inputs.get(name)
            if value is not None and drafts.shape[1]:
                model_inputs[name] = torch.cat([value, value.new_zeros((*value.shape[:-1], drafts.shape[1]))], dim=-1)
        count, certify = drafts.shape[1] + 1, self._certifies()
        out = self.feed_columns(batch, start, drafts, logits_to_keep=count, head=not certify, **self._hidden_request(),
                                **model_inputs)
        if certify:
            def process(logits: torch.Tensor) -> torch.Tensor:
                return self._processed_batch(TargetStep(logits=logits), batch, batch.width - 1, drafts).logits
            return self._certified_logits(out.last_hidden_state[:, -count:], process)
        return self._processed_batch(self._step(out, count), batch, batch.width - 1, drafts)

    def _processed_batch(self, step: TargetStep, batch: RaggedBatch, first_column: int,
                         drafts: torch.LongTensor | None = None) -> TargetStep:
        """Each row's logits processed with that row's own prefixes (rows accept different drafts)."""
        if not self.processors:
            return step
        count = step.logits.shape[1]
        prefixes = [batch.prefixes(b, first_column, count, drafts) for b in range(batch.size)]
        if batch.size > 1 and all(len({row[j].shape[1] for row in prefixes}) == 1 for j in range(count)):
            # Every row's prefixes as long as the others' (no holes: greedy rows that started together): one call over
            # the stacked rows instead of one per row; a processor's row of scores reads only that row's prefix.
            stacked = [torch.cat([row[j] for row in prefixes]) for j in range(count)]
            return TargetStep(logits=process_prefixed_rows(self.processors, stacked, step.logits),
                              hidden_states=step.hidden_states)
        rows = [process_prefixed_rows(self.processors, prefixes[b], step.logits[b:b + 1]) for b in range(batch.size)]
        return TargetStep(logits=torch.cat(rows), hidden_states=step.hidden_states)

    def check_tree_support(self) -> None:
        """Refuse, with one clear line, a target a draft tree cannot be verified on."""
        if self.is_encoder_decoder:
            raise MMSpecError("tree drafting supports decoder-only targets; draft chains for encoder-decoder models")
        if self.sliding_window is not None:
            raise MMSpecError("tree drafting cannot roll back a sliding-window cache; draft chains for this model")
        refuse_flash_attention(self.model, "target")

    def tree_position_ids(self, positions: torch.LongTensor) -> torch.LongTensor:
        """Position ids for a tree forward from text positions [1, Q] (targets with other position
        schemes, e.g. Qwen2-VL's 3-D M-RoPE, override this)."""
        return positions

    def _score_tree(self, sequence: torch.LongTensor, tree: DraftTree) -> TargetStep:
        """ONE forward over [newest committed token, tree nodes...]: logits [1, N + 1, V], row 0 after the root,
        row i + 1 after node i. Each node sits at position (committed length - 1 + depth) and sees the cached
        prefix, the root and its ancestors; its logits are processed with the prefix its own path makes."""
        past = self.length
        tokens = torch.cat([sequence[:, -1:], tree.tokens[None].to(sequence.device)], dim=1)
        depths = torch.cat([tree.depths().new_zeros(1), tree.depths()]).to(sequence.device)
        positions = self.tree_position_ids((past + depths)[None])
        step = self.tree_forward(tokens, positions, tree, past)
        self._tokens = self._tokens_for_processors(sequence)
        if not self.processors:
            return step
        prefixes = [sequence] + [torch.cat([sequence, tree.path_tokens(tree.path_to(i))[None]], dim=1)
                                 for i in range(tree.size)]
        return TargetStep(logits=process_prefixed_rows(self.processors, prefixes, step.logits),
                          hidden_states=step.hidden_states)

    def tree_forward(self, tokens: torch.Tensor, positions: torch.Tensor, tree: DraftTree, past: int) -> TargetStep:
        """The forward of `_score_tree` over [root, nodes] `tokens` [1, N + 1] at `positions`, on top of `past` cached
        positions, with the tree attention mask: its unprocessed step (the static path pads it to a fixed width)."""
        mask = tree_attention_mask(tree, past, self.model.dtype, tokens.device)
        out = self.extend(tokens, logits_to_keep=0, attention_mask=mask, position_ids=positions, **self._hidden_request())
        return self._step(out, tokens.shape[1])

    def truncate(self, length: int) -> None:
        super().truncate(length)
        if self._tokens is not None:
            self._tokens = self._tokens[:, :length]

    def _lean_covers(self, extra: dict[str, Any]) -> bool:  # type: ignore[override]
        """Verify through the lean forward only where it gives bitwise the logits and cache of the model's own forward
        (`tests/test_lean_target.py`): a chain of tokens (no tree mask, no hidden states), float32 weights on a CPU, and
        the model's forward not replaced on the instance (a wrapper there, like a hook, expects to be called)."""
        if extra or "forward" in self.model.__dict__ or self._lean is None:
            return False
        weight = self._lean.decoder.embed_tokens.weight
        return weight.device.type == "cpu" and weight.dtype == torch.float32

    @property
    def plain_output_head(self) -> bool:
        """Whether the model's logits are its output head over its base model's last hidden state, nothing more."""
        return type(self.model).__name__ in PLAIN_HEAD_CLASSES

    def _certifies(self) -> bool:
        """Whether this forward's logits may come from a `CertifiedHead`: the loop reads greedy choices only, the
        logits are the plain output head, large, float32 on a CPU, no accelerate hooks, and every processor only masks."""
        if not (self.certify_greedy and self.use_certified_head and self.plain_output_head) or self.output_hidden_states:
            return False
        head = self.model.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear) or head.bias is not None or not certified_head_available(head.weight):
            return False
        if head.weight.numel() < self.certified_head_min_size:
            return False
        # The head's own forward is skipped, and so would be hooks on it or on the model (accelerate's included).
        hooked = any(has_hooks(m) or compat.accelerate_hook(m) is not None for m in (self.model, head))
        if hooked or getattr(self.model, "hf_device_map", None):
            return False
        return all(type(processor) in MASKING_PROCESSORS for processor in self.processors)

    def _certified_logits(self, hidden: torch.Tensor, process: Callable[[torch.Tensor], torch.Tensor] | None) -> TargetStep:
        self.certified_head = certified_head_for(self.model.get_output_embeddings().weight)
        return TargetStep(logits=self.certified_head.logits(hidden, process))

    def _step(self, out: Any, num_logits: int) -> TargetStep:
        # Models without `logits_to_keep` return every position's logits: keep the last ones.
        logits = out.logits[:, -num_logits:]
        hidden = out.decoder_hidden_states if self.is_encoder_decoder else getattr(out, "hidden_states", None)
        return TargetStep(logits=logits, hidden_states=hidden if self.output_hidden_states else None)


# model_type -> Target factory. Adapters register the targets their models need (Whisper's
# suppressed tokens, VLM placeholder handling); the core looks them up for raw models.
TARGET_FACTORIES: dict[str, Callable[[PreTrainedModel], Target]] = {}
# Adapters announce themselves as entry points of this group (pyproject.toml); any installed
# package can add one. They are loaded once, lazily, the first time a model type is unknown.
ADAPTER_ENTRY_POINTS = "mmspec.adapters"
_adapters_loaded = False


def load_adapters() -> None:
    """Import every installed adapter so it can register its targets."""
    global _adapters_loaded
    if _adapters_loaded:
        return
    _adapters_loaded = True
    for entry_point in importlib.metadata.entry_points(group=ADAPTER_ENTRY_POINTS):
        entry_point.load()


def register_target(model_type: str, factory: Callable[[PreTrainedModel], Target]) -> None:
    TARGET_FACTORIES[model_type] = factory


def as_target(model: PreTrainedModel | Target) -> Target:
    """The right `Target` for a raw model: its adapter's, if one registered for its model type."""
    if isinstance(model, Target):
        return model
    if not isinstance(model, PreTrainedModel):
        raise MMSpecError(f"the target must be a transformers PreTrainedModel, got {type(model).__name__}")
    model_type = getattr(model.config, "model_type", "")
    if model_type not in TARGET_FACTORIES:
        load_adapters()
    factory = TARGET_FACTORIES.get(model_type, Target)
    return factory(model)
