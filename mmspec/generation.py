"""What `generate` would do with the same call: the merged generation config, its logits
processors and its sampling settings, resolved once per call and checked up front.

transformers' `generate` merges the model's `generation_config` with the call's arguments
(call > model's config > global defaults), builds a list of logits processors from the result
(repetition penalty, n-gram blocking, bad words, minimum lengths, suppressed tokens, ...) and,
when sampling, the warpers (temperature, top-k, top-p). mmspec does the same merge with the
same transformers code, so a published checkpoint's shipped settings are in force here exactly
as in `generate`:

- the processors run on every verified position with that position's own prefix (`Target`), and
  on the drafter's proposals with theirs (`DraftView.processors`);
- temperature / top-k / top-p become the `SamplingConfig` both sides warp with;
- settings that cannot be honoured exactly (beam search, other warpers, guidance, ...) and
  arguments that are neither a setting nor a model input are refused, naming them.
"""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation import logits_process as lp

from . import compat
from .devices import input_device
from .errors import MMSpecError
from .sampling import SamplingConfig

# Processors that are a pure function of (prefix, scores): safe to call once per verified
# position with that position's prefix, in any round. Anything else generate could build is refused.
POSITIONWISE_PROCESSORS = (
    lp.RepetitionPenaltyLogitsProcessor,
    lp.EncoderRepetitionPenaltyLogitsProcessor,
    lp.NoRepeatNGramLogitsProcessor,
    lp.EncoderNoRepeatNGramLogitsProcessor,
    lp.NoBadWordsLogitsProcessor,
    lp.SequenceBiasLogitsProcessor,
    lp.MinLengthLogitsProcessor,
    lp.MinNewTokensLengthLogitsProcessor,
    lp.PrefixConstrainedLogitsProcessor,
    lp.ForcedBOSTokenLogitsProcessor,
    lp.ForcedEOSTokenLogitsProcessor,
    lp.InfNanRemoveLogitsProcessor,
    lp.ExponentialDecayLengthPenalty,
    lp.SuppressTokensLogitsProcessor,
    lp.SuppressTokensAtBeginLogitsProcessor,
    lp.LogitNormalization,
)
# Processors that ignore the prefix: run once over all verified rows instead of row by row.
PREFIX_FREE_PROCESSORS = (lp.SuppressTokensLogitsProcessor, lp.InfNanRemoveLogitsProcessor, lp.LogitNormalization)
# Processors that only mask (set scores to -inf, leave the others as they are): greedy choices through them
# can come from a `CertifiedHead` (exact type match: a subclass may do more).
MASKING_PROCESSORS = (
    lp.SuppressTokensLogitsProcessor,
    lp.SuppressTokensAtBeginLogitsProcessor,
    lp.MinLengthLogitsProcessor,
    lp.MinNewTokensLengthLogitsProcessor,
    lp.NoRepeatNGramLogitsProcessor,
)

# Settings speculative decoding cannot reproduce, with the values that mean "off".
UNSUPPORTED_SETTINGS: dict[str, tuple[Any, ...]] = {
    "num_beams": (None, 1),
    "num_beam_groups": (None, 1),
    "diversity_penalty": (None, 0.0),
    "num_return_sequences": (None, 1),
    "penalty_alpha": (None,),
    "dola_layers": (None,),
    "constraints": (None,),
    "force_words_ids": (None,),
    "guidance_scale": (None, 1, 1.0),
    "watermarking_config": (None,),
    "stop_strings": (None,),
    "max_time": (None,),
    "token_healing": (None, False),
    "prompt_lookup_num_tokens": (None,),
    "use_mtp": (None, False),
    "output_scores": (None, False),
    "output_logits": (None, False),
    "output_attentions": (None, False),
    "output_hidden_states": (None, False),
    "return_dict_in_generate": (None, False),
    "low_memory": (None, False),
}
# Warpers beyond temperature / top-k / top-p, "off" values; they only matter when sampling.
UNSUPPORTED_WARPERS: dict[str, tuple[Any, ...]] = {
    "min_p": (None,),
    "top_h": (None,),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
}
# generate() arguments that are not generation-config fields.
SUPPORTED_CALL_ARGUMENTS = ("logits_processor", "streamer", "generation_config")
UNSUPPORTED_CALL_ARGUMENTS = (
    "stopping_criteria", "prefix_allowed_tokens_fn", "assistant_model", "assistant_tokenizer", "tokenizer",
    "negative_prompt_ids", "negative_prompt_attention_mask", "synced_gpus", "custom_generate", "use_model_defaults",
)


