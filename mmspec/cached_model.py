"""A Hugging Face LM plus its KV cache, fed a few tokens at a time and rolled back by cropping.

Serves targets and model drafters alike, for decoder-only and encoder-decoder models.
Rollback uses the cache's own `crop` (transformers 5.x: a negative count removes tokens);
nothing in transformers is patched.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from .compat import keep_cache_positions
from .devices import input_device
from .errors import MMSpecError
from .kernels.lean_llama import LeanCausalLM, has_hooks

if TYPE_CHECKING:
    from .ragged import RaggedBatch


def sliding_window_of(model: PreTrainedModel) -> int | None:
    """The attention window of a model with sliding-window layers, None when all layers see everything."""
    config = model.config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def model_vocab_size(model: PreTrainedModel) -> int:
    """Width of the model's logits (the LM head), which is what acceptance compares."""
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def cache_argument(model: torch.nn.Module) -> str:
    """The name `model.forward` takes its KV cache by: transformers renamed `past_key_values` to `cache` (5.24)."""
    forward = model.forward
    return _cache_argument_of(getattr(forward, "__func__", forward))


@functools.lru_cache(maxsize=256)
def _cache_argument_of(forward: Any) -> str:
    # Read once per forward function: drafters ask on every call, and inspect.signature is slow.
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def with_cache(output_class: type, cache: Any, **fields: Any) -> Any:
    """A transformers `ModelOutput` holding `cache` under the field name this transformers uses (`cache` since
    5.24, `past_key_values` before), so neither version warns."""
    name = "cache" if "cache" in {f.name for f in dataclasses.fields(output_class)} else "past_key_values"
    return output_class(**fields, **{name: cache})


def output_cache(out: Any) -> Any:
    """The KV cache a forward returned: `out.cache` since transformers 5.24 (`past_key_values`, which
    still works there with a deprecation warning, before)."""
    for name in ("cache", "past_key_values"):
        if name in out.keys():
            return out[name] if name == "cache" else dict.__getitem__(out, name)
    return None


@dataclass
class LeanOutput:
    """What `CachedModel.extend` returns from a lean forward (the cache was updated in place): the logits, or with
    `head=False` the base model's last hidden state."""

    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None


