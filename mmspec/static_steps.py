"""Fixed-shape incremental forwards over a static KV cache, compiled once per width.

A `CachedModel` normally grows a dynamic cache and crops it after every rejected draft. Here the cache is a
transformers `StaticCache`, allocated once for a whole call (prompt + new tokens + one verification), and
every incremental forward feeds one of a few fixed widths: a shorter input is padded at its end, the padded
positions are written to cache slots past the real ones, and the length pointer is moved back over them at
once. Rollback (`truncate`) moves the same pointer: nothing is copied, and the stale slots are overwritten by
the next forward (the causal mask hides every slot past a query's own position). With fixed widths and a
fixed cache size each forward has one shape, so `torch.compile(dynamic=False)` builds one graph per width.

A step with its own 4-D mask and position ids (a draft tree level, `mmspec.static_trees`) is padded the same way,
its mask widened to the whole cache. Prefills (any prompt length) run eagerly into the same cache. So do forwards
this path does not compile: wider than the widest width, with other extra inputs or without the output head.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import torch
from torch._inductor import list_mode_options
from transformers import PreTrainedModel, StaticCache

from . import compat
from .devices import input_device
from .errors import MMSpecError

# Cache sizes are rounded up to this many positions, so calls with nearby lengths share one compiled graph.
CACHE_BUCKET = 128
# Graphs dynamo may keep for one static object (widths x cache sizes).
RECOMPILE_LIMIT = 64


def compile_mode(device: torch.device) -> str:
    """CUDA graphs on a GPU ("reduce-overhead": the step is launch-bound there), inductor's default elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else "default"


