"""Every use of a private transformers / diffusers / accelerate internal, in one place.

Each wrapper checks the internal is there and still has the shape mmspec relies on; when it is not, it
raises one `CompatibilityError` naming the internal, the setting it serves and the installed versions,
instead of silently doing less (dropping a repetition penalty, keeping a stale cache entry).
`tests/test_compat.py` holds one canary per wrapper.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import inspect
from typing import Any

import torch

from .errors import MMSpecError


class CompatibilityError(MMSpecError):
    """An installed library no longer provides an internal mmspec needs; the message says which and for what."""


def installed_versions() -> str:
    """'transformers 5.24.0, diffusers 0.42.1, accelerate 1.2.0' (the packages the internals come from)."""
    found = []
    for name in ("transformers", "diffusers", "accelerate"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def incompatible(internal: str, setting: str) -> CompatibilityError:
    return CompatibilityError(
        f"{internal} is missing or changed in the installed libraries ({installed_versions()}); mmspec needs it for "
        f"{setting}. Install the versions pyproject.toml allows."
    )


# --- transformers: generation settings and logits processors ---------------------------------------------------

def _generation_mixin() -> type:
    from transformers import GenerationMixin

    return GenerationMixin


def prepare_generation_config(model: torch.nn.Module, base: Any, settings: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`generate`'s own merge of call settings over `base` (or the model's `generation_config`) over the global
    defaults: transformers' `GenerationMixin._prepare_generation_config`. Returns (config, unused settings).

    A model without `generate` (not a `GenerationMixin`) has no generation config of its own: the settings go
    over `base`, else over one made from the model config."""
    mixin = _generation_mixin()
    if not isinstance(model, mixin):
        from transformers import GenerationConfig

        config = copy.deepcopy(GenerationConfig.from_model_config(model.config) if base is None else base)
        return config, config.update(**settings)
    method = getattr(mixin, "_prepare_generation_config", None)
    if method is None or "generation_config" not in inspect.signature(method).parameters:
        raise incompatible("transformers GenerationMixin._prepare_generation_config",
                           "merging the call's generation settings with the model's generation_config")
    return type(model)._prepare_generation_config(model, base, **settings)


class _ProcessorBuilder:
    """Stands in for a model without `generate` (an image AR model): `_get_logits_processor` reads only the
    config and a helper of the mixin."""

    def __init__(self, config: Any) -> None:
        self.config = config


def get_logits_processor(model: torch.nn.Module, config: Any, *, prompt_length: int,
                         encoder_input_ids: torch.LongTensor | None, user_processors: list[Any],
                         device: torch.device) -> Any:
    """The processors `generate` builds for `config`: transformers' `GenerationMixin._get_logits_processor`.

    `config` needs the end tokens as a tensor (`set_eos_token_tensor`), as `generate` prepares them.
    """
    from transformers.generation.logits_process import LogitsProcessorList

    mixin = _generation_mixin()
    method = getattr(mixin, "_get_logits_processor", None)
    merge = getattr(mixin, "_merge_criteria_processor_list", None)
    if method is None or merge is None:
        raise incompatible("transformers GenerationMixin._get_logits_processor",
                           "building the logits processors of the generation settings (penalties, suppressions)")
    owner: Any = model
    if not isinstance(model, mixin):
        owner = _ProcessorBuilder(getattr(model, "config", None))
        owner._merge_criteria_processor_list = functools.partial(merge, owner)  # type: ignore[attr-defined]
    try:
        return method(owner, generation_config=config, input_ids_seq_length=prompt_length,
                      encoder_input_ids=encoder_input_ids, logits_processor=LogitsProcessorList(user_processors),
                      device=device, model_kwargs={})
    except TypeError as error:  # an argument renamed or removed
        raise incompatible("transformers GenerationMixin._get_logits_processor",
                           f"building the logits processors of the generation settings ({error})") from None


