"""A diffusers-style transcription pipeline: Whisper verifies, a fast decoder drafts (Hybrid Decoding).

    pipe = TranscriptionPipeline.from_pretrained("path/to/whisper-folder")   # or a zoo name / Hub id / saved pipeline
    out = pipe(audio="clip.wav", method="hybrid", mode="strict")
    out.text, out.decoder_passes, out.stats.tau                            # also out["text"], out[0]
    pipe.save_pretrained("my-asr")                                         # model_index.json + components

A `SpeculativePipeline` (mmspec.pipelines, on diffusers' `DiffusionPipeline`): the Whisper model,
its processor and the fast decoder (either kind) are components.

Methods:
  hybrid  Hybrid Decoding (Lim et al., "Hybrid Decoding: Rapid Pass and Selective Detailed
          Correction for Sequence Models", arXiv 2508.19671): the fast decoder drafts the whole
          chunk in one pass, the big decoder verifies and corrects it (`speech/hybrid.py`).
          `strict` output is identical to the model's greedy `generate`; `relaxed` accepts
          drafts the big decoder ranks highly enough (not lossless, see `relaxed_top_r_rule`).
  ar      plain greedy decoding through the same loop and the same Whisper target (the baseline).

Conventions and decisions:
  - Fast decoder: two kinds, both trained by `mmspec train-fast-decoder` and kept in subfolders
    of the model folder (the Whisper checkpoint + processor):
      `fast_decoder/`     a `CTCFastDecoder` (non-autoregressive, one pass; the default kind),
      `ar_fast_decoder/`  an `ARFastDecoder`, a one-layer `WhisperForCausalLM` that drafts the
                          hypothesis token by token with its own KV cache (`ar_fast_decoder.py`).
    `fast_decoder=` picks one: "ctc" or "ar" (that subfolder, which must exist), a folder (the
    kind is read from its config.json), or a loaded model. With None, `fast_decoder/` is used if
    present, else `ar_fast_decoder/`. Without any, only `ar` is available. (The fast decoder kind
    "ar" is unrelated to the method "ar": an AR fast decoder still serves method "hybrid".)
  - Chunking (`long_audio.py`): the audio is cut at pauses into speech regions; a region that fits
    the window the feature extractor pads to (`n_samples`, 30 s for Whisper; it must match the
    encoder's `2 x max_source_positions` frames) is one window, a longer one is read in windows
    overlapping by a sixth of the window on each side (transformers' ASR pipeline's default
    stride), whose token sequences are stitched where they agree. Neighbouring regions that each fit
    a window are packed into one window of up to `pack_seconds` of audio (default: the whole window),
    their samples back to back, as faster-whisper's VAD path packs its speech chunks (`pack_windows`;
    this changes what the model sees: several regions in one window; `pack_seconds=0` reads one region
    per window). Windows are encoded `encoder_batch_size` at a time (default `ENCODER_BATCH`, 8), then
    decoded `decoder_batch_size` at a time (default `DECODER_BATCH`, 8) as one ragged batch (`BatchRounds`: rows
    leave the batch when they end; one window at a time when a round callback is given or the method's drafter
    does not decode batches); the language is detected per window when not given. Each row's tokens are those of
    its window decoded alone, so hybrid strict equals greedy window by window: greedy decoding of the same encoder
    states. A row of a
    batched encoder forward may differ in its last bits from that window encoded alone, as the matrix
    kernels can depend on the batch size (whisper-tiny.en's rows came out bit-identical on the CPUs
    tried; a tiny random model's did not); `encoder_batch_size = 1` encodes each window alone, and
    then every window equals greedy decoding of its own encoder states. `out.chunks` are the windows
    as decoded; `out.segments` the stitched text with each window's own time span on the original timeline (one segment per
    packed window, from its first region's start to its last region's end), which the subtitle
    writers (`subtitles.py`) turn into cues. A packed window whose transcript looks like a decoding
    loop (no end-of-text, or a text that compresses more than 2.4 times) is read again one region per
    window (`_unpack_looped`; `long_audio.looks_looped`).
  - Silence: silence is not an error. Pauses (RMS below `silence_threshold`, 1e-3 = -60 dBFS, or
    below the recording's own noise floor, see `speech_regions`) are not decoded (Whisper tends to
    hallucinate text on silence); a wholly silent clip gives `text == ""`, no chunks and a `note`.
    `silence_threshold=None` decodes the whole audio. Empty, corrupt, unsupported or too short
    (under 0.2 s) audio raises `MMSpecError` (from `load_audio`, which takes a path, an array with
    its `sampling_rate`, or a `{"array", "sampling_rate"}` dict).
  - `decoder_passes` counts forward passes of the big decoder, Whisper's one-step language
    detection included; fast-decoder passes are `stats.drafter_forwards`.
  - Compute types (`compute_type=` on `from_pretrained`; `precision.py`): float32 (default), bfloat16,
    int8. Each is its own model: `strict` output is identical to greedy decoding of the model at that
    compute type, and the int8 and bfloat16 decoders are row-exact (the same bits whatever a verification
    pass holds). The encoder runs once per window, timed apart (`encoder_time_s`): `stats`' prefill is the
    decoder's.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoProcessor, PreTrainedModel, WhisperForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput

from ..cached_model import model_vocab_size
from ..decoding import SpeculativeDecoder
from ..devices import as_device, input_device, load_options, place_drafter
from ..drafters import Drafter, NoDrafter
from ..errors import MMSpecError, first_line
from ..kernels.certified_head import certified_head_available, certified_head_for
from ..loading import from_pretrained_complete
from ..pipeline_batches import batching_refusal, check_batch_size, check_batching, groups, per_item
from ..pipelines import (
    DrafterFactory,
    RoundCallback,
    RoundReporter,
    SpeculativePipeline,
    TextPipelineOutput,
    resolve_dtype,
    saved_pipeline_folder,
)
from ..stats import SpecStats
from ..targets import Target
from ..zoo import cannot_load, folder_card
from .ar_fast_decoder import AR_FAST_DECODER_FOLDER, ARFastDecoder, attach_ar_fast_decoder
from .audio import AudioSource, load_audio
from .ctranslate2 import is_ct2_whisper_folder, load_ct2_whisper
from .fast_decoder import CTCFastDecoder
from .feature_drafter import WhisperFeatureDrafterModel
from .features import DEFAULT_FEATURE_PADDING, check_feature_padding, log_mel_features
from .hybrid import DEFAULT_DRAFT_TOKENS, MODES, hybrid_drafter_for, hybrid_policy, hybrid_rule
from .long_audio import STRIDE_FRACTION, Window, looks_looped, pack_windows, plan_windows, speech_regions, stitch
from .models import DEFAULT_ASR_MODEL, fast_decoder_root, speech_model_path, zoo_entry
from .precision import apply_compute_type, check_compute_type, compute_type_of, has_compute_type_layers
from .subtitles import Segment
from .target import WhisperTarget, check_language_and_task, encoder_outputs_of

FAST_DECODER_FOLDER = "fast_decoder"
FAST_DECODER_FOLDERS = {"ctc": FAST_DECODER_FOLDER, "ar": AR_FAST_DECODER_FOLDER}  # kind -> subfolder, default first
FastDecoder = CTCFastDecoder | ARFastDecoder
NOT_A_FAST_DECODER = ("that is a feature drafter (WhisperFeatureDrafterModel), not a fast decoder: it drafts through "
                      "SpeculativeDecoder(WhisperTarget(model), WhisperFeatureDrafter(folder)) or `mmspec bench speech "
                      "--feature-drafter FOLDER`, not the transcription pipeline")
METHODS = ("hybrid", "ar")
SILENCE_THRESHOLD = 1e-3
MIN_AUDIO_S = 0.2  # shorter than a syllable: no speech to transcribe
FALLBACK_MAX_NEW_TOKENS = 448  # Whisper's decoder length, for models that do not state theirs
ENCODER_BATCH = 8  # windows of one recording encoded together ([B, mel bins, frames]): `encoder_batch_size`'s default
PREVIOUS_TEXT_TOKENS = 223  # at most this many previous text tokens in a prompt: half Whisper's 448 positions, less one
DECODER_BATCH = 8  # windows of one recording decoded together (a ragged batch): `decoder_batch_size`'s default


@dataclass
class ChunkTranscript:
    """One window of the audio: where it lies, what it says, and how it was decoded."""

    start_s: float
    end_s: float
    text: str
    tokens: list[int]
    stats: SpecStats
    decoder_passes: int
    encoder_time_s: float = 0.0  # the encoder's forward on this window (not in `stats`' prefill)


@dataclass
class TranscriptionOutput(TextPipelineOutput):
    """What a transcription call produced, and how (stats summed over chunks): `text`, `method`, `model`,
    `stats`, then `mode`, `decoder_passes`, `chunks` (the windows as decoded), `total_time_s` (the whole call:
    audio decoding, features, encoder and decoding), `note` (e.g. why the text is empty), `segments`
    (`Segment(start_s, end_s, text)`, the stitched transcript with times, for subtitles), `encoder_time_s`
    (the encoder's forwards, summed over windows; `stats`' prefill is the decoder's) and `compute_type`."""

    mode: str
    decoder_passes: int
    chunks: list[ChunkTranscript] = field(default_factory=list)
    total_time_s: float = 0.0
    note: str | None = None
    segments: list[Segment] = field(default_factory=list)
    encoder_time_s: float = 0.0
    compute_type: str = "float32"


class TranscriptionPipeline(SpeculativePipeline):
    """Transcribe audio with a Whisper model, by hybrid decoding (fast draft + verification) or plainly.

    Args:
        model: a `WhisperForConditionalGeneration`.
        processor: its `WhisperProcessor` (feature extractor + tokenizer).
        fast_decoder: a `CTCFastDecoder` or `ARFastDecoder` trained on this model's encoder (None: `hybrid`
            unavailable).
        model_name: shown in outputs.
        num_draft_tokens: the longest draft verified in one decoder pass.
        relaxed_top_r, relaxed_margin: the `relaxed` acceptance rule (`relaxed_top_r_rule`).
        feature_padding: how a window's log-mel features are padded to 30 s: "log-mel" (the default; openai-whisper's
            and faster-whisper's: zero frames) or "audio" (transformers' feature extractor: zero samples); see
            `speech/features.py`. A setting of the model's input: hybrid strict equals greedy of either.

    Components (saved by `save_pretrained`): `model`, `processor`, `fast_decoder`; settings in
    `model_index.json`: `num_draft_tokens`, `relaxed_top_r`, `relaxed_margin`, `feature_padding`.
    """

    _optional_components = ["fast_decoder"]
    preferred_methods = ("hybrid", "ar")

    def __init__(
        self,
        model: PreTrainedModel,
        processor: Any,
        fast_decoder: FastDecoder | None = None,
        model_name: str = "",
        *,
        num_draft_tokens: int = DEFAULT_DRAFT_TOKENS,
        relaxed_top_r: int = 3,
        relaxed_margin: float = 2.0,
        feature_padding: str = DEFAULT_FEATURE_PADDING,
    ) -> None:
        super().__init__()
        feature_padding = check_feature_padding(feature_padding)
        feature_extractor = getattr(processor, "feature_extractor", None)
        tokenizer = getattr(processor, "tokenizer", None)
        if feature_extractor is None or tokenizer is None:
            raise MMSpecError(f"the processor must hold a feature extractor and a tokenizer (a WhisperProcessor), "
                              f"got {type(processor).__name__}")
        if isinstance(fast_decoder, ARFastDecoder):
            attach_ar_fast_decoder(fast_decoder, model)
        elif isinstance(fast_decoder, WhisperFeatureDrafterModel):
            raise MMSpecError(NOT_A_FAST_DECODER)
        elif fast_decoder is not None:
            check_fast_decoder(fast_decoder, model)
        self.check_draft_tokens(num_draft_tokens)
        self.register_modules(model=model.eval(), processor=processor,
                              fast_decoder=fast_decoder.eval() if fast_decoder is not None else None)
        self.register_to_config(num_draft_tokens=num_draft_tokens, relaxed_top_r=relaxed_top_r,
                                relaxed_margin=relaxed_margin, feature_padding=feature_padding)
        self.feature_extractor = feature_extractor
        self.tokenizer = tokenizer
        self.model_name = model_name or model.config.name_or_path or type(model).__name__
        self.num_draft_tokens = num_draft_tokens
        self.relaxed_top_r = relaxed_top_r
        self.relaxed_margin = relaxed_margin
        self.feature_padding = feature_padding
        self.sampling_rate = int(self.feature_extractor.sampling_rate)
        self.chunk_seconds = self._chunk_seconds()
        self.encoder_batch_size = ENCODER_BATCH  # windows of one recording per encoder forward (1: each alone)
        self.decoder_batch_size = DECODER_BATCH  # windows of one recording per decoder batch (1: each alone)

    @classmethod
    def from_pretrained(
        cls,
        model_id_or_path: str | os.PathLike = DEFAULT_ASR_MODEL,
        fast_decoder: str | os.PathLike | FastDecoder | None = None,
        dtype: torch.dtype | str | None = None,
        device: str | torch.device | None = None,
        *,
        torch_dtype: torch.dtype | str | None = None,
        device_map: str | dict[str, Any] | None = None,
        max_memory: dict[Any, Any] | None = None,
        offload_folder: str | os.PathLike | None = None,
        drafter_device: str | torch.device | None = None,
        compute_type: str | None = None,
        **kwargs: Any,
    ) -> "TranscriptionPipeline":
        """Load a Whisper model + processor (zoo name, local folder, saved pipeline or Hub id available offline)
        and a fast decoder.

        `fast_decoder`: "ctc" / "ar" (the model folder's `fast_decoder/` / `ar_fast_decoder/`), a
        folder, a loaded fast decoder, or None (a saved pipeline: the one it was saved with; else the
        kind the folder's zoo card measured fastest, `default_fast_decoder`, else `fast_decoder/` if
        present, else `ar_fast_decoder/`). `dtype` (or `torch_dtype`, the same) defaults to float32.
        Other keyword arguments go to the constructor (`num_draft_tokens`, ...).

        `compute_type` (as faster-whisper's): "float32" (default), "bfloat16" (the model cast, the same as
        dtype=torch.bfloat16) or "int8" (int8 products in the encoder's and decoder's linear layers, see
        `mmspec.speech.precision`; CPU only). Hybrid strict output is identical to greedy decoding of the
        model at that compute type (its own `generate`), not to float32's.

        Placement: `device` (default CPU) holds the whole pipeline. A Whisper model bigger than one device
        is spread by accelerate instead: `device_map` ("auto" or {module name: device}), `max_memory`
        ({"cpu": "20GiB", 0: "10GiB"}; alone it means device_map="auto") and `offload_folder` (for layers
        mapped to "disk") go to its `from_pretrained` (not for CTranslate2 folders); the fast decoder then
        sits on `drafter_device` (default: the model's first device, where its inputs go).
        """
        given = None if dtype is None and torch_dtype is None else resolve_dtype(dtype, torch_dtype)
        compute_type = compute_type_for(compute_type, given)
        # int8 and bfloat16 are made from the float32 weights (`apply_compute_type`); the fast decoder runs in the
        # model's dtype
        dtype = torch.float32 if compute_type in ("int8", "bfloat16") else (given or torch.float32)
        drafter_dtype = torch.bfloat16 if compute_type == "bfloat16" else dtype
        placement = load_options(device, device_map, max_memory, offload_folder)
        device = None if placement else (device or "cpu")
        name = str(model_id_or_path)
        saved = saved_pipeline_folder(name)
        if saved is not None:
            if fast_decoder is not None:
                if isinstance(fast_decoder, str) and fast_decoder in FAST_DECODER_FOLDERS:
                    raise MMSpecError(f"{name!r} is a saved pipeline: its fast decoder is the one saved with it; pass a "
                                      "fast decoder folder or model to replace it")
                kwargs["fast_decoder"] = _loaded_fast_decoder(fast_decoder).to(dtype=drafter_dtype)
            if placement:  # diffusers' loader moves components whole: load the model dispatched here
                kwargs["model"] = load_whisper(name, str(saved / "model"), dtype=dtype, **placement)[0]
            if compute_type in ("int8", "bfloat16"):  # before the fast decoder binds a self-drafter to its layers
                kwargs["model"] = apply_compute_type(load_whisper(name, str(saved / "model"), dtype=dtype, device=device)[0],
                                                     compute_type)
            pipe = cls._from_saved(saved, name=name, dtype=dtype, device=device, model_name=name, **kwargs)
            if pipe.fast_decoder is not None and (placement or drafter_device is not None):
                place_fast_decoder(pipe.fast_decoder, drafter_device, pipe.model)
            return pipe.prepare_decoding()
        path = speech_model_path(name)
        model, processor = load_whisper(name, path, dtype=dtype, device=device, **placement)
        if compute_type is not None:
            model = apply_compute_type(model, compute_type)  # before a self-drafter binds the decoder's layers
        root = fast_decoder_root(name, path)
        if isinstance(fast_decoder, str) and fast_decoder in FAST_DECODER_FOLDERS:
            kind, fast_decoder = fast_decoder, root / FAST_DECODER_FOLDERS[fast_decoder]
            if not fast_decoder.is_dir():
                raise MMSpecError(f"{name!r} has no {kind} fast decoder (no {FAST_DECODER_FOLDERS[kind]}/ subfolder in {root}); "
                                  f"train one with `mmspec train-fast-decoder --kind {kind}`")
        if fast_decoder is None:
            fast_decoder = default_fast_decoder_folder(root)
        if fast_decoder is not None:
            fast_decoder = place_fast_decoder(_loaded_fast_decoder(fast_decoder).to(dtype=drafter_dtype), drafter_device, model)
        return cls(model, processor, fast_decoder=fast_decoder, model_name=name, **kwargs).prepare_decoding()

    # --- configuration ------------------------------------------------------------------------

    def prepare_decoding(self) -> "TranscriptionPipeline":
        """Make now what the first transcription would make on first use: the certified head's bfloat16 copy
        (greedy verification on a CPU) and the fast decoder's drafting rows and int8 copies. Loading then holds
        that cost (the CLI's start-up line), not the first transcription's prefill. Returns the pipeline."""
        head = self.model.get_output_embeddings()
        if isinstance(head, torch.nn.Linear) and head.bias is None and certified_head_available(head.weight) \
                and head.weight.numel() >= Target.certified_head_min_size:
            certified_head_for(head.weight)
        fast = self.fast_decoder
        if isinstance(fast, ARFastDecoder) and not fast.proj_out.weight.is_meta and fast.proj_out.weight.device.type == "cpu":
            fast.lean_runner(fast.draft_head()[0])
        return self

    @property
    def compute_type(self) -> str:
        """The precision the model runs at: "float32", "bfloat16" or "int8" (see `mmspec.speech.precision`)."""
        return compute_type_of(self.model)

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        if has_compute_type_layers(self.model):
            raise MMSpecError(f"a {self.compute_type} pipeline is made from the float32 weights when loaded and is not "
                              f"saved as such: save the float32 pipeline and load it with compute_type='{self.compute_type}'")
        super().save_pretrained(save_directory, **kwargs)

    def drafter_factories(self) -> dict[str, DrafterFactory | None]:
        fast = self.fast_decoder
        return {"hybrid": (lambda: hybrid_drafter_for(fast)) if fast is not None else None, "ar": NoDrafter}

    def unavailable_reason(self, method: str) -> str:
        if zoo_entry(self.model_name) is not None:
            return (f"no fast decoder ships for {self.model_name!r} yet, so method 'hybrid' cannot run on it: use method "
                    "'ar' (plain greedy decoding, its default), or train one with `mmspec train-fast-decoder` and pass "
                    "fast_decoder=PATH")
        return ("the hybrid method needs a fast decoder: pass fast_decoder=PATH (or put one in the model folder's "
                f"{FAST_DECODER_FOLDER}/ or {AR_FAST_DECODER_FOLDER}/ subfolder), or use method='ar'")

    @property
    def fast_decoder_kind(self) -> str | None:
        """The kind of the loaded fast decoder: "ctc", "ar", or None."""
        if self.fast_decoder is None:
            return None
        return "ar" if isinstance(self.fast_decoder, ARFastDecoder) else "ctc"

    def _chunk_seconds(self) -> float:
        """The window the feature extractor pads to, checked against what the encoder reads."""
        n_samples = getattr(self.feature_extractor, "n_samples", None)
        if not n_samples:
            raise MMSpecError("the feature extractor does not say how long a chunk is (n_samples)")
        frames = getattr(self.feature_extractor, "nb_max_frames", None)
        max_source = getattr(self.model.config, "max_source_positions", None)
        if frames is not None and max_source is not None and int(frames) != 2 * int(max_source):
            raise MMSpecError(
                f"the feature extractor makes {frames} frames per chunk but the model's encoder reads "
                f"{2 * int(max_source)} (2 x max_source_positions): the processor does not belong to this model"
            )
        mel_bins = getattr(self.feature_extractor, "feature_size", None)
        if mel_bins is not None and mel_bins != getattr(self.model.config, "num_mel_bins", mel_bins):
            raise MMSpecError(f"the feature extractor makes {mel_bins} mel bins but the model reads {self.model.config.num_mel_bins}")
        return float(n_samples) / self.sampling_rate

    # --- transcription ------------------------------------------------------------------------

    def features(self, chunk: np.ndarray) -> torch.Tensor:
        """Log-mel features [1, mel bins, frames] of one chunk, by the model's own feature extractor, padded to the
        window as `feature_padding` says (`speech/features.py`)."""
        out = torch.from_numpy(log_mel_features(self.feature_extractor, chunk, self.feature_padding))
        return out.to(device=input_device(self.model), dtype=self.model.dtype)

    @torch.inference_mode()
    def __call__(
        self,
        audio: AudioSource | list[AudioSource],
        sampling_rate: int | list[int | None] | None = None,
        *,
        method: str | None = None,
        mode: str = "strict",
        language: str | None = None,
        task: str | None = None,
        max_new_tokens: int | None = None,
        silence_threshold: float | None = SILENCE_THRESHOLD,
        progress_bar: bool = True,
        callback_on_round: RoundCallback | None = None,
        batch_size: int = 1,
        pack_seconds: float | None = None,
        compile: bool = False,
        condition_on_previous_text: bool = False,
        timestamps: bool | None = False,
    ) -> TranscriptionOutput | list[TranscriptionOutput]:
        """Transcribe `audio`: a file path, an array (or tensor) of samples with its `sampling_rate`, or a
        `{"array": samples, "sampling_rate": rate}` dict (as `datasets` gives audio); or a list of them
        (`sampling_rate`: one for all, or one per item), which gives a list of outputs, one per item, in order.

        Args:
            method: `hybrid` or `ar` (default: `hybrid` if a fast decoder is loaded).
            mode: `strict` (identical to greedy `generate`) or `relaxed` (hybrid only).
            language, task: as in Whisper's `generate` (None: the generation config's, or detected).
            max_new_tokens: per chunk (default: as many as the decoder's positions allow).
            silence_threshold: RMS below which audio counts as a pause and is not decoded (None: decode it all).
            progress_bar: show a progress bar over chunks (for a list: over items; see also `set_progress_bar_config`).
            callback_on_round: `fn(round_index, info)` after every decoder pass that commits tokens;
                `info` is a `RoundInfo` (token ids committed, drafted, accepted, tokens so far, `chunk`).
                Not with `batch_size` > 1.
            batch_size: for a list, items decoded together: their windows go through the decoder in batches
                of up to `batch_size` rows. 1 (default): one item after another, every method. Larger: the
                method's drafter must decode batches (`ar`; `hybrid` where its fast decoder's drafter does, as the
                CTC one's: see `batching_methods()`; otherwise one line refuses it); each transcript equals the
                recording's alone.
            pack_seconds: neighbouring speech regions are read together in one window of up to this much audio
                (None: the model's window, 30 s for Whisper; 0: one region per window, shorter subtitle cues).
            compile: the static-shape compiled path (`speculative_generate(compile=True)`, `speech/static_target.py`):
                static decoder caches, fixed-width decoder steps compiled on the first call (slow), the same
                transcripts. One recording at a time (batch_size 1).
            condition_on_previous_text: each window's decoder prompt starts with the text decoded so far
                (`<|startofprev|>`, at most the last `PREVIOUS_TEXT_TOKENS` tokens, then the usual prompt), as
                openai-whisper's and faster-whisper's long-form transcription do; the windows are then decoded in
                order, one at a time. A window whose transcript looks like a loop is not passed on. Exact methods
                stay exact: each window's tokens are greedy decoding of that window given that prompt.
            timestamps: decode with Whisper's timestamp tokens, as `generate(return_timestamps=True)` (the prompt
                without `<|notimestamps|>`, the timestamp rules; `WhisperTarget(timestamps=True)`); the text leaves the
                timestamps out. Exact methods stay exact: each window's tokens are greedy decoding with timestamps.
                Small models drop fewer sentences of a long packed window this way. Not with `compile`. None: with
                timestamps when the recording has more than one window (`mmspec transcribe`'s default), so a clip of
                one window decodes as without them; a list decoded in batches (`batch_size` > 1) and `compile` take
                None as False.
        """
        started = time.perf_counter()
        batch_size = check_batch_size(batch_size)
        if mode not in MODES:
            raise MMSpecError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        method = self.check_method(method)  # fail on an unavailable method before decoding any audio
        if method == "ar" and mode != "strict":
            raise MMSpecError("mode 'relaxed' applies to hybrid decoding only; method 'ar' is plain greedy decoding")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise MMSpecError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if compile and batch_size > 1:
            raise MMSpecError(f"batch_size={batch_size}: compile=True transcribes one recording at a time; use batch_size=1")
        if compile:
            from .static_target import refuse_unsupported

            refuse_unsupported(self.model)  # before any audio is read
        check_language_and_task(self.model, language, task)
        if timestamps is not None and not isinstance(timestamps, bool):
            raise MMSpecError(f"timestamps must be True, False or None (with timestamps from the second window), "
                              f"got {timestamps!r}")
        if timestamps is None and (compile or batch_size > 1
                                   or getattr(self.model.generation_config, "no_timestamps_token_id", None) is None):
            timestamps = False  # None: only one recording at a time, uncompiled, on a model that has timestamp tokens
        if timestamps and compile:
            raise MMSpecError("timestamps=True: the compiled path decodes without timestamps; use compile=False")
        if timestamps:
            WhisperTarget(self.model, timestamps=True)  # a model without <|notimestamps|> is refused before decoding
        if not isinstance(condition_on_previous_text, bool):
            raise MMSpecError(f"condition_on_previous_text must be True or False, got {condition_on_previous_text!r}")
        if condition_on_previous_text and self.previous_text_token() is None:
            raise MMSpecError("condition_on_previous_text needs the model's <|startofprev|> token (generation config "
                              "prev_sot_token_id), which this model does not name")
        settings = dict(method=method, mode=mode, language=language, task=task, max_new_tokens=max_new_tokens,
                        silence_threshold=silence_threshold, pack_seconds=self._pack_seconds(pack_seconds),
                        condition=condition_on_previous_text, timestamps=timestamps)
        items = listed_audio(audio)
        if items is None:
            if isinstance(sampling_rate, (list, tuple)):
                raise MMSpecError("sampling_rate is a list, but one audio was given: pass a list of audio, or one rate")
            reporter = self.round_reporter(callback_on_round)
            return self._transcribe_one(audio, sampling_rate, reporter, progress_bar, started, compile=compile, **settings)
        rates = per_item(sampling_rate, len(items), "sampling_rate")
        if batch_size > 1:
            if condition_on_previous_text:
                raise MMSpecError(f"batch_size={batch_size}: condition_on_previous_text decodes each recording's windows "
                                  "in order; use batch_size=1")
            if callback_on_round is not None:
                raise MMSpecError(f"batch_size={batch_size}: callback_on_round follows one sequence; use batch_size=1")
            self.check_batches(method, batch_size)
        label = f"hybrid-{mode}" if method == "hybrid" else "ar"
        outputs: list[TranscriptionOutput] = []
        with self.progress_bar(total=len(items), desc=f"transcribe ({label})", unit="file", enabled=progress_bar) as bar:
            for group in groups(list(range(len(items))), batch_size):
                if batch_size == 1:
                    reporter = self.round_reporter(callback_on_round)
                    outputs.append(self._transcribe_one(items[group[0]], rates[group[0]], reporter, False,
                                                        time.perf_counter(), compile=compile, **settings))
                else:
                    outputs.extend(self._transcribe_batch([items[i] for i in group], [rates[i] for i in group],
                                                          batch_size, **settings))
                bar.update(len(group))
        return outputs

    def check_batches(self, method: str | None, batch_size: int) -> None:
        """One clear error when `method` (default: `default_method`) cannot transcribe `batch_size` items at a time."""
        method = self.check_method(method)
        check_batching(WhisperTarget(self.model), self._batch_drafter(method), method, check_batch_size(batch_size),
                       self.batching_methods())

    def _batch_drafter(self, method: str) -> Drafter:
        """The drafter for a batch: an AR fast decoder's re-drafting follows one recording's transcript, so in a
        batch it drafts whole hypotheses instead (the same output; its own setting applies one item at a time)."""
        if method == "hybrid" and isinstance(self.fast_decoder, ARFastDecoder):
            return hybrid_drafter_for(self.fast_decoder, redraft=False)
        return self.make_drafter(method)

    def batching_methods(self) -> list[str]:
        """The available methods that decode a list `batch_size` > 1 at a time."""
        target = WhisperTarget(self.model)
        return [m for m in self.available_methods if batching_refusal(target, self._batch_drafter(m), m) is None]

    def _pack_seconds(self, pack_seconds: float | None) -> float:
        """The packing limit in seconds: None is the whole window; 0 packs nothing; more than the window is refused."""
        if pack_seconds is None:
            return self.chunk_seconds
        if isinstance(pack_seconds, bool) or not isinstance(pack_seconds, (int, float)) \
                or not 0 <= pack_seconds <= self.chunk_seconds:
            raise MMSpecError(f"pack_seconds must be a number from 0 to the model's window ({self.chunk_seconds:g} s), "
                              f"got {pack_seconds!r}")
        return float(pack_seconds)

    def _windows(self, audio: AudioSource, sampling_rate: int | None, silence_threshold: float | None,
                 pack_seconds: float | None = None) -> tuple[np.ndarray, list[Window]]:
        """The audio's samples at the model's rate and the windows to decode (none for silence), regions packed into
        windows of up to `pack_seconds` (None: the whole window)."""
        samples = load_audio(audio, self.sampling_rate, source_sampling_rate=sampling_rate)
        check_duration(samples, self.sampling_rate, f"audio {str(audio)!r}" if isinstance(audio, (str, Path)) else "the audio")
        window = int(round(self.chunk_seconds * self.sampling_rate))
        threshold = silence_threshold if silence_threshold is not None else 0.0
        regions = speech_regions(samples, self.sampling_rate, threshold, max_region_s=self.chunk_seconds / 2) \
            if silence_threshold is not None else [(0, samples.shape[0])]
        windows = plan_windows(regions, window, int(round(window * STRIDE_FRACTION)))
        pack = int(round(self._pack_seconds(pack_seconds) * self.sampling_rate))
        return samples, pack_windows(windows, min(pack, window))

    def _output(self, windows: list[Window], chunks: list[ChunkTranscript], method: str, mode: str, label: str,
                silence_threshold: float | None, started: float, note: str | None = None) -> TranscriptionOutput:
        stats = SpecStats(method=label)
        for chunk in chunks:
            stats = stats + chunk.stats
        segments = self._segments(windows, chunks)
        text = " ".join(s.text for s in segments if s.text)
        if not windows:
            note = f"the audio is silent (RMS below {silence_threshold}): nothing to transcribe"
        return TranscriptionOutput(
            text=text, method=method, mode=mode, model=self.model_name, stats=stats,
            decoder_passes=sum(c.decoder_passes for c in chunks), chunks=chunks, segments=segments,
            total_time_s=time.perf_counter() - started, note=note, encoder_time_s=sum(c.encoder_time_s for c in chunks),
            compute_type=self.compute_type,
        )

    def _transcribe_one(self, audio: AudioSource, sampling_rate: int | None, reporter: RoundReporter, progress_bar: bool,
                        started: float, *, method: str, mode: str, language: str | None, task: str | None,
                        max_new_tokens: int | None, silence_threshold: float | None,
                        pack_seconds: float, compile: bool = False, condition: bool = False,
                        timestamps: bool | None = False) -> TranscriptionOutput:
        samples, windows = self._windows(audio, sampling_rate, silence_threshold, pack_seconds)
        if timestamps is None:  # with timestamps from the second window: a one-window clip decodes as without them
            timestamps = len(windows) > 1
        note = None
        if self.greedy_in_batches_instead(method, mode, timestamps, len(windows), condition or compile, reporter):
            method, note = "ar", (f"hybrid strict: its fast decoder drafts one window at a time, so the {len(windows)} "
                                  "windows were decoded as batched greedy (the tokens hybrid strict verifies to)")
        label = f"hybrid-{mode}" if method == "hybrid" else "ar"
        chunks: list[ChunkTranscript] = []
        rate = self.sampling_rate
        rows = 1 if condition or compile else self.window_batch_size(method, reporter)  # the compiled path decodes one row
        previous: list[int] | None = [] if condition else None  # the text tokens decoded so far, when conditioning
        with self.progress_bar(total=len(windows), desc=f"transcribe ({label})", unit="chunk", enabled=progress_bar) as bar:
            step = check_batch_size(self.encoder_batch_size)
            if rows > 1:  # each decoder batch encoded `step` windows at a time: the two batch sizes are independent
                for first in range(0, len(windows), rows):
                    group = windows[first:first + rows]
                    encoded = [self.encode([w.samples(samples) for w in group[part:part + step]])
                               for part in range(0, len(group), step)]
                    states = torch.cat([part_states for part_states, _ in encoded])
                    chunks.extend(self._decode_windows(states, group, sum(seconds for _, seconds in encoded), method, mode,
                                                       label, language, task, max_new_tokens, timestamps))
                    bar.update(len(group))
                windows, chunks = self._unpack_looped(samples, windows, chunks, method, mode, label, language, task,
                                                      max_new_tokens, reporter, compile=compile, timestamps=timestamps)
                return self._output(windows, chunks, method, mode, label, silence_threshold, started, note)
            for first in range(0, len(windows), step):
                group = windows[first:first + step]
                states, encoder_time = self.encode([w.samples(samples) for w in group])
                for offset, planned in enumerate(group):
                    reporter.chunk = first + offset
                    chunks.append(self._transcribe_chunk(
                        BaseModelOutput(last_hidden_state=states[offset:offset + 1]), encoder_time / len(group),
                        planned.start / rate, planned.end / rate, method, mode, label, language, task, max_new_tokens,
                        reporter, previous, compile=compile, timestamps=timestamps))
                    if previous is not None:
                        previous = self._passed_on(previous, chunks[-1])
                    bar.update(1)
        windows, chunks = self._unpack_looped(samples, windows, chunks, method, mode, label, language, task, max_new_tokens,
                                              reporter, compile=compile, timestamps=timestamps)
        return self._output(windows, chunks, method, mode, label, silence_threshold, started, note)

    def _unpack_looped(self, samples: np.ndarray, windows: list[Window], chunks: list[ChunkTranscript], method: str,
                       mode: str, label: str, language: str | None, task: str | None, max_new_tokens: int | None,
                       reporter: RoundReporter | None, compile: bool = False,
                       timestamps: bool = False) -> tuple[list[Window], list[ChunkTranscript]]:
        """Each packed window whose transcript looks like a decoding loop (`looks_looped`) read again region by region,
        each region encoded and decoded as a window of its own; other windows as they were."""
        eos = self.model.generation_config.eos_token_id
        ends = set(eos if isinstance(eos, (list, tuple)) else [eos])
        kept_windows: list[Window] = []
        kept_chunks: list[ChunkTranscript] = []
        rate = self.sampling_rate
        for window, chunk in zip(windows, chunks):
            if not window.pieces or not looks_looped(chunk.text, bool(chunk.tokens) and chunk.tokens[-1] in ends):
                kept_windows.append(window)
                kept_chunks.append(chunk)
                continue
            parts = window.unpacked()
            states, encoder_time = self.encode([part.samples(samples) for part in parts])
            for offset, part in enumerate(parts):
                if reporter is not None:
                    reporter.chunk = len(kept_chunks)
                kept_windows.append(part)
                kept_chunks.append(self._transcribe_chunk(
                    BaseModelOutput(last_hidden_state=states[offset:offset + 1]), encoder_time / len(parts),
                    part.start / rate, part.end / rate, method, mode, label, language, task, max_new_tokens, reporter,
                    compile=compile, timestamps=timestamps))
        return kept_windows, kept_chunks

    def encode(self, pieces: list[np.ndarray]) -> tuple[torch.Tensor, float]:
        """The encoder's states [len(pieces), frames, width] for windows of audio, in one forward, and its time."""
        inputs: dict[str, Any] = {"input_features": torch.cat([self.features(piece) for piece in pieces])}
        encoding = time.perf_counter()
        states = encoder_outputs_of(self.model, inputs)[0]  # last_hidden_state
        return states, time.perf_counter() - encoding

    def greedy_in_batches_instead(self, method: str, mode: str, timestamps: bool, windows: int, one_row: bool,
                                  reporter: RoundReporter | None) -> bool:
        """Whether a hybrid strict call decodes its windows as batched greedy instead: with timestamps, more than one
        window, and a fast decoder that drafts one window at a time (an AR fast decoder that re-drafts) while greedy
        decodes them in batches. Hybrid strict's tokens are greedy's by definition, so the output is the same; on long
        audio with timestamps drafting and verifying one window at a time cost more than greedy's batches (whisper-tiny.en,
        a 10-minute file)."""
        if method != "hybrid" or mode != "strict" or not timestamps or windows < 2 or one_row:
            return False
        return self.window_batch_size(method, reporter) == 1 and self.window_batch_size("ar", reporter) > 1

    def window_batch_size(self, method: str, reporter: RoundReporter | None = None) -> int:
        """Windows of one recording decoded together (`decoder_batch_size`): 1 when a round callback follows one
        sequence, when the method's drafter does not decode batches, or when it is an AR fast decoder that re-drafts:
        in a batch it drafts whole hypotheses only (`_batch_drafter`), which costs more verification passes than
        batching saves (whisper-tiny.en, 10 minutes of held-out clips: 3.4x the passes, 2.9x the CPU time)."""
        rows = check_batch_size(self.decoder_batch_size)
        if rows == 1 or (reporter is not None and reporter.callback is not None):
            return 1
        if method == "hybrid" and isinstance(self.fast_decoder, ARFastDecoder) \
                and getattr(self.fast_decoder.config, "draft_redraft", False):
            return 1
        if batching_refusal(WhisperTarget(self.model), self._batch_drafter(method), method) is not None:
            return 1
        return rows

    def text_tokens(self, tokens: list[int]) -> list[int]:
        """`tokens` without the special ones and without timestamp tokens (`<|0.00|>` and after, where the tokenizer
        has them), as the tokenizer's `decode` leaves them out of the text."""
        special = set(self.tokenizer.all_special_ids)
        first = self.tokenizer.convert_tokens_to_ids("<|0.00|>")
        first_timestamp = first if isinstance(first, int) and first != self.tokenizer.unk_token_id else None
        return [t for t in tokens if t not in special and (first_timestamp is None or t < first_timestamp)]

    def text_of(self, tokens: list[int]) -> str:
        """The text of decoded tokens: special and timestamp tokens left out."""
        return self.tokenizer.decode(self.text_tokens(tokens), skip_special_tokens=True).strip()

    def previous_text_token(self) -> int | None:
        """The model's `<|startofprev|>` id (None: it names none)."""
        token = getattr(self.model.generation_config, "prev_sot_token_id", None)
        return int(token) if token is not None else None

    def previous_text_prompt(self, previous: list[int], device: torch.device) -> torch.LongTensor:
        """`<|startofprev|>` and the last `PREVIOUS_TEXT_TOKENS` text tokens decoded so far [1, n]."""
        tokens = [self.previous_text_token(), *previous[-PREVIOUS_TEXT_TOKENS:]]
        return torch.tensor([tokens], dtype=torch.long, device=device)

    def _passed_on(self, previous: list[int], chunk: ChunkTranscript) -> list[int]:
        """The text tokens the next window is conditioned on: these and the chunk's, or none after a chunk that looks
        like a loop (a loop passed on tends to be repeated)."""
        eos = self.model.generation_config.eos_token_id
        ends = set(eos if isinstance(eos, (list, tuple)) else [eos])
        if looks_looped(chunk.text, bool(chunk.tokens) and chunk.tokens[-1] in ends):
            return []
        return (previous + self.text_tokens(chunk.tokens))[-PREVIOUS_TEXT_TOKENS:]

    def _decode_windows(self, states: torch.Tensor, windows: list[Window], encoder_time: float, method: str, mode: str,
                        label: str, language: str | None, task: str | None,
                        max_new_tokens: int | None, timestamps: bool = False) -> list[ChunkTranscript]:
        """Windows whose encoder states are `states` [len(windows), frames, width], decoded as one batch (rows with
        decoder prompts of one length together; rows leave the batch when they end). Each row's tokens are those of
        its window decoded alone (`BatchRounds`): greedy decoding of that window's encoder states."""
        target = WhisperTarget(self.model, language=language, task=task, timestamps=timestamps)
        passes = 0

        def count(*_: Any) -> None:
            nonlocal passes
            passes += 1

        prompts, detections = [], []
        hook = self.model.get_decoder().register_forward_hook(count)
        try:
            for row in range(len(windows)):
                before = passes
                prompts.append(target.prompt_ids({"encoder_outputs": BaseModelOutput(last_hidden_state=states[row:row + 1])}))
                detections.append(passes - before)
        finally:
            hook.remove()
        wanted = max_new_tokens or target.max_target_positions or FALLBACK_MAX_NEW_TOKENS
        decoded: dict[int, ChunkTranscript] = {}
        rate = self.sampling_rate
        for length in sorted({prompt.shape[1] for prompt in prompts}):
            same = [row for row, prompt in enumerate(prompts) if prompt.shape[1] == length]
            decoder = SpeculativeDecoder(
                WhisperTarget(self.model, language=language, task=task, timestamps=timestamps), self._batch_drafter(method),
                policy=hybrid_policy(self.draft_length(method)),
                rule=hybrid_rule(mode, self.relaxed_top_r, self.relaxed_margin), method=label)
            out = decoder.generate(None, max_new_tokens=target.max_new_tokens_for(length, wanted),
                                   decoder_input_ids=torch.cat([prompts[row] for row in same]),
                                   encoder_outputs=BaseModelOutput(last_hidden_state=states[same]))
            row_stats = out.stats.rows if len(same) > 1 else [out.stats]
            for position, (row, stats) in enumerate(zip(same, row_stats)):
                for name in ("prefill_time", "draft_time", "verify_time", "total_time"):  # each row holds the batch's:
                    setattr(stats, name, getattr(stats, name) / len(same))  # a share, so the chunks sum to it
                tokens = out.sequences[position, length:length + stats.new_tokens].tolist()
                window = windows[row]
                text = self.text_of(tokens)
                decoded[row] = ChunkTranscript(window.start / rate, window.end / rate, text, tokens, stats,
                                               stats.target_forwards + detections[row], encoder_time / len(windows))
        return [decoded[row] for row in range(len(windows))]

    def _transcribe_batch(self, items: list[AudioSource], rates: list[int | None], batch_size: int, *, method: str,
                          mode: str, language: str | None, task: str | None, max_new_tokens: int | None,
                          silence_threshold: float | None, pack_seconds: float,
                          condition: bool = False, timestamps: bool = False) -> list[TranscriptionOutput]:
        """Several recordings at once: every window of every item, decoded `batch_size` windows per batch (windows
        whose decoder prompts have one length batch together). Each item's time is the whole batch's."""
        started = time.perf_counter()
        label = f"hybrid-{mode}" if method == "hybrid" else "ar"
        planned = [self._windows(audio, rate, silence_threshold, pack_seconds) for audio, rate in zip(items, rates)]
        target = WhisperTarget(self.model, language=language, task=task, timestamps=timestamps)
        passes = 0

        def count(*_: Any) -> None:
            nonlocal passes
            passes += 1

        rows = []  # (item, window index, features [1, mel, frames], decoder prompt [1, P], language-detection passes)
        hook = self.model.get_decoder().register_forward_hook(count)
        try:
            for item, (samples, windows) in enumerate(planned):
                for index, window in enumerate(windows):
                    features = self.features(window.samples(samples))
                    before = passes
                    prompt = target.prompt_ids({"input_features": features})  # may detect the language (a pass)
                    rows.append((item, index, features, prompt, passes - before))
        finally:
            hook.remove()
        decoded: dict[tuple[int, int], ChunkTranscript] = {}
        lengths = sorted({prompt.shape[1] for _, _, _, prompt, _ in rows})
        for length in lengths:
            same = [row for row in rows if row[3].shape[1] == length]
            for group in groups(same, batch_size):
                decoder = SpeculativeDecoder(
                    WhisperTarget(self.model, language=language, task=task, timestamps=timestamps), self._batch_drafter(method),
                    policy=hybrid_policy(self.draft_length(method)),
                    rule=hybrid_rule(mode, self.relaxed_top_r, self.relaxed_margin), method=label)
                wanted = max_new_tokens or target.max_target_positions or FALLBACK_MAX_NEW_TOKENS
                out = decoder.generate(None, max_new_tokens=target.max_new_tokens_for(length, wanted),
                                       decoder_input_ids=torch.cat([row[3] for row in group]),
                                       input_features=torch.cat([row[2] for row in group]))
                row_stats = out.stats.rows if len(group) > 1 else [out.stats]
                for position, ((item, index, _, _, detection), stats) in enumerate(zip(group, row_stats)):
                    tokens = out.sequences[position, length:length + stats.new_tokens].tolist()
                    window = planned[item][1][index]
                    text = self.text_of(tokens)
                    decoded[item, index] = ChunkTranscript(window.start / self.sampling_rate, window.end / self.sampling_rate,
                                                           text, tokens, stats, stats.target_forwards + detection)
        outputs = []
        for item, (samples, windows) in enumerate(planned):
            windows, chunks = self._unpack_looped(samples, windows, [decoded[item, index] for index in range(len(windows))],
                                                  method, mode, label, language, task, max_new_tokens, None,
                                                  timestamps=timestamps)
            outputs.append(self._output(windows, chunks, method, mode, label, silence_threshold, started))
        return outputs

    def _segments(self, windows: list[Window], chunks: list[ChunkTranscript]) -> list[Segment]:
        """One segment per window, its tokens stitched with the overlapping windows of the same speech region."""
        kept = [self.text_tokens(c.tokens) for c in chunks]
        skip = [0] * len(kept)
        for i in range(1, len(kept)):
            if windows[i].region == windows[i - 1].region:
                keep, skip[i] = stitch(kept[i - 1][skip[i - 1]:], kept[i])
                kept[i - 1] = kept[i - 1][: skip[i - 1] + keep]
        rate = self.sampling_rate
        return [Segment(w.owned_start / rate, w.owned_end / rate,
                        self.text_of(tokens[first:]))
                for w, tokens, first in zip(windows, kept, skip)]

    def _transcribe_chunk(
        self, encoder_outputs: BaseModelOutput, encoder_time: float, start_s: float, end_s: float, method: str, mode: str,
        label: str, language: str | None, task: str | None, max_new_tokens: int | None,
        reporter: RoundReporter | None = None, previous: list[int] | None = None, compile: bool = False,
        timestamps: bool = False,
    ) -> ChunkTranscript:
        target = WhisperTarget(self.model, language=language, task=task, timestamps=timestamps)
        decoder = SpeculativeDecoder(
            target, self.make_drafter(method), policy=hybrid_policy(self.draft_length(method)),
            rule=hybrid_rule(mode, self.relaxed_top_r, self.relaxed_margin), method=label, compile=compile,
        )
        passes = 0

        def count(*_: Any) -> None:
            nonlocal passes
            passes += 1

        hook = self.model.get_decoder().register_forward_hook(count)
        try:
            inputs: dict[str, Any] = {"encoder_outputs": encoder_outputs}  # encoded once (`encode`): the decoding reuses it
            prompt = target.prompt_ids(inputs)  # may detect the language (one decoder pass, counted)
            if previous:
                prompt = torch.cat([self.previous_text_prompt(previous, prompt.device), prompt], dim=1)
            wanted = max_new_tokens or target.max_target_positions or FALLBACK_MAX_NEW_TOKENS
            limit = target.max_new_tokens_for(prompt.shape[1], wanted)
            out = decoder.generate(None, max_new_tokens=limit, decoder_input_ids=prompt, on_round=reporter, **inputs)
        finally:
            hook.remove()
        passes += getattr(out.target, "compiled_forwards", 0)  # compiled steps run the decoder's forward without its hooks
        tokens = out.sequences[0, prompt.shape[1]:].tolist()
        text = self.text_of(tokens)
        return ChunkTranscript(start_s, end_s, text, tokens, out.stats, passes, encoder_time)


def listed_audio(audio: Any) -> list[Any] | None:
    """The items of a list of recordings (paths, arrays, tensors, dicts), or None for one recording."""
    if isinstance(audio, (list, tuple)) and audio and all(
            isinstance(item, (str, Path, dict, np.ndarray, torch.Tensor)) for item in audio):
        return list(audio)
    if isinstance(audio, (list, tuple)) and not audio:
        raise MMSpecError("the list of audio is empty")
    return None


def check_duration(samples: np.ndarray, sampling_rate: int, what: str = "the audio") -> None:
    seconds = samples.shape[0] / sampling_rate
    if seconds < MIN_AUDIO_S:
        raise MMSpecError(f"{what} lasts {seconds:.2f} s: too short to hold speech (at least {MIN_AUDIO_S} s)")


# --- loading ------------------------------------------------------------------------------------

def compute_type_for(compute_type: str | None, dtype: torch.dtype | None) -> str | None:
    """The compute type of a load asked for with `compute_type` and / or `dtype` (dtype=bfloat16 alone is compute type
    bfloat16; None: neither given, or another dtype such as float16); a contradiction is refused."""
    if compute_type is None:
        return "bfloat16" if dtype == torch.bfloat16 else None
    wanted = torch.bfloat16 if check_compute_type(compute_type) == "bfloat16" else torch.float32
    if dtype is not None and dtype != wanted:
        raise MMSpecError(f"compute_type {compute_type!r} runs the model in {str(wanted).removeprefix('torch.')}, "
                          f"but dtype {str(dtype).removeprefix('torch.')} was asked for: pass one of them")
    return compute_type


def default_fast_decoder_folder(model_folder: Path) -> Path | None:
    """The fast decoder a model folder uses by default: its zoo card's measured-fastest kind
    (`"default_fast_decoder": "ar"`), else the CTC one (the paper's default), else the AR one."""
    preferred = folder_card(model_folder).get("default_fast_decoder")
    order = ([preferred] if preferred in FAST_DECODER_FOLDERS else []) + list(FAST_DECODER_FOLDERS)
    return next((model_folder / FAST_DECODER_FOLDERS[k] for k in order if (model_folder / FAST_DECODER_FOLDERS[k]).is_dir()), None)


def load_whisper(name: str, path: str, dtype: torch.dtype = torch.float32, device: str | torch.device | None = "cpu",
                 **placement: Any) -> tuple[WhisperForConditionalGeneration, Any]:
    """A Whisper model and its processor from a resolved zoo folder, local folder (transformers or CTranslate2 /
    faster-whisper) or offline Hub id; `placement` (`device_map`, `max_memory`, `offload_folder`, see
    `mmspec.devices.load_options`) spreads a transformers checkpoint with accelerate, `device` unset."""
    if is_ct2_whisper_folder(path):
        if placement:
            raise MMSpecError(f"{name!r} is a CTranslate2 folder, read whole: device_map / max_memory / offload_folder "
                              "apply to transformers checkpoints; pass device= instead")
        model, processor = load_ct2_whisper(path, dtype=dtype, device=device or "cpu")
        model.config.name_or_path = name
        return model, processor
    try:
        config = AutoConfig.from_pretrained(path)
        if config.model_type != "whisper":
            raise MMSpecError(f"{name!r} is a {config.model_type!r} model, not a Whisper speech model")
        model = from_pretrained_complete(WhisperForConditionalGeneration, path, "ASR model", dtype=dtype, **placement)
        model = (model if placement else model.to(device or "cpu")).eval()
    except MMSpecError:
        raise
    except Exception as error:  # noqa: BLE001 - OSError, ValueError, safetensors errors: all "cannot load"
        raise cannot_load("ASR model", name, "Whisper checkpoint", first_line(error)) from None
    try:
        processor = AutoProcessor.from_pretrained(path)
    except Exception as error:  # noqa: BLE001 - any failure here means the folder lacks a processor
        raise MMSpecError(f"could not load the processor of {name!r} (feature extractor + tokenizer): {first_line(error)}") from None
    return model, processor


def place_fast_decoder(fast_decoder: FastDecoder, device: str | torch.device | None,
                       model: PreTrainedModel) -> FastDecoder:
    """The fast decoder on `device` (None: the model's input device), where the encoder states it reads are moved
    (`place_drafter`). An AR fast decoder sharing the model's embedding and head stays with the model."""
    if isinstance(fast_decoder, ARFastDecoder) and fast_decoder.shares_target_embeddings and device is not None \
            and as_device(device, "drafter_device") != input_device(model):
        raise MMSpecError("this AR fast decoder shares the model's token embedding and output head: it runs on the model's "
                          "first device; leave drafter_device unset (or use a CTC fast decoder)")
    if isinstance(fast_decoder, ARFastDecoder) and fast_decoder.shares_target_decoder:
        return attach_ar_fast_decoder(fast_decoder, model)  # the model's own modules: already placed
    return place_drafter(fast_decoder, device, model)


def _loaded_fast_decoder(fast_decoder: str | os.PathLike | FastDecoder) -> FastDecoder:
    return fast_decoder if isinstance(fast_decoder, (CTCFastDecoder, ARFastDecoder)) else load_fast_decoder(fast_decoder)


def load_fast_decoder(path: str | os.PathLike) -> FastDecoder:
    """A saved fast decoder of either kind; the kind is read from the folder's config.json."""
    try:
        config = AutoConfig.from_pretrained(str(path))
        if WhisperFeatureDrafterModel.__name__ in (getattr(config, "architectures", None) or []):
            raise MMSpecError(NOT_A_FAST_DECODER)
        if config.model_type == "whisper" and not getattr(config, "is_encoder_decoder", True):
            return ARFastDecoder.from_pretrained(str(path)).eval()
        if config.model_type == "whisper":
            raise MMSpecError(f"{str(path)!r} holds a full Whisper model, not a fast decoder")
        return CTCFastDecoder.from_pretrained(str(path)).eval()
    except MMSpecError as error:
        raise MMSpecError(f"cannot load the fast decoder {str(path)!r}: {error}") from None
    except Exception as error:  # noqa: BLE001 - any failure means "not a fast decoder folder"
        raise MMSpecError(f"cannot load the fast decoder {str(path)!r}: {first_line(error)}") from None


def check_fast_decoder(fast_decoder: CTCFastDecoder, model: PreTrainedModel) -> None:
    """One clear error when a fast decoder was not built for this model's encoder and vocabulary."""
    config = fast_decoder.config
    vocab = model_vocab_size(model)
    if config.vocab_size != vocab:
        raise MMSpecError(f"the fast decoder predicts {config.vocab_size} tokens but the model has {vocab}: "
                          "it was trained for another model")
    width = getattr(model.config, "d_model", None)
    if width is not None and config.encoder_hidden_size != width:
        raise MMSpecError(f"the fast decoder reads {config.encoder_hidden_size}-wide encoder states, the model's are {width}")
    frames = getattr(model.config, "max_source_positions", None)
    if frames is not None and frames * config.upsample > config.max_positions:
        raise MMSpecError(f"the fast decoder reads at most {config.max_positions} frames, the encoder gives "
                          f"{frames} x upsample {config.upsample}")
