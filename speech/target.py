"""Whisper as the verifier: the forced decoder prompt and the token suppression of Whisper's `generate`.

What `WhisperForConditionalGeneration.generate(input_features, do_sample=False)` does for one
short-form clip (one encoder window) in transformers 5.x, and how it is reproduced here:

1. **Forced prompt** (`_retrieve_init_tokens`): `[decoder_start_token_id, <|lang|>, <|task|>,
   <|notimestamps|>]`. The language comes from `language=`, else from a legacy
   `forced_decoder_ids` entry, else (multilingual models: the config has `lang_to_id`) it is
   *detected*: one decoder step on the start token, argmax restricted to the language ids.
   The task token is added when `task=` is given, or when a language is given and no task token is
   present yet ("transcribe"); `<|notimestamps|>` is appended when timestamps are off.
   `whisper_prompt_ids()` reproduces this; language detection reuses the encoder output, so the
   encoder still runs once.
2. **Logits processors** (`_retrieve_logit_processors`): `SuppressTokensAtBeginLogitsProcessor`
   (`begin_suppress_tokens`, the first generated position only, typically the blank " " and
   end-of-text) and `SuppressTokensLogitsProcessor` (`suppress_tokens`, every step), placed in
   front of the caller's processors; Whisper's `generate` then hands them to the generic
   `generate`, which adds the processors of the other settings (repetition penalty, n-gram
   blocking, minimum lengths, ...). `WhisperTarget.build_logits_processors` builds the same list
   the same way, and the core applies it to every verified position with its own prefix.
   The timestamp processor (`WhisperTimeStampLogitsProcessor`) is added after them when the target
   decodes with timestamps (`timestamps=True`, as `return_timestamps=True`); the no-speech detector
   only records probabilities for the temperature fallback (not used by greedy short-form).
3. Output: `generate` returns the new tokens without the prompt and with the final end-of-text
   removed (`return_dict_in_generate=True` gives prompt + new tokens + end-of-text, which is
   what `speculative_generate` returns).
"""

from __future__ import annotations

import copy
from typing import Any, Iterable

import torch
from transformers import DynamicCache, EncoderDecoderCache, PreTrainedModel
from transformers.generation.logits_process import (
    LogitsProcessorList,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)
from transformers.modeling_outputs import BaseModelOutput

from .. import compat
from ..cached_model import cache_argument
from ..devices import input_device
from ..errors import MMSpecError
from ..targets import Target, register_target
from .english_only import english_only as _english_only
from .suppression import SuppressedTokens
from .timestamp_rules import BatchedTimestampRules

TASKS = ("transcribe", "translate")

def encoder_outputs_of(model: PreTrainedModel, model_inputs: dict[str, Any]) -> BaseModelOutput:
    """Run the encoder once and put its output into `model_inputs` in place of `input_features`.

    Later forwards (the target's prefill, a fast decoder) then reuse it; calling this again is free.
    """
    existing = model_inputs.get("encoder_outputs")
    if existing is not None:
        if not isinstance(existing, BaseModelOutput):
            existing = BaseModelOutput(last_hidden_state=existing[0])
            model_inputs["encoder_outputs"] = existing
        model_inputs.pop("input_features", None)
        return existing
    features = model_inputs.pop("input_features", None)
    if features is None:
        raise MMSpecError("a speech model needs input_features (log-mel features) or encoder_outputs")
    expected = getattr(model.config, "num_mel_bins", None)
    if features.dim() != 3 or (expected is not None and features.shape[1] != expected):
        raise MMSpecError(
            f"input_features must be [batch, {expected} mel bins, frames], got shape {tuple(features.shape)}"
        )
    mask = model_inputs.get("attention_mask")
    with torch.no_grad():  # not inference_mode: callers may feed the states to a trainable head
        out = model.get_encoder()(features, attention_mask=mask, return_dict=True)
    encoder_outputs = BaseModelOutput(last_hidden_state=out.last_hidden_state)
    model_inputs["encoder_outputs"] = encoder_outputs
    return encoder_outputs


