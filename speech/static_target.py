"""Whisper's decoder on the static-shape path (`compile=True`): static caches, fixed-width compiled decoder steps.

The self-attention cache is a transformers `StaticCache` sized in buckets of `CACHE_BUCKET` positions, the
cross-attention cache a `StaticCache` of exactly the encoder's frames (filled once per utterance by the eager
prefill, or from a self-drafter's projections), both inside one `EncoderDecoderCache` per thread that every call
reuses (new tensors would recompile the graph). Every incremental decoder forward feeds one of a few fixed widths:
a shorter input is padded with copies of its last token, whose states land past the real ones and are dropped by
moving the length pointer back; a longer one (a hybrid drafter's whole hypothesis) is verified in chunks of the
widest width. Rollback moves the same pointer. So each width compiles to one graph of the decoder body; the
output head runs after it, outside the graph, so greedy verification keeps its certified head on a CPU.

Prefills (any prompt length, with the drafts that ride along) run eagerly into the same caches, and so do steps
this path does not compile (extra inputs, batches, positions past the decoder's learned table).

The step is compiled as the core's static steps are (`mmspec.static_steps.CompiledSteps`): dynamo guards its
inputs, the caches and the global state, not the decoder's modules; the decoder is checked once per utterance
(at the prefill) and compiled afresh when its modules, dtypes or shapes changed.
"""

from __future__ import annotations

import copy
import threading
import weakref
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import EncoderDecoderCache, PreTrainedModel, StaticCache
from transformers.modeling_outputs import BaseModelOutput

from .. import compat
from ..cached_model import cache_argument
from ..devices import input_device
from ..errors import MMSpecError
from ..static_steps import CompiledSteps, compile_mode, eager_forward, rounded_capacity
from ..targets import Target
from .precision import ROW_ATTENTION, compute_type_of, has_compute_type_layers
from .target import WhisperTarget

# The widths (tokens per decoder forward) a chain's verification is padded to, and the widest one, in chunks of
# which longer verifications run. Each width is one compiled graph (compile time), and on a CPU a forward costs
# about its width in arithmetic past a few tokens: a few widths keep the padding small without compiling for every
# length, and two 32-wide chunks cost less than four 16-wide ones.
CHUNK_WIDTH = 32
SMALL_WIDTHS = (1, 4, 16)


def whisper_widths(widths: tuple[int, ...]) -> tuple[int, ...]:
    """The decoder widths for verifications up to max(widths) tokens: plain decoding steps one token wide; longer
    chains pad to the next of `SMALL_WIDTHS` and `CHUNK_WIDTH`, and run in chunks past it."""
    widest = max(widths)
    chunk = min(widest, CHUNK_WIDTH)
    return tuple(sorted({w for w in SMALL_WIDTHS if w < chunk} | {chunk}))


class StaticEncoderDecoderCache(EncoderDecoderCache):
    """An `EncoderDecoderCache` of two static caches whose `crop` moves the self-attention length pointer back
    (transformers' own `crop` serves dynamic caches only); the cross-attention states stay."""

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            self.self_attention_cache.crop(tokens_to_remove)


@dataclass
class DecoderOutput:
    """What a compiled step returns: the decoder's last hidden state [1, n, D] and, with the head, the logits."""

    last_hidden_state: torch.Tensor
    logits: torch.Tensor | None = None
    decoder_hidden_states: tuple[torch.Tensor, ...] | None = None