@dataclass
class GenerationSettings:
    """One call's resolved settings."""

    config: GenerationConfig
    sampling: SamplingConfig
    stop_ids: set[int]
    user_processors: list[Any] = field(default_factory=list)
    streamer: Any = None
    default_max_length: bool = True  # nobody set max_length: generate then makes 20 new tokens

    @property
    def pad_token_id(self) -> int:
        """What fills a batch's rows that stopped early: the pad token, else the first end token (as `generate`)."""
        if self.config.pad_token_id is not None:
            return int(self.config.pad_token_id)
        eos = self.config.eos_token_id
        if isinstance(eos, int):
            return eos
        ids = list(eos or [])
        return int(ids[0]) if ids else 0

    def max_new_tokens(self, prompt_length: int, max_positions: int | None) -> int:
        """As `generate`: `max_new_tokens` when set; else `max_length` counted after the prompt when
        someone set it; else `max_length` (20) new tokens, within the model's positions."""
        if self.config.max_new_tokens is not None:
            return int(self.config.max_new_tokens)
        if not self.default_max_length:
            return int(self.config.max_length) - prompt_length
        total = int(self.config.max_length) + prompt_length
        return (total if max_positions is None else min(total, max_positions)) - prompt_length

    def fix_lengths(self, prompt_length: int, max_new_tokens: int) -> None:
        """Set max_length / min_length from the new-token counts, as generate does before building processors."""
        self.config.max_length = prompt_length + max_new_tokens
        if self.config.min_new_tokens is not None:
            self.config.min_length = prompt_length + self.config.min_new_tokens


def merged_generation_config(model: PreTrainedModel, base: GenerationConfig | None, settings: dict[str, Any],
                             shipped: bool = True) -> tuple[GenerationConfig, dict[str, Any]]:
    """generate's own merge (call > `base` or the model's config > global defaults); returns the rest of `settings`.

    `shipped=False` leaves the model's own generation config out (call > `base` > global defaults)."""
    if not shipped:
        config = copy.deepcopy(base if base is not None else GenerationConfig())
        return config, config.update(**settings)
    try:
        return compat.prepare_generation_config(model, base, settings)
    except compat.CompatibilityError:
        raise
    except ValueError as error:
        raise MMSpecError(f"invalid generation settings: {error}") from None


def check_supported(config: GenerationConfig) -> None:
    """Refuse, by name, every setting in force that speculative decoding cannot reproduce exactly."""
    checks = [(UNSUPPORTED_SETTINGS, "by speculative decoding (one sequence, draft-then-verify)")]
    if config.do_sample:
        checks.append((UNSUPPORTED_WARPERS, "when sampling (only temperature, top_k and top_p are)"))
    for table, why in checks:
        for name, off in table.items():
            value = getattr(config, name, None)
            if value not in off:
                raise MMSpecError(
                    f"{name}={value!r} is not supported {why}; leave it unset "
                    f"(for a model's shipped setting: model.generation_config.{name} = None)"
                )


def sampling_of(config: GenerationConfig) -> SamplingConfig:
    """generate's warpers as a `SamplingConfig`: temperature, then top-k, then top-p."""
    if not config.do_sample:
        return SamplingConfig()
    temperature = 1.0 if config.temperature is None else float(config.temperature)
    if not temperature > 0:
        raise MMSpecError(f"temperature must be > 0 when sampling, got {temperature}; use do_sample=False for greedy")
    top_k = int(config.top_k) if config.top_k else None
    top_p = float(config.top_p) if config.top_p is not None and config.top_p < 1.0 else None
    return SamplingConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)


def token_ids(eos: Any) -> int | list[int]:
    """An eos setting as plain ints (numpy and tensor ids too, as `generate` takes them): one id, or a list."""
    items = list(eos) if isinstance(eos, (list, tuple, set, torch.Tensor)) and getattr(eos, "ndim", 1) else None
    for item in [eos] if items is None else items:
        if not hasattr(item, "__index__") or isinstance(item, bool):
            raise MMSpecError(f"eos_token_id must be a token id (an integer) or a list of them, got {eos!r:.80}")
    return int(eos) if items is None else [int(t) for t in items]


def stop_ids_of(config: GenerationConfig, eos_token_id: int | Iterable[int] | None) -> set[int]:
    eos = config.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        return set()
    ids = token_ids(eos)
    return {ids} if isinstance(ids, int) else set(ids)