def detect_language(model: PreTrainedModel, encoder_outputs: BaseModelOutput) -> int:
    """Whisper's language detection: one decoder step on the start token, argmax over the language ids."""
    config = model.generation_config
    start = torch.full((encoder_outputs.last_hidden_state.shape[0], 1), int(config.decoder_start_token_id), dtype=torch.long,
                       device=encoder_outputs.last_hidden_state.device)
    with torch.no_grad():
        logits = model(encoder_outputs=encoder_outputs, decoder_input_ids=start, use_cache=False).logits[:, -1]
    lang_ids = torch.tensor(sorted(config.lang_to_id.values()), device=logits.device)
    masked = torch.full_like(logits, float("-inf"))
    masked[:, lang_ids] = logits[:, lang_ids]
    return int(masked.argmax(-1)[0])


def language_id(model: PreTrainedModel, language: str) -> int:
    """Token id of `language` given as a token (`<|fr|>`), a code (`fr`) or a name (`french`)."""
    lang_to_id = getattr(model.generation_config, "lang_to_id", None)
    if not lang_to_id:
        raise MMSpecError("this model's generation config has no language tokens (lang_to_id): it is not multilingual")
    from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

    name = language.lower()
    candidates = [name, f"<|{name}|>", f"<|{TO_LANGUAGE_CODE.get(name, name)}|>"]
    for token in candidates:
        if token in lang_to_id:
            return int(lang_to_id[token])
    raise MMSpecError(f"unsupported language {language!r}; this model knows {', '.join(sorted(lang_to_id))}")


def check_language_and_task(model: PreTrainedModel, language: str | None, task: str | None) -> None:
    """Refuse a language or task the model cannot do, before any audio is read (one clear `MMSpecError`)."""
    if task is not None and task not in TASKS:
        raise MMSpecError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    if getattr(model.generation_config, "is_multilingual", None) is False:
        _english_only(language, task)
    elif language is not None:
        language_id(model, language)


def whisper_prompt_ids(
    model: PreTrainedModel,
    model_inputs: dict[str, Any] | None = None,
    *,
    language: str | None = None,
    task: str | None = None,
    timestamps: bool = False,
) -> torch.LongTensor:
    """The forced decoder prompt of Whisper's short-form `generate`, [1, P]: without timestamps it ends with
    `<|notimestamps|>`; with `timestamps` (`return_timestamps=True`) that token is left out.

    `model_inputs` (holding `input_features` or `encoder_outputs`) is only needed when the
    language has to be detected; the encoder output is then stored back into it for reuse.
    """
    config = model.generation_config
    start = config.decoder_start_token_id if config.decoder_start_token_id is not None else model.config.decoder_start_token_id
    if start is None:
        raise MMSpecError("the model has no decoder_start_token_id")
    if task is not None and task not in TASKS:
        raise MMSpecError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    if getattr(config, "is_multilingual", None) is False:
        language, task = _english_only(language, task)
    task = task if task is not None else getattr(config, "task", None)
    language = language if language is not None else getattr(config, "language", None)
    tokens: list[int | None] = [int(start)]
    if task is None and language is None:
        forced = getattr(config, "forced_decoder_ids", None) or getattr(model.config, "forced_decoder_ids", None)
        if forced:
            position = 1
            for index, token in forced:
                if index != position:
                    raise MMSpecError(f"forced_decoder_ids {forced} do not follow Whisper's prompt pattern")
                tokens.append(None if token is None else int(token))
                position += 1
    lang_to_id = getattr(config, "lang_to_id", None)
    language_missing = len(tokens) <= 1 or tokens[1] is None
    lang: int | None = None
    if language is not None:
        lang = language_id(model, language)
    elif lang_to_id and language_missing:
        if model_inputs is None:
            raise MMSpecError("detecting the language needs the audio: pass model_inputs, or set language=...")
        lang = detect_language(model, encoder_outputs_of(model, model_inputs))
    if lang is not None:
        if len(tokens) > 1:
            tokens[1] = lang
        else:
            tokens.append(lang)
    task_to_id = getattr(config, "task_to_id", None) or {}
    if task is not None:
        if task not in task_to_id:
            raise MMSpecError(f"this model's generation config has no {task!r} task token")
        task_token = int(task_to_id[task])
        known = set(int(t) for t in task_to_id.values())
        if any(t in known for t in tokens if t is not None):
            tokens = [task_token if t in known else t for t in tokens]
        else:
            tokens.append(task_token)
    elif language is not None and task_to_id:
        if not any(t in set(task_to_id.values()) for t in tokens):
            tokens.append(int(task_to_id["transcribe"]))
    no_timestamps = getattr(config, "no_timestamps_token_id", None)
    if no_timestamps is not None and tokens[-1] != no_timestamps and not timestamps:
        tokens.append(int(no_timestamps))
    ids = [t for t in tokens if t is not None]
    return torch.tensor([ids], dtype=torch.long, device=input_device(model))