def rounded_capacity(positions: int) -> int:
    return -(-positions // CACHE_BUCKET) * CACHE_BUCKET


class StaticSteps:
    """Mixin for `CachedModel` subclasses: static cache, padded fixed-width `extend`, rollback by pointer.

    The compiled forward and the caches are shared by every working copy of the object (a decoding call copies
    its target and drafter, see `mmspec.decode_state`): the cache lives in a `threading.local`, one per thread,
    reused from call to call (a new cache would mean new tensors and a recompiled graph). A call that starts on
    the same thread while another is still running (a re-entrant call from a hook) takes the cache over; the
    first call then stops with an error instead of reading states that are not its own.
    """

    model: PreTrainedModel
    role: str
    cache: Any
    forwards: int
    _cache_argument: str
    _takes_logits_to_keep: bool

    def setup_static(self, widths: tuple[int, ...], max_cache_len: int | None = None, backend: str = "inductor",
                     mode: str | None = None) -> None:
        if not widths or min(widths) < 1:
            raise MMSpecError(f"static widths must be positive, got {widths}")
        config = self.model.config
        if getattr(config, "is_encoder_decoder", False):
            raise MMSpecError(f"compile=True supports decoder-only models; the {self.role} is an encoder-decoder")
        if getattr(self, "sliding_window", None) is not None:
            raise MMSpecError(f"compile=True cannot roll back the {self.role}'s sliding-window cache; leave compile off")
        # The compiled steps call `forward` itself: accelerate's placement hooks would be skipped (other hooks, e.g.
        # forward counters, only miss those steps).
        placement = getattr(self.model, "hf_device_map", None) or {}
        if compat.accelerate_hook(self.model) is not None or len(set(placement.values())) > 1:
            raise MMSpecError(f"compile=True needs the {self.role} on one device, without accelerate's offloading")
        if not self._takes_logits_to_keep:
            raise MMSpecError(f"compile=True needs a {self.role} whose forward takes logits_to_keep")
        self.widths = tuple(sorted(set(widths)))
        # Padded positions must stay inside a learned position table (GPT-2's): past it, steps go unpadded, eagerly.
        self._position_limit = getattr(config.get_text_config(decoder=True), "max_position_embeddings", None)
        self.min_capacity = 0 if max_cache_len is None else int(max_cache_len)
        device = input_device(self.model)
        mode = mode if mode is not None else (compile_mode(device) if backend == "inductor" else None)
        self._copies_outputs = mode == "reduce-overhead"
        self._steps = CompiledSteps(self.model, backend, mode)  # shared by every working copy
        self._local = threading.local()
        self._owner: object = object()
        self._length = 0  # positions held, kept here too: reading the cache's own counter would sync a GPU

    # -- the cache --------------------------------------------------------------------------------------------

    def _thread_cache(self, positions: int) -> StaticCache:
        """This thread's static cache, made (or made larger) to hold at least `positions`; handed to this copy."""
        local = self._local
        cache = getattr(local, "cache", None)
        # A changed model (`CompiledSteps.check_model`) may hold other dtypes or devices: a cache of its own.
        if cache is None or cache.get_max_length() < positions or getattr(local, "signature", None) is not self._steps.signature:
            size = rounded_capacity(max(positions, self.min_capacity))
            cache = StaticCache(config=self.model.config, max_cache_len=size)
            local.cache, local.signature = cache, self._steps.signature
        self._owner = object()
        local.owner = self._owner
        return cache

    def _check_owner(self) -> None:
        if getattr(self._local, "owner", None) is not self._owner:
            raise MMSpecError(f"another compiled call on this thread took over the {self.role}'s static cache "
                              "(a call from inside a hook); compiled calls on one thread must not overlap")

    def _grow(self, positions: int) -> None:
        """Move this call's states into a larger cache (a longer call than any before on this thread)."""
        old = self.cache
        length = self._length
        new = StaticCache(config=self.model.config, max_cache_len=rounded_capacity(positions))
        compat.copy_static_cache(old, new, length)
        self._local.cache = new
        self.cache = new

    @property
    def capacity(self) -> int:
        return 0 if self.cache is None else int(self.cache.get_max_length())

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self._length

    def warm_up(self, token_id: int = 0) -> None:
        """Compile every width now (on a one-token prompt), so the first real call does not pay for it."""
        device = input_device(self.model)
        for width in self.widths:
            self.prefill(cast(torch.LongTensor, torch.full((1, 1), token_id, dtype=torch.long, device=device)))
            self.extend(cast(torch.LongTensor, torch.full((1, width), token_id, dtype=torch.long, device=device)))
        self.cache = None

    # -- CachedModel's interface --------------------------------------------------------------------------------

    def prefill(self, tokens: torch.LongTensor, logits_to_keep: int = 1, head: bool = True, **model_inputs: Any) -> Any:
        if tokens.shape[0] != 1:
            raise MMSpecError("compile=True decodes one sequence at a time; pass a batch of one")
        self._steps.check_model()
        cache = self._thread_cache(tokens.shape[1] + self.widths[-1])
        cache.crop(-int(cache.get_seq_length()))  # back to empty: the prompt overwrites the old states
        self.cache = None
        self.forwards += 1
        out = eager_forward(self.model, head, logits_to_keep,
                            **{"input_ids": tokens, self._cache_argument: cache, **model_inputs})
        self.cache = cache
        self._length = tokens.shape[1]
        return out

    def extend(self, tokens: torch.LongTensor, logits_to_keep: int = 0, head: bool = True, **extra: Any) -> Any:
        if self.cache is None:
            raise RuntimeError(f"{self.role}: extend() called before prefill()")
        self._check_owner()
        count = tokens.shape[1]
        width = next((w for w in self.widths if w >= count), count)
        length = self.length
        if self._position_limit is not None and length + width > self._position_limit:
            width = count
        if length + width > self.capacity:
            self._grow(length + width + self.widths[-1])
        self._length = length + count
        # Hidden states for drafters that read them (feature drafters): the same graph with one more output.
        hidden = extra.pop("output_hidden_states", False) if set(extra) == {"output_hidden_states"} else False
        if set(extra) == {"attention_mask", "position_ids"} and extra["attention_mask"].dim() == 4 and head \
                and tokens.shape[0] == 1:
            return self._masked_step(tokens, extra["attention_mask"], extra["position_ids"], length, width, logits_to_keep)
        if extra or not head or width not in self.widths or tokens.shape[0] != 1:
            if hidden:
                extra["output_hidden_states"] = True
            self.forwards += 1
            return eager_forward(self.model, head, logits_to_keep,
                                 **{"input_ids": tokens, self._cache_argument: self.cache, **extra})
        # A fresh [1, width] tensor (strides are guarded too); padded with copies of the last token, whose states
        # land past the real ones.
        padded = tokens.new_empty((1, width))
        padded[:, :count] = tokens
        padded[:, count:] = tokens[:, -1:]
        self.forwards += 1
        out = self._steps.forward(input_ids=padded, **{self._cache_argument: self.cache}, use_cache=True,
                                  return_dict=True, logits_to_keep=0, **({"output_hidden_states": True} if hidden else {}))
        if width > count:
            self.cache.crop(count - width)
        logits = out.logits[:, :count]
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        states = tuple(h[:, :count] for h in out.hidden_states) if hidden else None
        if self._copies_outputs:  # a CUDA graph reuses its output buffers on the next replay
            logits = logits.clone()
            states = None if states is None else tuple(h.clone() for h in states)
        return StaticOutput(logits=logits, hidden_states=states)

    def _masked_step(self, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, length: int, width: int,
                     logits_to_keep: int) -> StaticOutput:
        """A step with its own additive 4-D mask over the cached positions and the new ones ([1, 1, count, length +
        count]: a draft tree level's) and position ids: both padded to the fixed width and the whole cache. A padded
        query sees the cached positions and its own slot (its output is dropped); no query sees a padded slot."""
        count = tokens.shape[1]
        if mask.shape[-2:] != (count, length + count):
            raise MMSpecError(f"{self.role}: a masked step needs a mask over {length + count} positions for {count} "
                              f"tokens, got {tuple(mask.shape)}")
        compiled = width in self.widths
        width = width if compiled else count
        full = mask.new_full((1, 1, width, self.capacity), torch.finfo(mask.dtype).min)
        full[:, :, :count, :length + count] = mask.reshape(1, 1, count, length + count)
        pads = torch.arange(count, width, device=mask.device)
        full[0, 0, pads, :length] = 0
        full[0, 0, pads, length + pads] = 0
        padded, placed = tokens.new_empty((1, width)), positions.new_empty((1, width))
        padded[:, :count], padded[:, count:] = tokens, tokens[:, -1:]
        placed[:, :count], placed[:, count:] = positions, positions[:, -1:]
        inputs = {"input_ids": padded, self._cache_argument: self.cache, "attention_mask": full, "position_ids": placed}
        logits, _ = self._padded_forward(inputs, compiled, count, width)
        return StaticOutput(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)

    def _padded_forward(self, inputs: dict[str, Any], compiled: bool, count: int, width: int, hidden: bool = False
                        ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """One forward of `width` padded positions (compiled, or eager where no graph has that width); the padding's
        cache entries are dropped and its outputs cut off: logits and (with `hidden`) hidden states of `count`."""
        self.forwards += 1
        if compiled:
            out = self._steps.forward(**inputs, use_cache=True, return_dict=True, logits_to_keep=0)
        else:
            out = eager_forward(self.model, True, 0, **inputs)
        if width > count:
            self.cache.crop(count - width)
        logits = out.logits[:, :count]
        states = tuple(h[:, :count] for h in out.hidden_states) if hidden else None
        if self._copies_outputs:  # a CUDA graph reuses its output buffers on the next replay
            logits = logits.clone()
            states = None if states is None else tuple(h.clone() for h in states)
        return logits, states

    def keep_positions(self, start: int, slots: torch.LongTensor) -> None:
        """Move the states at `slots` to the positions from `start` on and set the length to their end (a draft tree's
        accepted path); the slots after it hold stale states, overwritten later."""
        self._check_owner()
        compat.move_static_cache_positions(self.cache, slots, start)
        length = start + slots.numel()
        excess = self.length - length
        if excess < 0:
            raise RuntimeError(f"{self.role}: cannot keep {slots.numel()} positions after {start} in a cache of {self.length}")
        self._length = length
        if excess:
            self.cache.crop(-excess)

    def truncate(self, length: int) -> None:
        self._check_owner()
        excess = self.length - length
        if excess < 0:
            raise RuntimeError(f"{self.role}: cannot truncate a cache of {self.length} positions to {length}")
        self._length = length
        if excess:
            self.cache.crop(-excess)  # moves the length pointer back; the stale slots are overwritten later


class CompiledSteps:
    """The model's forward compiled for fixed-shape steps, with dynamo's per-step guards cut to the step's inputs.

    Before every step dynamo checks its guards: each tensor input's and the cache's (shape, dtype, device) and, by
    default, every module, weight and attribute of the model (about 2,300 checks on the 8-layer text target). Right
    after a large forward has evicted those objects from the CPU caches, checking them cost more than a small
    drafter step gained from compiling. Here the guards on the model are dropped (`guard_filter_fn`) and replaced
    by one check per decoding call (`check_model`): the modules, their weights' layouts, dtypes and devices, and
    the training flag, as a signature; when it changed, the forward is compiled afresh. Weight values may change
    freely: the graph reads them at every step.
    """

    shared_by_calls = True  # one set of graphs for every call's working copy (`mmspec.decode_state`)

    def __init__(self, model: torch.nn.Module, backend: str, mode: str | None,
                 function: Callable[..., Any] | None = None) -> None:
        """`function` is what to compile (default: `model.forward`); `model` the module whose signature it assumes
        (an adapter may compile a step of its own around a part of a model, e.g. a decoder)."""
        self.model, self.backend, self.mode = model, backend, mode
        self.function = model.forward if function is None else function
        self.signature = model_signature(model)
        self.forward = self._compile()

    def _compile(self) -> Any:
        # Models of one class share their forward's code, where dynamo keeps its graphs: isolated, this model's graphs
        # count against their own limit. `mode` goes in as its inductor options: torch.compile takes a mode or
        # options, and the guard filter is an option.
        settings: dict[str, Any] = {}
        if self.backend == "inductor":
            # The generated code would check every weight's size and strides at each step (30 checks on the
            # text drafter): the model check covers them once a call, the kept guards cover the inputs.
            settings = {**list_mode_options(self.mode or "default"), "size_asserts": False}
        arguments: dict[str, Any] = {"recompile_limit": RECOMPILE_LIMIT, "isolate_recompiles": True}  # untyped in torch
        return torch.compile(self.function, backend=self.backend, dynamic=False,
                             options={**settings, "guard_filter_fn": step_guards}, **arguments)

    def check_model(self) -> None:
        """Compile afresh when the model changed since its steps were compiled (a `.to(dtype)`, a swapped layer)."""
        signature = model_signature(self.model)
        if signature != self.signature:
            self.signature = signature
            self.forward = self._compile()


def model_signature(model: torch.nn.Module) -> tuple[Any, ...]:
    """What a compiled step assumes about `model`: its modules' names, types and modes, and its tensors' names,
    shapes, strides, dtypes and devices."""
    modules = tuple((name, type(module), module.training) for name, module in model.named_modules())
    tensors = tuple((name, tensor.shape, tensor.stride(), tensor.dtype, tensor.device)
                    for name, tensor in (*model.named_parameters(), *model.named_buffers()))
    return modules, tensors


def step_guards(entries: Any) -> list[bool]:
    """The `guard_filter_fn` of the compiled steps: keep every guard but those on the model (see `CompiledSteps`)."""
    return list(torch.compiler.skip_guard_on_all_nn_modules_unsafe(entries))


def eager_forward(model: Any, head: bool, logits_to_keep: int, **kwargs: Any) -> Any:
    """One eager forward over a static cache: the whole model, or its base model alone when the caller applies
    the head itself."""
    if not head:
        return model.base_model(use_cache=True, return_dict=True, **kwargs)
    return model(use_cache=True, return_dict=True, logits_to_keep=logits_to_keep, **kwargs)


class StaticOutput:
    """What a compiled step returns: the kept logits, and hidden states when asked (the cache was updated in place)."""

    def __init__(self, logits: torch.Tensor, hidden_states: tuple[torch.Tensor, ...] | None = None) -> None:
        self.logits = logits
        self.hidden_states = hidden_states