def set_eos_token_tensor(config: Any, eos_ids: list[int], device: torch.device) -> None:
    """Give `config` its end tokens as the tensor `generate` prepares (`GenerationConfig._eos_token_tensor`),
    which the min-length and end-token processors read."""
    if "_eos_token_tensor" not in _logits_processor_source():
        raise incompatible("transformers GenerationConfig._eos_token_tensor",
                           "min_length / min_new_tokens and the other end-token settings")
    config._eos_token_tensor = torch.tensor(eos_ids, dtype=torch.long, device=device) if eos_ids else None


def eos_token_tensor(config: Any) -> torch.Tensor | None:
    """The end tokens `set_eos_token_tensor` (or `generate`) gave `config` as a tensor, or None when it has none."""
    if "_eos_token_tensor" not in _logits_processor_source():
        raise incompatible("transformers GenerationConfig._eos_token_tensor",
                           "min_length / min_new_tokens and the other end-token settings")
    return getattr(config, "_eos_token_tensor", None)


@functools.lru_cache(maxsize=1)
def _logits_processor_source() -> str:
    method = getattr(_generation_mixin(), "_get_logits_processor", None)
    return "" if method is None else inspect.getsource(method)


# --- transformers: attention implementation and caches ----------------------------------------------------------

def attention_implementation(config: Any) -> str:
    """The attention kernel a model was loaded with ('sdpa', 'eager', 'flash_attention_2', ...):
    transformers' `PretrainedConfig._attn_implementation`."""
    from transformers import PretrainedConfig

    if not isinstance(getattr(PretrainedConfig, "_attn_implementation", None), property):
        raise incompatible("transformers PretrainedConfig._attn_implementation",
                           "checking which attention kernel the model runs (tree masks, lean forwards)")
    return str(getattr(config, "_attn_implementation", "") or "")


def set_attention_implementation(config: Any, implementation: str) -> None:
    """Choose the attention kernel of a model built from `config` (before building it)."""
    attention_implementation(config)  # the same internal: fail the same way
    config._attn_implementation = implementation


def compile_on_every_device(config: Any) -> None:
    """Let `generate` compile a static-cache forward with `config` (a `CompileConfig`) on any device, the CPU
    included: transformers compiles by itself only on accelerators unless `CompileConfig._compile_all_devices`."""
    from transformers import CompileConfig

    if "_compile_all_devices" not in vars(CompileConfig) or "_compile_all_devices" not in _generation_source():
        raise incompatible("transformers CompileConfig._compile_all_devices",
                           "compiling the static-cache generate row of the text bench on a CPU")
    config._compile_all_devices = True