def whisper_logits_processors(model: PreTrainedModel, begin_index: int, config: Any = None) -> LogitsProcessorList:
    """Whisper's own processors in `generate`'s order (begin suppression, then suppression), from `config`
    (default: the model's generation config)."""
    config = model.generation_config if config is None else config
    processors = LogitsProcessorList()
    device = input_device(model)
    if config.begin_suppress_tokens:
        processors.append(SuppressTokensAtBeginLogitsProcessor(list(config.begin_suppress_tokens), begin_index, device=device))
    if config.suppress_tokens:
        processors.append(SuppressTokensLogitsProcessor(list(config.suppress_tokens), device=device))
    return processors


def check_supported_generation_config(model: PreTrainedModel) -> None:
    """Refuse Whisper settings whose processors need timestamps (not reproduced here)."""
    if getattr(model.generation_config, "return_timestamps", None):
        raise MMSpecError(
            "return_timestamps=True is not supported by speculative transcription; "
            "clear it (model.generation_config.return_timestamps = False)"
        )


class WhisperTarget(Target):
    """`Target` for Whisper-style encoder-decoders whose greedy output equals `model.generate`.

    - `initial_sequence` runs the encoder once (its output replaces `input_features` in the model
      inputs, so the prefill and a fast decoder reuse it) and builds the forced prompt unless
      `decoder_input_ids` is given.
    - its logits processors are Whisper's suppressions in front of the generic ones, as in
      Whisper's `generate` (see the module docstring); the core applies them position by position.

    Args:
        model: a `WhisperForConditionalGeneration` (or a speech seq2seq model with the same
            generation-config conventions).
        language, task: as in Whisper's `generate` (None: the generation config's, or detected).
        logits_processors: extra processors to apply after Whisper's own (advanced).
        timestamps: decode with timestamp tokens, as `generate(return_timestamps=True)`: the prompt without
            `<|notimestamps|>` and Whisper's timestamp rules (`WhisperTimeStampLogitsProcessor`, after the
            suppressions, as `generate` orders them). Tiny models drop fewer sentences of a long window this way.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        language: str | None = None,
        task: str | None = None,
        output_hidden_states: bool = False,
        logits_processors: Iterable[Any] = (),
        timestamps: bool = False,
    ) -> None:
        super().__init__(model, output_hidden_states=output_hidden_states)
        if not self.is_encoder_decoder:
            raise MMSpecError(f"WhisperTarget needs an encoder-decoder speech model, got {type(model).__name__}")
        check_supported_generation_config(model)
        self.language = language
        self.task = task
        self.extra_processors = list(logits_processors)
        self.timestamps = timestamps
        if timestamps and getattr(model.generation_config, "no_timestamps_token_id", None) is None:
            raise MMSpecError("timestamps need the model's <|notimestamps|> token (generation config no_timestamps_token_id), "
                              "which this model does not name")
        self._cross_attention: tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]] | None = None

    def reuse_cross_attention(self, encoder_states: torch.Tensor, keys_values: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Cross-attention keys and values of `encoder_states`, one (keys, values) [B, heads, frames, head dim] per
        decoder layer, already projected by THIS model's layers (a self-drafter projects them before the target's
        prefill): the next `start` on these very encoder states takes them instead of projecting them again.
        They must be exactly what the layers' k_proj / v_proj give (same weights, same input tensor); anything
        else would change the output."""
        layers = self.model.config.decoder_layers
        if len(keys_values) != layers:
            raise MMSpecError(f"cross-attention keys/values for {len(keys_values)} layers, the decoder has {layers}")
        self._cross_attention = (encoder_states, keys_values)

    def drafts_can_join_prefill(self, drafts: torch.Tensor, model_inputs: dict[str, Any]) -> bool:
        """Not when the decoder attends row by row (int8, bfloat16: `precision.row_attention`): its prefill attends in
        one call, as greedy decoding's does, so draft rows beside the prompt would round differently from greedy's
        one-token steps; they are scored in the next forward, row by row."""
        from .precision import ROW_ATTENTION  # (the attention is registered with transformers on import)

        if getattr(self.model.config, "_attn_implementation", None) == ROW_ATTENTION:
            return False
        return super().drafts_can_join_prefill(drafts, model_inputs)

    def _start_sequence(self, sequence: torch.LongTensor, num_logits: int = 1, **model_inputs: Any) -> Any:
        given, self._cross_attention = self._cross_attention, None
        outputs = model_inputs.get("encoder_outputs")
        name = cache_argument(self.model)
        if given is not None and outputs is not None and outputs.last_hidden_state is given[0] and name not in model_inputs:
            model_inputs[name] = self._cache_holding(given[1])
        return super()._start_sequence(sequence, num_logits, **model_inputs)

    def _cache_holding(self, keys_values: list[tuple[torch.Tensor, torch.Tensor]]) -> EncoderDecoderCache:
        """An empty self-attention cache beside a filled cross-attention one, marked filled (the layers then read
        it, as from the second step of a normal decode, instead of projecting the encoder states)."""
        config = copy.deepcopy(self.model.config)
        config.num_hidden_layers = config.decoder_layers  # Whisper's num_hidden_layers counts the encoder's
        cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
        for index, (keys, values) in enumerate(keys_values):
            cache.cross_attention_cache.update(keys, values, index)
        compat.mark_cross_attention_filled(cache, len(keys_values))
        return cache

    @property
    def max_target_positions(self) -> int | None:
        return getattr(self.model.config, "max_target_positions", None)

    def max_new_tokens_for(self, prompt_length: int, wanted: int) -> int:
        """`wanted`, capped so that prompt + new tokens fit the decoder's positions (as `generate` does)."""
        limit = self.max_target_positions
        return wanted if limit is None else max(1, min(wanted, limit - prompt_length))

    def prompt_ids(self, model_inputs: dict[str, Any]) -> torch.LongTensor:
        return whisper_prompt_ids(self.model, model_inputs, language=self.language, task=self.task,
                                  timestamps=self.timestamps)

    def initial_sequence(self, input_ids: torch.LongTensor | None, model_inputs: dict[str, Any]) -> torch.LongTensor:
        if input_ids is not None:
            raise MMSpecError("a speech target takes input_features=..., not input_ids")
        states = encoder_outputs_of(self.model, model_inputs).last_hidden_state
        decoder_ids = model_inputs.pop("decoder_input_ids", None)
        if decoder_ids is None:
            # Each recording its own prompt (a multilingual model detects each one's language).
            rows = [self.prompt_ids({"encoder_outputs": BaseModelOutput(last_hidden_state=states[b:b + 1])})
                    for b in range(states.shape[0])] if states.shape[0] > 1 else [self.prompt_ids(model_inputs)]
            decoder_ids = torch.cat(rows)
        if decoder_ids.dim() != 2 or decoder_ids.shape[0] != states.shape[0] or decoder_ids.shape[1] == 0:
            raise MMSpecError(f"decoder_input_ids must be a non-empty [{states.shape[0]}, length] tensor (one row per "
                              f"recording), got shape {tuple(decoder_ids.shape)}")
        return decoder_ids

    def build_logits_processors(self, config: Any, prompt_length: int, user_processors: list[Any],
                                encoder_input_ids: torch.LongTensor | None = None) -> LogitsProcessorList:
        own = whisper_logits_processors(self.model, begin_index=prompt_length, config=config)
        if self.timestamps:
            # The timestamp rules read the scores, so the core's masking fast path is off: the suppressions keep
            # their masks (`SuppressedTokens`, the same scores). After them, as in `generate`: the rules' "timestamp
            # more likely than any text" test reads their result.
            own = LogitsProcessorList(SuppressedTokens(p.begin_suppress_tokens.tolist(), p.begin_index)
                                      if isinstance(p, SuppressTokensAtBeginLogitsProcessor)
                                      else SuppressedTokens(p.suppress_tokens.tolist()) for p in own)
            # (`BatchedTimestampRules`: transformers' timestamp processor without its per-row Python loop, same scores)
            own.append(BatchedTimestampRules(self.model.generation_config, begin_index=prompt_length))
        config = copy.deepcopy(config)
        config.suppress_tokens = config.begin_suppress_tokens = None  # Whisper's own processors carry them
        return super().build_logits_processors(config, prompt_length, [*own, *self.extra_processors, *user_processors])


register_target("whisper", WhisperTarget)