@functools.cache
def generation_fields() -> frozenset[str]:
    """The names a `GenerationConfig` takes (read once: building and dumping a config each call costs a deep copy)."""
    return frozenset(GenerationConfig().to_dict())


def model_input_names(model: PreTrainedModel) -> set[str]:
    """Argument names the model's forward (and, for encoder-decoders, its encoder) takes, as `generate` checks them."""
    def named(fn: Any) -> set[str]:
        params = inspect.signature(fn).parameters.values()
        return {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}

    names = named(model.forward)
    if getattr(model.config, "is_encoder_decoder", False):
        encoder = model.get_encoder() if hasattr(model, "get_encoder") else None
        if encoder is not None:
            names |= named(encoder.forward)
    return names | {"encoder_outputs", "decoder_input_ids"}


def resolve_generation(
    model: PreTrainedModel,
    arguments: dict[str, Any],
    *,
    eos_token_id: int | Iterable[int] | None = None,
    known_inputs: Iterable[str] | None = None,
    shipped: bool = True,
) -> tuple[GenerationSettings, dict[str, Any]]:
    """Split a call's keyword arguments into generation settings and model inputs, as `generate` does.

    Returns the resolved settings and the model inputs. Raises `MMSpecError` naming any argument
    that is neither (a typo, `foo=1`) or a setting that cannot be honoured (`num_beams=4`).
    `known_inputs` overrides the accepted model-input names (targets that take extra inputs).
    `shipped=False` ignores the model's own `generation_config` (targets whose model's `generate`
    settings do not drive this decoding, e.g. an image head under a text model's config).
    """
    arguments = dict(arguments)
    for name in UNSUPPORTED_CALL_ARGUMENTS:
        if arguments.get(name) is not None:
            raise MMSpecError(f"{name}= is not supported by speculative decoding")
        arguments.pop(name, None)
    user_processors = list(arguments.pop("logits_processor", None) or [])
    streamer = arguments.pop("streamer", None)
    base = arguments.pop("generation_config", None)
    if base is not None and not isinstance(base, GenerationConfig):
        raise MMSpecError(f"generation_config must be a transformers GenerationConfig, got {type(base).__name__}")
    fields = generation_fields()
    settings = {k: v for k, v in arguments.items() if k in fields}
    inputs = {k: v for k, v in arguments.items() if k not in settings}
    # A setting passed as None means "not set", as in generate.
    config, leftover = merged_generation_config(model, base, {k: v for k, v in settings.items() if v is not None}, shipped)
    inputs.update({k: v for k, v in leftover.items() if k not in settings})
    check_supported(config)
    accepted = set(known_inputs) if known_inputs is not None else model_input_names(model)
    unknown = sorted(k for k, v in inputs.items() if v is not None and k not in accepted)
    if unknown:
        raise MMSpecError(
            f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: neither a generation setting "
            f"nor an input of {type(model).__name__}"
        )
    for processor in user_processors:
        if not callable(processor):
            raise MMSpecError(f"logits_processor entries must be callables (input_ids, scores) -> scores, got {processor!r}")
    if streamer is not None and not (hasattr(streamer, "put") and hasattr(streamer, "end")):
        raise MMSpecError("streamer must have put() and end() methods (transformers' streamer protocol)")
    default_max_length = (
        settings.get("max_length") is None
        and (base is None or base.max_length is None)
        and (not shipped or getattr(getattr(model, "generation_config", None), "max_length", None) is None)
    )
    stop_ids = stop_ids_of(config, eos_token_id)
    if config.eos_token_id is not None:
        config.eos_token_id = token_ids(config.eos_token_id)  # the logits processors read plain ints
    resolved = GenerationSettings(
        config=config, sampling=sampling_of(config), stop_ids=stop_ids,
        user_processors=user_processors, streamer=streamer, default_max_length=default_max_length,
    )
    return resolved, {k: v for k, v in inputs.items() if v is not None}