@functools.lru_cache(maxsize=1)
def _generation_source() -> str:
    import transformers.generation.utils

    return inspect.getsource(transformers.generation.utils)


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) [B, heads, positions, head dim] of a transformers `DynamicCache`, to copy entries
    into another cache (Sparse-to-Dense's sparse copy). transformers has no public per-layer read of them."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise incompatible(f"transformers {type(cache).__name__}.layers", "reading a KV cache's keys and values")
    if not all(isinstance(getattr(layer, "keys", None), torch.Tensor) and isinstance(getattr(layer, "values", None), torch.Tensor)
               for layer in layers):
        raise incompatible("transformers cache layer .keys / .values", "reading a KV cache's keys and values")
    return [(layer.keys, layer.values) for layer in layers]


def copy_static_cache(source: Any, destination: Any, length: int) -> None:
    """Copy the first `length` positions of every layer of a transformers `StaticCache` into a larger one, and set
    the larger one's length to `length` (growing the static cache of `compile=True` for a longer call). transformers
    has no public way to move states between static caches: this reads each `StaticLayer`'s `keys` / `values`,
    initialises the destination's layers (`lazy_initialization`) and sets their `cumulative_length`."""
    setting = "growing the static KV cache of compile=True for a longer call"
    pairs = list(zip(_static_layers(source, setting), _static_layers(destination, setting), strict=True))
    for old, new in pairs:
        if not old.is_initialized:
            continue
        new.lazy_initialization(old.keys, old.values)
        new.keys[:, :, :length].copy_(old.keys[:, :, :length])
        new.values[:, :, :length].copy_(old.values[:, :, :length])
        new.cumulative_length.fill_(length)


def move_static_cache_positions(cache: Any, sources: torch.LongTensor, start: int) -> None:
    """Copy the states at `sources` (ascending, each >= its destination) of every layer of a transformers
    `StaticCache` to the positions from `start` on, in order (a draft tree's accepted path, moved into place after
    its root). The length pointer is the caller's to set (`crop`)."""
    setting = "keeping a draft tree's accepted path in the static KV cache of compile=True"
    for layer in _static_layers(cache, setting):
        if not layer.is_initialized or not sources.numel():
            continue
        where = sources.to(layer.keys.device)
        # index_select copies first: a source may lie where an earlier destination is written.
        layer.keys[:, :, start:start + where.numel()] = layer.keys.index_select(2, where)
        layer.values[:, :, start:start + where.numel()] = layer.values.index_select(2, where)


def reset_static_cache(cache: Any, length: int = 0) -> None:
    """Set the length of every initialised layer of a transformers `StaticCache` to `length`, keeping its tensors
    (a static cache reused by the next call: new tensors would recompile its graphs). transformers' `crop` only
    shortens a cache by a count read from its own length; this sets each `StaticLayer`'s `cumulative_length`."""
    for layer in _static_layers(cache, "reusing a static KV cache of compile=True for the next call"):
        if layer.is_initialized:
            layer.cumulative_length.fill_(length)


def write_static_cache(cache: Any, keys_values: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Write each layer's (keys, values) [B, heads, positions, head dim] into the first positions of a transformers
    `StaticCache` and set its length to theirs (states projected elsewhere, handed to a compiled step). Done with
    `update` they would land at the cache's current length; this initialises each `StaticLayer` as `update` does
    (`lazy_initialization`) and copies into its `keys` / `values`."""
    layers = _static_layers(cache, "handing projected keys and values to a static KV cache of compile=True")
    if len(keys_values) > len(layers):
        raise MMSpecError(f"{len(keys_values)} layers of keys and values for a static cache of {len(layers)} layers")
    for layer, (keys, values) in zip(layers, keys_values):
        if not layer.is_initialized:
            layer.lazy_initialization(keys, values)
        positions = keys.shape[2]
        layer.keys[:, :, :positions].copy_(keys)
        layer.values[:, :, :positions].copy_(values)
        layer.cumulative_length.fill_(positions)


def _static_layers(cache: Any, setting: str) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise incompatible("transformers StaticCache.layers", setting)
    for layer in layers:
        initialised = getattr(layer, "is_initialized", None)
        if not isinstance(initialised, bool) or not callable(getattr(layer, "lazy_initialization", None)):
            raise incompatible(f"transformers {type(layer).__name__}.is_initialized / .lazy_initialization", setting)
        if initialised and not all(isinstance(getattr(layer, name, None), torch.Tensor)
                                   for name in ("keys", "values", "cumulative_length")):
            raise incompatible(f"transformers {type(layer).__name__}.keys / .values / .cumulative_length", setting)
    return list(layers)


def cross_attention_flags(cache: Any) -> dict[int, bool]:
    """A transformers `EncoderDecoderCache`'s per-layer flags (`is_updated`): True where the layer's cross-attention
    keys and values are in the cache, so the decoder reads them instead of projecting the encoder states again."""
    return dict(_is_updated(cache))


def set_cross_attention_flags(cache: Any, flags: dict[int, bool]) -> None:
    """Set those flags for the layers in `flags` (a cross-attention cache filled, or to be filled, elsewhere)."""
    _is_updated(cache).update(flags)


def mark_cross_attention_filled(cache: Any, layers: int) -> None:
    """Flag the first `layers` layers' cross-attention as filled (keys and values written into the cache by hand)."""
    set_cross_attention_flags(cache, dict.fromkeys(range(layers), True))


def forget_cross_attention(cache: Any) -> None:
    """Flag every layer's cross-attention as empty: the next forward projects the encoder states again."""
    cache.is_updated = dict.fromkeys(_is_updated(cache), False)


def _is_updated(cache: Any) -> dict[int, bool]:
    flags = getattr(cache, "is_updated", None)
    if not isinstance(flags, dict):
        raise incompatible(f"transformers {type(cache).__name__}.is_updated (a dict of layer -> bool)",
                           "reusing cross-attention keys and values of an encoder-decoder (Whisper) cache")
    return flags


def keep_cache_positions(cache: Any, positions: torch.LongTensor) -> None:
    """Keep only the sequence positions `positions` (ascending) of every layer of a transformers `DynamicCache`,
    in place (after a tree forward: the committed path's entries). transformers has no public way to drop
    positions from the middle of a cache, so this rewrites each layer's `keys` / `values`."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if layers is None:
        raise MMSpecError(f"tree drafting cannot roll back a {type(cache).__name__}: it needs a DynamicCache")
    for layer in layers:
        if not isinstance(layer, DynamicLayer) or not hasattr(layer, "keys") or not hasattr(layer, "values"):
            raise incompatible(f"transformers {type(layer).__name__}.keys / .values",
                               "keeping a draft tree's accepted path in the KV cache")
        keys = layer.keys
        if keys is None or keys.numel() == 0:
            continue
        where = positions.to(keys.device)
        layer.keys = keys.index_select(-2, where)
        layer.values = layer.values.index_select(-2, where)


def skip_keys_device_placement(model: torch.nn.Module) -> Any:
    """Inputs accelerate must not move between devices: transformers' `PreTrainedModel._skip_keys_device_placement`
    (None when the model names none)."""
    from transformers import PreTrainedModel

    if not hasattr(PreTrainedModel, "_skip_keys_device_placement"):
        raise incompatible("transformers PreTrainedModel._skip_keys_device_placement",
                           "placing a drafter on another device than its target")
    return getattr(model, "_skip_keys_device_placement", None)


def mark_generation_config_explicit(config: Any) -> None:
    """Keep a generation config's own fields when the model is saved and reloaded (transformers regenerates
    configs it believes came from the model config: `GenerationConfig._from_model_config`)."""
    from transformers import GenerationConfig

    if not hasattr(GenerationConfig(), "_from_model_config"):
        raise incompatible("transformers GenerationConfig._from_model_config", "saving a model's generation settings")
    config._from_model_config = False


# --- accelerate ---------------------------------------------------------------------------------------------------

def accelerate_hook(module: torch.nn.Module) -> Any:
    """The accelerate hook a module carries (`_hf_hook`, set by `add_hook_to_module`), or None."""
    return getattr(module, "_hf_hook", None)


# --- diffusers -------------------------------------------------------------------------------------------------

def scheduler_variance(scheduler: Any, t: int, variance_type: str) -> torch.Tensor:
    """A DDPM scheduler's posterior variance at step `t`: diffusers' `DDPMScheduler._get_variance`."""
    method = getattr(scheduler, "_get_variance", None)
    if method is None or "variance_type" not in inspect.signature(method).parameters:
        raise incompatible(f"diffusers {type(scheduler).__name__}._get_variance",
                           "the diffusion head's learned-range variance")
    return method(t, variance_type=variance_type)


def progress_bar_settings(pipeline: Any) -> dict[str, Any]:
    """The settings a user gave `pipeline.set_progress_bar_config(...)` (diffusers keeps them in
    `_progress_bar_config`), as a copy."""
    from diffusers import DiffusionPipeline

    source = _progress_bar_source()
    if "self._progress_bar_config" not in source or not hasattr(DiffusionPipeline, "set_progress_bar_config"):
        raise incompatible("diffusers DiffusionPipeline._progress_bar_config", "set_progress_bar_config settings")
    settings = pipeline.__dict__.get("_progress_bar_config") or {}
    if not isinstance(settings, dict):
        raise MMSpecError(f"set_progress_bar_config settings must be keyword arguments, got {type(settings).__name__}")
    return dict(settings)


@functools.lru_cache(maxsize=1)
def _progress_bar_source() -> str:
    from diffusers import DiffusionPipeline

    return inspect.getsource(DiffusionPipeline.set_progress_bar_config)