class StaticWhisperDecoder:
    """One model's compiled decoder step (one graph per width) and its per-thread static caches, shared by every
    static target of it, whatever widths each pads to, and by every call's working copy of those targets."""

    shared_by_calls = True  # one set of graphs and one decoder check for every call (`mmspec.decode_state`)

    def __init__(self, model: PreTrainedModel, backend: str = "inductor", mode: str | None = None) -> None:
        # The decoder only, not the model: this object is the value of a weak-keyed table under the model, which
        # a reference back to the model would keep alive for good.
        self.decoder = model.get_decoder()
        self.position_limit = getattr(model.config, "max_target_positions", None)
        config = copy.deepcopy(model.config)
        config.num_hidden_layers = config.decoder_layers  # Whisper's num_hidden_layers counts the encoder's
        self.cache_config = config
        device = input_device(model)
        mode = mode if mode is not None else (compile_mode(device) if backend == "inductor" else None)
        self.copies_outputs = mode == "reduce-overhead"  # a CUDA graph reuses its output buffers on the next replay
        self.cache_name = cache_argument(self.decoder)
        # The decoder's own forward, not its __call__: hooks on the decoder (forward counters) are not traced into
        # the graph, where one registered later would be ignored or recompile it.
        self.steps = CompiledSteps(self.decoder, backend, mode, function=self.decoder_forward)
        self.local = threading.local()

    def check_decoder(self) -> None:
        """Compile afresh when the decoder changed since its steps were compiled (a `.to(dtype)`, a swapped layer)."""
        self.steps.check_model()

    def decoder_forward(self, input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self.decoder.forward(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states, use_cache=True,
                                   return_dict=True, **{self.cache_name: cache})
        return out.last_hidden_state

    def thread_cache(self, positions: int, frames: int) -> StaticEncoderDecoderCache:
        """This thread's caches, made (or made larger) to hold `positions` decoder positions, and `frames` encoder
        frames. A larger self-attention cache starts empty (see `StaticWhisperTarget._grow`); the cross-attention
        one is kept while the frames match."""
        cache = getattr(self.local, "cache", None)
        if cache is not None and getattr(self.local, "signature", None) is not self.steps.signature:
            cache = None  # a changed decoder may hold other dtypes or devices: caches of its own
        self.local.signature = self.steps.signature
        self_attention = None if cache is None else cache.self_attention_cache
        cross = None if cache is None else cache.cross_attention_cache
        fresh = False
        if self_attention is None or self_attention.get_max_length() < positions:
            self_attention = StaticCache(config=self.cache_config, max_cache_len=rounded_capacity(positions))
            fresh = True
        if cross is None or cross.get_max_length() != frames:
            cross = StaticCache(config=self.cache_config, max_cache_len=frames)
            fresh = True
        if fresh:
            updated = {} if cache is None or cross is not cache.cross_attention_cache else compat.cross_attention_flags(cache)
            cache = StaticEncoderDecoderCache(self_attention, cross)
            compat.set_cross_attention_flags(cache, updated)
            self.local.cache = cache
        return cache


_DECODERS: weakref.WeakKeyDictionary[PreTrainedModel, dict[tuple, StaticWhisperDecoder]] = weakref.WeakKeyDictionary()


def static_decoder_for(model: PreTrainedModel, backend: str = "inductor", mode: str | None = None) -> StaticWhisperDecoder:
    """The shared compiled decoder of `model` (calls reuse its graphs and caches)."""
    made = _DECODERS.setdefault(model, {})
    if (backend, mode) not in made:
        made[backend, mode] = StaticWhisperDecoder(model, backend, mode)
    return made[backend, mode]


class StaticWhisperTarget(WhisperTarget):
    """A `WhisperTarget` whose decoder steps run compiled over static caches (chains of one utterance).

    Args: those of `WhisperTarget`, and `widths` (decoder widths to compile, see `whisper_widths`), `backend` and
    `mode` (as `torch.compile` takes them; default inductor, CUDA graphs on a GPU).
    """

    decodes_batches = False
    static_shapes = True

    def __init__(self, model: PreTrainedModel, language: str | None = None, task: str | None = None,
                 output_hidden_states: bool = False, logits_processors: Any = (),
                 widths: tuple[int, ...] = (*SMALL_WIDTHS, CHUNK_WIDTH), backend: str = "inductor", mode: str | None = None) -> None:
        super().__init__(model, language=language, task=task, output_hidden_states=output_hidden_states,
                         logits_processors=logits_processors)
        refuse_unsupported(model)
        if not widths or min(widths) < 1:
            raise MMSpecError(f"static widths must be positive, got {widths}")
        self.engine = static_decoder_for(model, backend, mode)
        self.widths = tuple(sorted(set(widths)))
        self.compiled_forwards = 0  # decoder forwards the decoder's own hooks do not see (see `StaticWhisperDecoder`)
        self._length = 0
        self._owner: object = object()

    @classmethod
    def like(cls, target: Target, widths: tuple[int, ...], backend: str = "inductor",
             mode: str | None = None) -> "StaticWhisperTarget":
        """The static twin of a `WhisperTarget` (its language, task and processors)."""
        if isinstance(target, StaticWhisperTarget):
            return target
        if type(target) is not WhisperTarget:
            raise MMSpecError(f"compile=True cannot carry {type(target).__name__}'s own behaviour over; pass the model "
                              "or a WhisperTarget")
        whisper = cast(WhisperTarget, target)
        return cls(whisper.model, language=whisper.language, task=whisper.task,
                   output_hidden_states=whisper.output_hidden_states, logits_processors=whisper.extra_processors,
                   widths=whisper_widths(widths), backend=backend, mode=mode)

    def check_tree_support(self) -> None:
        raise MMSpecError("compile=True verifies chains; draft trees run eagerly (leave compile off)")

    # -- the caches ----------------------------------------------------------------------------------------------

    def _claim(self, positions: int, frames: int) -> StaticEncoderDecoderCache:
        cache = self.engine.thread_cache(positions, frames)
        self._owner = object()
        self.engine.local.owner = self._owner
        return cache

    def _check_owner(self) -> None:
        if getattr(self.engine.local, "owner", None) is not self._owner:
            raise MMSpecError("another compiled call on this thread took over the Whisper decoder's static cache "
                              "(a call from inside a hook); compiled calls on one thread must not overlap")

    def _cache_holding(self, keys_values: list[tuple[torch.Tensor, torch.Tensor]]) -> EncoderDecoderCache:
        """A self-drafter's cross-attention keys/values, written into this thread's static cross cache."""
        self.engine.check_decoder()
        cache = self._claim(self.widths[-1] + 1, keys_values[0][0].shape[2])
        compat.reset_static_cache(cache.self_attention_cache)
        compat.write_static_cache(cache.cross_attention_cache, keys_values)
        compat.mark_cross_attention_filled(cache, len(keys_values))
        return cache

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self._length

    @property
    def capacity(self) -> int:
        return 0 if self.cache is None else int(self.cache.get_max_length())

    def _grow(self, positions: int) -> None:
        """Move this call's states into a larger self-attention cache (a longer call than any before)."""
        old = self.cache.self_attention_cache
        self.cache = self.engine.thread_cache(positions, self.cache.cross_attention_cache.get_max_length())
        compat.copy_static_cache(old, self.cache.self_attention_cache, self._length)

    # -- CachedModel's interface -----------------------------------------------------------------------------------

    def prefill(self, tokens: torch.LongTensor, logits_to_keep: int = 1, head: bool = True, **model_inputs: Any) -> Any:
        if tokens.shape[0] != 1:
            raise MMSpecError("compile=True transcribes one recording at a time; pass a batch of one")
        outputs = model_inputs.get("encoder_outputs")
        if outputs is None:
            raise MMSpecError("the static Whisper target needs encoder_outputs (run through WhisperTarget's start)")
        if not isinstance(outputs, BaseModelOutput):
            outputs = model_inputs["encoder_outputs"] = BaseModelOutput(last_hidden_state=outputs[0])
        frames = outputs.last_hidden_state.shape[1]
        name = self._cache_argument
        given = model_inputs.get(name)
        if given is None or given is not getattr(self.engine.local, "cache", None):
            self.engine.check_decoder()
            cache = self._claim(tokens.shape[1] + self.widths[-1], frames)
            compat.forget_cross_attention(cache)  # the prefill projects the encoder states
            compat.reset_static_cache(cache.cross_attention_cache)
            compat.reset_static_cache(cache.self_attention_cache)
            model_inputs[name] = cache
        else:  # `_cache_holding`'s: cross-attention filled; made large enough for the prompt here
            cache = given
            if cache.get_max_length() < tokens.shape[1] + self.widths[-1]:
                self.cache, self._length = cache, 0
                self._grow(tokens.shape[1] + self.widths[-1])
                cache = model_inputs[name] = self.cache
        self.cache = None
        self._encoder_kwargs = {"encoder_outputs": outputs}
        if model_inputs.get("attention_mask") is not None:
            self._encoder_kwargs["attention_mask"] = model_inputs["attention_mask"]
        self.forwards += 1
        out = eager_forward(self.model, head, logits_to_keep, **{"decoder_input_ids": tokens, **model_inputs})
        self.cache = cache
        self._length = tokens.shape[1]
        return out

    def extend(self, tokens: torch.LongTensor, logits_to_keep: int = 0, head: bool = True, **extra: Any) -> Any:
        if self.cache is None:
            raise RuntimeError(f"{self.role}: extend() called before prefill()")
        self._check_owner()
        if extra or tokens.shape[0] != 1 or set(self._encoder_kwargs) != {"encoder_outputs"}:
            return self._eager(tokens, logits_to_keep, head, **extra)
        states = self._encoder_kwargs["encoder_outputs"].last_hidden_state
        pieces = [self._fixed_step(tokens[:, start:start + self.widths[-1]], states)
                  for start in range(0, tokens.shape[1], self.widths[-1])]
        hidden = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
        if not head:
            return DecoderOutput(last_hidden_state=hidden)
        kept = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        return DecoderOutput(last_hidden_state=hidden, logits=self.model.get_output_embeddings()(kept))

    def _fixed_step(self, tokens: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """The decoder's last hidden state [1, n, D] of n <= widest-width tokens, from one padded compiled forward."""
        count = tokens.shape[1]
        width = next(w for w in self.widths if w >= count)
        length = self._length
        if self.engine.position_limit is not None and length + width > self.engine.position_limit:
            # Padded positions past the learned position table: this step goes unpadded, eagerly.
            self.forwards += 1
            self._length = length + count
            return self.engine.decoder(input_ids=tokens, encoder_hidden_states=states, use_cache=True, return_dict=True,
                                       **{self.engine.cache_name: self.cache}).last_hidden_state
        if length + width > self.capacity:
            self._grow(length + width + self.widths[-1])
        padded = tokens.new_empty((1, width))
        padded[:, :count] = tokens
        padded[:, count:] = tokens[:, -1:]
        self.forwards += 1
        self.compiled_forwards += 1
        hidden = self.engine.steps.forward(padded, states, self.cache)
        if width > count:
            self.cache.crop(count - width)  # the padding's states: the pointer moves back over them
        self._length = length + count
        hidden = hidden[:, :count]
        return hidden.clone() if self.engine.copies_outputs else hidden

    def _eager(self, tokens: torch.LongTensor, logits_to_keep: int, head: bool, **extra: Any) -> Any:
        self.forwards += 1
        self._length += tokens.shape[1]
        return eager_forward(self.model, head, logits_to_keep, **{"decoder_input_ids": tokens, self._cache_argument: self.cache,
                                                                  **self._encoder_kwargs, **extra})

    def truncate(self, length: int) -> None:
        self._check_owner()
        super().truncate(length)  # the cache's crop moves the self-attention pointer back
        self._length = length

    def warm_up(self) -> None:
        """Compile every width now (on the start token and silent encoder states), so the first call does not."""
        config = self.model.config
        frames = int(config.max_source_positions)
        states = torch.zeros((1, frames, int(config.d_model)), dtype=self.model.dtype, device=input_device(self.model))
        start = torch.full((1, 1), int(config.decoder_start_token_id), dtype=torch.long, device=states.device)
        for width in self.widths:
            self.prefill(cast(torch.LongTensor, start), encoder_outputs=BaseModelOutput(last_hidden_state=states))
            self.extend(cast(torch.LongTensor, start.expand(1, width).clone()), head=False)
        self.cache = None


def refuse_unsupported(model: PreTrainedModel) -> None:
    """One line for what the static Whisper path does not do."""
    from ..compat import accelerate_hook

    placement = getattr(model, "hf_device_map", None) or {}
    if accelerate_hook(model) is not None or len(set(placement.values())) > 1:
        raise MMSpecError("compile=True needs the Whisper model on one device, without accelerate's offloading")
    if not hasattr(model, "get_decoder") or getattr(model.config, "max_source_positions", None) is None:
        raise MMSpecError(f"compile=True serves Whisper models; got {type(model).__name__}")
    if has_compute_type_layers(model) or getattr(model.config, "_attn_implementation", None) == ROW_ATTENTION:
        # Their row-by-row layers and attention read a cache as long as the tokens so far, not a static one.
        raise MMSpecError(f"compile=True runs Whisper at float32 or a plain dtype, not at compute type "
                          f"{compute_type_of(model)}; leave compile off")


def static_whisper_target(target: Target, widths: tuple[int, ...], backend: str = "inductor") -> Target:
    """The factory `compile=True` finds for model type "whisper" (see `mmspec.static_target`)."""
    if not isinstance(target, WhisperTarget):
        target = WhisperTarget(target.model)
    return StaticWhisperTarget.like(target, widths, backend)