def build_logits_processors(
    model: PreTrainedModel,
    config: GenerationConfig,
    prompt_length: int,
    user_processors: Iterable[Any] = (),
    encoder_input_ids: torch.LongTensor | None = None,
) -> lp.LogitsProcessorList:
    """The processors `generate` would build for this call, without the sampling warpers.

    `max_length` is set as generate sets it (prompt + new tokens) before the caller calls this.
    """
    user_processors = list(user_processors)
    config = copy.copy(config)  # the call's own merged config: only this copy's do_sample and eos tensor change
    config.do_sample = False  # warpers are the SamplingConfig's job
    device = input_device(model)  # `model.device` reads "meta" when accelerate offloaded the first parameter
    eos = config.eos_token_id
    eos_list = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    compat.set_eos_token_tensor(config, eos_list, device)
    processors = compat.get_logits_processor(model, config, prompt_length=prompt_length, encoder_input_ids=encoder_input_ids,
                                             user_processors=user_processors, device=device)
    check_processors_cover(config, processors)
    for processor in processors:
        if processor in user_processors:
            continue
        if not isinstance(processor, POSITIONWISE_PROCESSORS):
            raise MMSpecError(f"the generation settings need {type(processor).__name__}, which speculative decoding cannot reproduce")
    return processors


# Settings in force -> the processor generate must have built for them: if transformers' private builder stops
# building one, decoding would silently ignore the setting; refuse instead.
REQUIRED_PROCESSORS: tuple[tuple[str, Any, type], ...] = (
    ("repetition_penalty", lambda v: v is not None and float(v) != 1.0, lp.RepetitionPenaltyLogitsProcessor),
    ("no_repeat_ngram_size", lambda v: bool(v) and int(v) > 0, lp.NoRepeatNGramLogitsProcessor),
    ("bad_words_ids", bool, lp.NoBadWordsLogitsProcessor),
    ("sequence_bias", bool, lp.SequenceBiasLogitsProcessor),
    ("suppress_tokens", bool, lp.SuppressTokensLogitsProcessor),
    ("begin_suppress_tokens", bool, lp.SuppressTokensAtBeginLogitsProcessor),
    ("forced_bos_token_id", lambda v: v is not None, lp.ForcedBOSTokenLogitsProcessor),
    ("forced_eos_token_id", lambda v: v is not None, lp.ForcedEOSTokenLogitsProcessor),
)


def check_processors_cover(config: GenerationConfig, processors: Iterable[Any]) -> None:
    """Raise `CompatibilityError` when a setting in force has no processor among those transformers built."""
    built = tuple(processors)
    required = [(name, cls) for name, in_force, cls in REQUIRED_PROCESSORS if in_force(getattr(config, name, None))]
    eos = compat.eos_token_tensor(config)
    if eos is not None and (config.min_length or 0) > 0:
        required.append(("min_length", lp.MinLengthLogitsProcessor))
    if eos is not None and (config.min_new_tokens or 0) > 0:
        required.append(("min_new_tokens", lp.MinNewTokensLengthLogitsProcessor))
    for name, cls in required:
        if not any(isinstance(p, cls) for p in built):
            raise compat.incompatible("transformers GenerationMixin._get_logits_processor",
                                      f"{name}={getattr(config, name)!r} (it built no {cls.__name__})")


def process_rows(
    processors: lp.LogitsProcessorList, tokens: torch.LongTensor, first_position: int, logits: torch.Tensor
) -> torch.Tensor:
    """Apply `processors` to logits [B, n, V], row j seeing the prefix `tokens[:, :first_position + j + 1]`.

    That is the prefix row j follows in `generate`, so every verified position is processed exactly
    as generate would process it. Scores are float32, as in generate.
    """
    if not processors:
        return logits
    prefixes = [tokens[:, : first_position + j + 1] for j in range(logits.shape[1])]
    return process_prefixed_rows(processors, prefixes, logits)


def process_prefixed_rows(
    processors: lp.LogitsProcessorList, prefixes: list[torch.LongTensor], logits: torch.Tensor
) -> torch.Tensor:
    """Apply `processors` to logits [B, n, V], row j seeing the token prefix `prefixes[j]` [B, L_j]
    (a draft tree's rows follow different prefixes: the committed tokens and the node's own path)."""
    if not processors:
        return logits
    batch, rows, vocab = logits.shape
    logits = logits.float()
    # Consecutive prefix-free processors run once over all rows; the others row by row, in order.
    for prefix_free, group in itertools.groupby(processors, key=lambda p: isinstance(p, PREFIX_FREE_PROCESSORS)):
        group = list(group)
        if prefix_free:
            flat = logits.reshape(batch * rows, vocab)
            for processor in group:
                flat = processor(prefixes[-1], flat)
            logits = flat.reshape(batch, rows, vocab)
            continue
        out = []
        for j in range(rows):
            row = logits[:, j]
            for processor in group:
                row = processor(prefixes[j], row)
            out.append(row)
        logits = torch.stack(out, dim=1)
    return logits
