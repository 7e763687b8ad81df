"""The pipeline base every mmspec pipeline stands on: diffusers' `DiffusionPipeline`, speculatively.

    SpeculativePipeline(DiffusionPipeline)      components, save/load, .to(), progress, generators, methods
        CaptionPipeline        (mmspec.vision)  -> CaptionOutput(TextPipelineOutput)
        TranscriptionPipeline  (mmspec.speech)  -> TranscriptionOutput(TextPipelineOutput)
        (image pipelines)                       -> ImagePipelineOutput (`.images`)

What the base gives a subclass:

- Components. transformers models and processors register as components (as text encoders and
  tokenizers do in diffusers: `self.register_modules(model=..., processor=..., drafter=...)`), so
  `save_pretrained(folder)` writes `model_index.json` and one subfolder per component, and
  `from_pretrained(folder)` reads them back. Plain settings (`num_draft_tokens`, the model card, ...)
  go to `model_index.json` through `register_to_config`. Drafters that are not components (a
  subclass lists them in `extra_modules()`) move with `.to()` and are saved to `<folder>/<name>/`,
  where the subclass's loader finds them again.
- Loading. Each subclass's `from_pretrained` takes zoo names, model folders and Hub ids as before;
  for a folder holding `model_index.json` (a saved pipeline) it hands over to
  `SpeculativePipeline._from_saved`, i.e. diffusers' loader. `dtype=` and `torch_dtype=` are the
  same argument. `SpeculativePipeline.from_pretrained(saved_folder)` returns the class it was saved as.
- `.to(device or dtype)`, `.device`, `.dtype` (those of the target model, the `model` component),
  `progress_bar(total=...)` and `set_progress_bar_config(...)` from diffusers.
- Methods: `drafter_factories()` (method name -> drafter factory, None while the method's drafter is
  not loaded) is the one registry `methods`, `available_methods`, `default_method` and
  `make_drafter(method)` read; `draft_length(method)` picks k (the caller's, else the model card's,
  else the class default).
- Randomness: `generator_for(generator, seed)`; a CPU `torch.Generator` works with a model on any
  device (draws happen on the generator's device, as diffusers' `randn_tensor`).
- A per-round callback: `callback_on_round(round_index, RoundInfo)` after every target forward that
  commits tokens (fed by the core loop's `on_round` hook).

Outputs are diffusers `BaseOutput`s: `out.text`, `out["text"]` and `out[0]` (the main result comes first).

This module is core: it imports no adapter, and `import mmspec` does not import it (nor diffusers).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import torch
from diffusers import DiffusionPipeline
from diffusers.pipelines.pipeline_utils import ImagePipelineOutput as DiffusersImagePipelineOutput
from diffusers.utils import BaseOutput
from tqdm.auto import tqdm

from .compat import progress_bar_settings
from .devices import input_device, is_spread
from .drafters import Drafter
from .errors import MMSpecError, first_line
from .policies import DraftLengthPolicy, FixedDraftLength, make_policy
from .sampling import seeded_generator
from .stats import SpecStats

MODEL_INDEX = "model_index.json"

DrafterFactory = Callable[[], Drafter]
RoundCallback = Callable[[int, "RoundInfo"], Any]


# --- outputs ------------------------------------------------------------------------------------


def first_process() -> bool:
    """Whether this is the process that shows progress (rank 0, or not distributed), as diffusers decides."""
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized() and dist.get_rank() != 0)


class SpeculativePipelineOutput(BaseOutput):
    """What every mmspec pipeline returns: a diffusers `BaseOutput` carrying the method that ran (`method`)
    and how it went (`stats`, a `SpecStats`).

    Concrete outputs are dataclasses that put their main result first (`text`, `images`), so `out[0]`
    is that result, as in diffusers; `out["stats"]` and `out.stats` are the same object. Fields that
    are None are left out of the mapping (diffusers' convention) but stay readable as attributes.
    """

    method: str
    stats: SpecStats


@dataclass
class TextPipelineOutput(SpeculativePipelineOutput):
    """Text out (captions, transcripts).

    Args:
        text: the generated text.
        method: the method that produced it.
        model: the model's name as it was loaded.
        stats: the decoding statistics (tau, alpha, forwards, times).
    """

    text: str
    method: str
    model: str
    stats: SpecStats


@dataclass
class ImagePipelineOutput(DiffusersImagePipelineOutput, SpeculativePipelineOutput):
    """Images out: diffusers' `ImagePipelineOutput` (`images` first) plus `method`, `model` and `stats`."""

    method: str
    model: str
    stats: SpecStats


@dataclass(frozen=True)
class RoundInfo:
    """What one target forward committed, as `callback_on_round(round_index, info)` receives it.

    Args:
        tokens: the token ids committed this round (accepted drafts, then the target's own token);
            the first round of a decode is the prefill's first token unless drafts rode along with it.
        drafted: draft tokens proposed this round (0 for the prefill's token).
        accepted: how many of them the target accepted.
        proposed: the draft token ids the drafter proposed this round, before verification (empty for
            the prefill's token): `proposed[:accepted]` are kept (they begin `tokens`), and where a round
            rejects, `proposed[accepted]` is the draft the target replaced by `tokens[accepted]`. For image
            methods these are the drafted image tokens (the Jacobi iterate, or the small model's).
        new_tokens: tokens committed so far in this call (all chunks).
        chunk: which chunk of the input is being decoded (pipelines that cut their input, e.g. long
            audio; the image pipelines: which image of the call), else None.
        position: where the round's first token goes in its chunk's output (the tokens committed
            before it in this chunk); for an image, its raster index in the token grid.
    """

    tokens: list[int]
    drafted: int
    accepted: int
    new_tokens: int
    chunk: int | None = None
    position: int = 0
    proposed: list[int] = field(default_factory=list)


class RoundReporter:
    """Turns the core loop's `on_round(tokens, drafted, accepted, proposed)` into a progress-bar update and a
    `callback_on_round(round_index, RoundInfo)` call; the round index runs on across chunks."""

    def __init__(self, callback: RoundCallback | None = None, bar: Any = None) -> None:
        if callback is not None and not callable(callback):
            raise MMSpecError(f"callback_on_round must be a function (round_index, info), got {type(callback).__name__}")
        self.callback = callback
        self.bar = bar
        self.rounds = 0
        self.new_tokens = 0
        self.chunk: int | None = None
        self._counted_chunk: int | None = None
        self._chunk_start = 0  # new_tokens when the current chunk began

    def __call__(self, tokens: torch.Tensor, drafted: int, accepted: int, proposed: torch.Tensor | None = None) -> None:
        count = int(tokens.shape[0])
        if self.chunk != self._counted_chunk:
            self._counted_chunk, self._chunk_start = self.chunk, self.new_tokens
        position = self.new_tokens - self._chunk_start
        self.new_tokens += count
        if self.bar is not None:
            self.bar.update(count)
        if self.callback is not None:
            info = RoundInfo(tokens=tokens.tolist(), drafted=drafted, accepted=accepted, new_tokens=self.new_tokens,
                             chunk=self.chunk, position=position,
                             proposed=proposed.tolist() if proposed is not None else [])
            self.callback(self.rounds, info)
        self.rounds += 1


# --- loading helpers ----------------------------------------------------------------------------

def resolve_dtype(dtype: Any = None, torch_dtype: Any = None, default: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype a loader was asked for: `dtype=` or `torch_dtype=` (the same thing; diffusers and older
    transformers spell it the second way), a `torch.dtype` or its name ("bfloat16", "torch.float16")."""
    if dtype is not None and torch_dtype is not None and _as_dtype(dtype) != _as_dtype(torch_dtype):
        raise MMSpecError(f"dtype={dtype} and torch_dtype={torch_dtype} disagree: pass one of them")
    chosen = dtype if dtype is not None else torch_dtype
    return default if chosen is None else _as_dtype(chosen)


def _as_dtype(value: Any) -> torch.dtype:
    if isinstance(value, str):
        found = getattr(torch, value.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            value = found
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return value
    raise MMSpecError(f"dtype must be a floating-point torch.dtype such as torch.bfloat16 (or its name), got {value!r}")


def saved_pipeline_folder(name_or_path: str | os.PathLike) -> Path | None:
    """The folder if `name_or_path` (a zoo name or a local path) holds a saved pipeline (`model_index.json`), else None."""
    from .zoo import entries

    text = str(name_or_path)
    folder = next((entry.path for entry in entries() if entry.name == text), None) or Path(text).expanduser()
    return folder if (folder / MODEL_INDEX).is_file() else None


def _saved_class_name(folder: Path) -> str:
    try:
        return str(json.loads((folder / MODEL_INDEX).read_text()).get("_class_name", ""))
    except (OSError, ValueError) as error:
        raise MMSpecError(f"cannot read {folder / MODEL_INDEX}: {first_line(error)}") from None


# --- the base -----------------------------------------------------------------------------------

class SpeculativePipeline(DiffusionPipeline):
    """Base of the mmspec pipelines (see the module docstring). Subclasses:

    - call `self.register_modules(model=..., processor=..., ...)` and `self.register_to_config(...)`
      in `__init__` (components are the `__init__` arguments without a default, plus those named in
      `_optional_components`; the target model is the component named `model`);
    - implement `drafter_factories()` and, for methods that can be unavailable, `unavailable_reason()`;
    - set `preferred_methods` (the default method is the model card's measured fastest, else the
      first available of these) and `default_draft_tokens`;
    - list drafters that are not components in `extra_modules()`;
    - keep their own `from_pretrained` for zoo names / model folders / Hub ids and call
      `cls._from_saved(...)` for a saved pipeline folder.
    """

    _optional_components: ClassVar[list[str]] = []
    preferred_methods: ClassVar[tuple[str, ...]] = ()
    default_draft_tokens: ClassVar[dict[str, int]] = {}
    fallback_draft_tokens: ClassVar[int] = 5
    num_draft_tokens: int | None = None  # the caller's k for every method; None: per method
    model_name: str = ""

    # --- loading --------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any) -> "SpeculativePipeline":
        """Load a saved pipeline folder (written by `save_pretrained`).

        On `SpeculativePipeline` itself this returns the class the folder was saved as
        (`model_index.json`'s `_class_name`, looked up among mmspec's exports). Subclasses take zoo
        names, model folders and Hub ids too (see theirs).
        """
        folder = saved_pipeline_folder(pretrained_model_name_or_path)
        name = str(pretrained_model_name_or_path)
        if folder is None:
            raise MMSpecError(f"{name!r} is not a saved pipeline folder (no {MODEL_INDEX}); load a model through its "
                              "pipeline class (CaptionPipeline.from_pretrained, TranscriptionPipeline.from_pretrained, ...)")
        if cls is SpeculativePipeline:
            return saved_pipeline_class(folder).from_pretrained(pretrained_model_name_or_path, **kwargs)
        device = kwargs.pop("device", None)
        dtype = resolve_dtype(kwargs.pop("dtype", None), kwargs.pop("torch_dtype", None))
        return cls._from_saved(folder, name=name, dtype=dtype, device=device, **kwargs)

    @classmethod
    def _from_saved(cls, folder: Path, *, name: str, dtype: torch.dtype, device: str | torch.device | None = None,
                    **kwargs: Any) -> "SpeculativePipeline":
        """A saved pipeline through diffusers' loader; `kwargs` replace components or saved settings."""
        saved = _saved_class_name(folder)
        if saved != cls.__name__:
            raise MMSpecError(f"{name!r} holds a saved {saved or 'unknown pipeline'}, not a {cls.__name__}")
        from diffusers.utils import logging as diffusers_logging

        shown = diffusers_logging.is_progress_bar_enabled()
        diffusers_logging.disable_progress_bar()  # a "Loading pipeline components" bar per load is noise on stderr
        try:
            pipe = super().from_pretrained(str(folder), dtype=dtype, **kwargs)
        except MMSpecError:
            raise
        except Exception as error:  # noqa: BLE001 - OSError, ValueError, safetensors errors: all "cannot load"
            raise MMSpecError(f"cannot load the saved pipeline {name!r}: {first_line(error)}") from None
        finally:
            if shown:
                diffusers_logging.enable_progress_bar()
        return pipe.to(device) if device is not None else pipe

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        """Write `model_index.json`, each component in its subfolder (diffusers' layout) and each extra
        drafter in `<save_directory>/<name>/`; `from_pretrained(save_directory)` loads it all back."""
        super().save_pretrained(save_directory, **kwargs)
        safe = kwargs.get("safe_serialization", True)
        for name, module in self.extra_modules().items():
            module.save_pretrained(os.path.join(save_directory, name), safe_serialization=safe)

    # --- devices --------------------------------------------------------------------------------

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        """Drafter networks that are not registered components, by the subfolder they are saved in.
        They move with `.to()` and are saved by `save_pretrained`."""
        return {}

    def to(self, *args: Any, **kwargs: Any) -> "SpeculativePipeline":
        """Move every component and extra drafter, as diffusers' `pipe.to("cuda")` / `pipe.to(torch.bfloat16)`."""
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
        for arg in args:
            if isinstance(arg, torch.dtype):
                dtype = arg
            elif arg is not None:
                device = arg
        if (device is not None or dtype is not None) and is_spread(self.__dict__.get("model")):
            raise MMSpecError("the target model was spread by accelerate (device_map): it cannot be moved or cast; "
                              "load it again with the device_map / device and dtype wanted")
        super().to(*args, **kwargs)
        if device is not None or dtype is not None:
            for module in self.extra_modules().values():
                module.to(device=device, dtype=dtype)
        return self

    @property
    def device(self) -> torch.device:
        """The target model's device: where its inputs go, for a model spread by accelerate its first device
        (diffusers' rule: the first accelerator component, when there is no `model`)."""
        model = self.__dict__.get("model")
        return input_device(model) if isinstance(model, torch.nn.Module) else super().device

    @property
    def dtype(self) -> torch.dtype:
        """The target model's dtype (diffusers reads the first component in name order, which may be a drafter)."""
        model = self.__dict__.get("model")
        return model.dtype if isinstance(model, torch.nn.Module) else super().dtype

    # --- progress -------------------------------------------------------------------------------

    def progress_bar(self, iterable: Any = None, total: int | None = None, *, desc: str | None = None,
                     unit: str | None = None, enabled: bool = True) -> Any:
        """diffusers' progress bar with this call's description; `set_progress_bar_config(...)` settings
        win over the call's, and `enabled=False` (a call's `progress_bar=False`) hides it."""
        # Built here rather than through diffusers' own progress_bar, which reads one shared attribute: a call
        # must not set it (two threads on one pipeline would see each other's descriptions).
        config: dict[str, Any] = {"leave": False}
        if desc:
            config["desc"] = desc
        if unit:
            config["unit"] = unit
        config.update(progress_bar_settings(self))
        if not enabled:
            config["disable"] = True
        config.setdefault("disable", not first_process())
        if iterable is not None:
            return tqdm(iterable, **config)
        if total is not None:
            return tqdm(total=total, **config)
        raise MMSpecError("progress_bar needs an iterable or a total")

    def round_reporter(self, callback: RoundCallback | None = None, bar: Any = None) -> RoundReporter:
        """The core loop's `on_round` hook for one call: updates `bar` by tokens and calls `callback`."""
        return RoundReporter(callback, bar)

    # --- randomness -----------------------------------------------------------------------------

    def generator_for(
        self,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        seed: int | Sequence[int] | None = None,
        *,
        needed: bool = True,
        batch_size: int = 1,
    ) -> torch.Generator | list[torch.Generator] | None:
        """The generator(s) a call draws from.

        `generator`: a `torch.Generator` on any device (a CPU one works with a model on any device), or
        a list of one per batch item as diffusers takes them. `seed`: an int (or one per item) for a
        CPU generator, so a seed means the same on every device. Neither: when `needed`, a private
        generator seeded from torch's global RNG on the model's device (so `torch.manual_seed` repeats
        runs), else None. A single generator (not a list) comes back when `batch_size` is 1.
        """
        if generator is not None and seed is not None:
            raise MMSpecError("pass generator=... or seed=..., not both")
        if seed is not None:
            seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * batch_size
            if any(not isinstance(s, int) or isinstance(s, bool) for s in seeds):
                raise MMSpecError(f"seed must be an integer (or a list of them), got {seed!r}")
            generator = [seeded_generator("cpu", s) for s in seeds]
        if generator is None:
            return seeded_generator(self.device) if needed else None
        generators = list(generator) if isinstance(generator, (list, tuple)) else [generator] * batch_size
        for item in generators:
            if not isinstance(item, torch.Generator):
                raise MMSpecError(f"generator must be a torch.Generator (or a list of them), got {type(item).__name__}")
        if len(generators) != batch_size:
            raise MMSpecError(f"got {len(generators)} generators for a batch of {batch_size}: pass one per item")
        return generators[0] if batch_size == 1 else generators

    # --- methods --------------------------------------------------------------------------------

    def drafter_factories(self) -> dict[str, DrafterFactory | None]:
        """Every method this pipeline knows, in display order -> a factory for its drafter, or None while
        the method cannot run (its drafter is not loaded). The one registry of methods."""
        raise NotImplementedError

    def unavailable_reason(self, method: str) -> str:
        """Why `method` cannot run now (its factory is None), and how to make it run."""
        return f"the {method!r} method is not available for {self.model_name or type(self).__name__}"

    @property
    def methods(self) -> list[str]:
        return list(self.drafter_factories())

    @property
    def available_methods(self) -> list[str]:
        return [method for method, factory in self.drafter_factories().items() if factory is not None]

    @property
    def default_method(self) -> str:
        """The fastest lossless method measured for this model (zoo card), else the first available preferred one."""
        available = self.available_methods
        measured = self._card().get("fastest_lossless_method")
        if measured in available:
            return measured
        return next((m for m in self.preferred_methods if m in available), available[0])

    def check_method(self, method: str | None) -> str:
        """`method` (default: `default_method`), refused with one clear error when unknown or unavailable."""
        method = method or self.default_method
        factories = self.drafter_factories()
        if method not in factories:
            raise MMSpecError(f"unknown method {method!r}; choose from {', '.join(factories)}")
        if factories[method] is None:
            raise MMSpecError(self.unavailable_reason(method))
        return method

    def make_drafter(self, method: str) -> Drafter:
        """A fresh drafter for `method` (drafters hold per-call state)."""
        return self.drafter_factories()[self.check_method(method)]()

    def draft_policy(self, method: str) -> DraftLengthPolicy:
        """How many tokens a round drafts: a fixed `draft_length(method)` when the caller set `num_draft_tokens`
        or the model card names no policy for the method; else the card's measured best (`draft_policy`, e.g.
        `{"flash": {"policy": "adaptive", "num_tokens": 12, "threshold": 0.5}}`). A batch of several sequences
        cannot stop each row's drafts on its own confidence: it drafts `draft_length(method)` instead."""
        carded = self._card().get("draft_policy", {}).get(method)
        if self.num_draft_tokens is not None or carded is None:
            return FixedDraftLength(self.draft_length(method))
        options = {k: v for k, v in carded.items() if k != "policy"}
        try:
            return make_policy(carded.get("policy", "fixed"), **options)
        except (TypeError, MMSpecError) as err:
            raise MMSpecError(f"{self.model_name or 'the model'}'s card has a bad draft_policy for {method}: {err}") from None

    def draft_length(self, method: str) -> int:
        """Tokens drafted per round: the pipeline's `num_draft_tokens` if set, else the model card's
        measured best for the method (`draft_tokens`), else `default_draft_tokens`, else 5."""
        if self.num_draft_tokens is not None:
            return self.num_draft_tokens
        carded = self._card().get("draft_tokens", {}).get(method)
        return int(carded if carded is not None else self.default_draft_tokens.get(method, self.fallback_draft_tokens))

    @staticmethod
    def check_draft_tokens(num_draft_tokens: int | None) -> int | None:
        if num_draft_tokens is not None and (not isinstance(num_draft_tokens, int) or num_draft_tokens < 1):
            raise MMSpecError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        return num_draft_tokens

    def _card(self) -> dict[str, Any]:
        return self.__dict__.get("card") or {}


def saved_pipeline_class(folder: Path) -> type[SpeculativePipeline]:
    """The pipeline class a saved folder names (`_class_name`), looked up among mmspec's exports."""
    import mmspec

    name = _saved_class_name(folder)
    found = getattr(mmspec, name, None) if name else None
    if not (isinstance(found, type) and issubclass(found, SpeculativePipeline)):
        raise MMSpecError(f"{str(folder)!r} holds a {name or 'pipeline without a class name'}, not an mmspec pipeline")
    return found