class CachedModel:
    """Runs `model` incrementally over a growing token sequence, keeping its KV cache.

    With `lean=True` (drafters: many small steps whose outputs the target verifies) a plain Llama takes its
    incremental steps through `LeanCausalLM`, the same maths without transformers' per-call machinery;
    prefills, batches and every other model go through the model's own forward.
    """

    def __init__(self, model: PreTrainedModel, role: str = "model", lean: bool = False) -> None:
        if not isinstance(model, PreTrainedModel):
            raise MMSpecError(f"the {role} must be a transformers PreTrainedModel, got {type(model).__name__}")
        self.model = model.eval()
        self.role = role
        self.is_encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        accepted = inspect.signature(model.forward).parameters
        self._takes_logits_to_keep = "logits_to_keep" in accepted
        self._cache_argument = cache_argument(model)
        self.vocab_size = model_vocab_size(model)
        self.sliding_window = sliding_window_of(model)
        self.cache: Any = None
        self._encoder_kwargs: dict[str, Any] = {}
        self.forwards = 0
        self._lean = LeanCausalLM(model) if lean and LeanCausalLM.supports(model) else None

    @property
    def length(self) -> int:
        """Number of positions held in the (decoder) cache."""
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    def prefill(self, tokens: torch.LongTensor, logits_to_keep: int = 1, head: bool = True, **model_inputs: Any) -> Any:
        """Start afresh: run the prompt (and, for encoder-decoders, the encoder once). `head=False` runs the
        base model only: the output holds `last_hidden_state` instead of logits."""
        self.cache = None
        self._encoder_kwargs = {}
        if self.is_encoder_decoder:
            out = self._forward(decoder_input_ids=tokens, logits_to_keep=logits_to_keep, head=head, **model_inputs)
            # Keep the encoder result and its mask so decoding steps never re-encode.
            self._encoder_kwargs["encoder_outputs"] = BaseModelOutput(last_hidden_state=out.encoder_last_hidden_state)
            if model_inputs.get("attention_mask") is not None:
                self._encoder_kwargs["attention_mask"] = model_inputs["attention_mask"]
        else:
            out = self._forward(input_ids=tokens, logits_to_keep=logits_to_keep, head=head, **model_inputs)
        cache = output_cache(out)
        if cache is None:
            raise MMSpecError(
                f"the {self.role} ({type(self.model).__name__}) returned no KV cache; speculative decoding "
                "needs a model that supports `use_cache=True`"
            )
        self.cache = cache
        if hasattr(self.cache, "is_croppable") and not self.cache.is_croppable:
            raise MMSpecError(f"the {self.role}'s cache cannot be rolled back (recurrent state); it cannot be used here")
        # Sliding-window layers drop states beyond the window as they go; recording keeps them until
        # the next crop so rejected drafts can be rolled back (as transformers' assisted decoding does,
        # and, as there, only after the prefill, which never needs rolling back).
        if hasattr(self.cache, "activate_past_recording"):
            self.cache.activate_past_recording()
        return out

    def extend(self, tokens: torch.LongTensor, logits_to_keep: int = 0, head: bool = True, **extra: Any) -> Any:
        """Feed `tokens` [B, m] on top of the cache; returns the model output (`head=False`: the base model's)."""
        if self.cache is None:
            raise RuntimeError(f"{self.role}: extend() called before prefill()")
        if self._lean is not None and self._lean_covers(extra) and not has_hooks(self.model):
            self.forwards += 1
            if not head:
                return LeanOutput(last_hidden_state=self._lean.hidden_states(tokens, self.cache, **extra))
            return LeanOutput(logits=self._lean.forward(tokens, self.cache, logits_to_keep, **extra))
        key = "decoder_input_ids" if self.is_encoder_decoder else "input_ids"
        return self._forward(**{key: tokens, self._cache_argument: self.cache}, logits_to_keep=logits_to_keep, head=head,
                             **self._encoder_kwargs, **extra)

    @staticmethod
    def _lean_covers(extra: dict[str, Any]) -> bool:
        """Whether a lean forward takes these inputs: explicit positions and a 4-D additive mask (a draft tree's)."""
        mask = extra.get("attention_mask")
        return set(extra) <= {"attention_mask", "position_ids"} and (
            mask is None or (mask.dim() == 4 and mask.is_floating_point()))

    def truncate(self, length: int) -> None:
        """Roll the cache back so it holds the first `length` positions."""
        excess = self.length - length
        if excess < 0:
            raise RuntimeError(f"{self.role}: cannot truncate a cache of {self.length} positions to {length}")
        # crop(0) is not a no-op for sliding-window layers: it trims them back to the window.
        self.cache.crop(-excess)

    def keep_positions(self, start: int, slots: torch.LongTensor) -> None:
        """Keep the cache's first `start` positions and after them the positions `slots` (ascending, each >= `start`):
        a draft tree's accepted path, the rest of the tree dropped."""
        keep_cache_positions(self.cache, torch.cat([torch.arange(start, device=slots.device), slots]))

    def feed_columns(self, batch: "RaggedBatch", start: int, new_tokens: torch.LongTensor, logits_to_keep: int = 1,
                     **extra: Any) -> Any:
        """Batch decoding (`mmspec.ragged`): run the columns of `batch` from `start` on plus `new_tokens` [B, m],
        with the batch's attention mask (holes and left pads masked) and per-row position ids.
        `start` is 0 for a prefill, else the number of columns the cache holds."""
        inputs = batch.feed(start, new_tokens)
        tokens = inputs.pop("tokens")
        inputs["position_ids"] = self.batch_position_ids(inputs["position_ids"], batch, prefill=start == 0, model_inputs=extra)
        if self.is_encoder_decoder:
            inputs = {"decoder_attention_mask": inputs["attention_mask"], "decoder_position_ids": inputs["position_ids"]}
        if start == 0:
            return self.prefill(tokens, logits_to_keep=logits_to_keep, **inputs, **extra)
        if start != self.length:
            raise RuntimeError(f"{self.role}: the cache holds {self.length} columns, not {start}")
        return self.extend(tokens, logits_to_keep=logits_to_keep, **inputs, **extra)

    def batch_position_ids(self, positions: torch.LongTensor, batch: "RaggedBatch", prefill: bool,
                           model_inputs: dict[str, Any]) -> torch.LongTensor:
        """Position ids of a batch forward from each row's token positions [B, m] (models with another
        position scheme, e.g. Qwen2-VL's 3-D M-RoPE, override this)."""
        return positions

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only batch rows `keep` in the cache (and the encoder's states): finished rows stop costing work."""
        self.cache.batch_select_indices(keep.to(input_device(self.model)))  # not model.device: "meta" when offloaded
        for name, value in list(self._encoder_kwargs.items()):
            if isinstance(value, torch.Tensor):
                self._encoder_kwargs[name] = value.index_select(0, keep.to(value.device))
            elif isinstance(value, BaseModelOutput):
                states = value.last_hidden_state
                self._encoder_kwargs[name] = BaseModelOutput(last_hidden_state=states.index_select(0, keep.to(states.device)))

    def _forward(self, logits_to_keep: int, head: bool = True, **kwargs: Any) -> Any:
        self.forwards += 1
        if not head:  # the model without its output head (`base_model`: e.g. WhisperModel, LlamaModel)
            return self.model.base_model(use_cache=True, return_dict=True, **kwargs)
        if self._takes_logits_to_keep:
            kwargs["logits_to_keep"] = logits_to_keep
        return self.model(use_cache=True, return_dict=True, **kwargs)
