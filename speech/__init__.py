"""Speech: Whisper-style encoder-decoder ASR targets and hybrid decoding (fast draft + verify).

    from mmspec.speech import WhisperTarget, CTCFastDecoder, hybrid_generate
    out = hybrid_generate(whisper, fast_decoder, input_features, mode="strict")

CTranslate2 (faster-whisper) Whisper folders load without CTranslate2: `load_ct2_whisper(folder)`.

Compute types (`precision.py`): float32, bfloat16, int8 (`apply_compute_type(model, "int8")`, or
`TranscriptionPipeline.from_pretrained(..., compute_type="int8")`); hybrid strict equals greedy decoding of the
model at that compute type. faster-whisper runs beside mmspec in `mmspec bench speech` (`peers.py`, extra `peers`).

Fast decoders: `CTCFastDecoder` (non-autoregressive) or `ARFastDecoder` (a one-layer
`WhisperForCausalLM`, drafted through `ARHybridDrafter`); `train_from_folder` trains either.
`WhisperFeatureDrafter` drafts EAGLE-style from the model's own top-layer features
(`train_feature_drafter` trains its `WhisperFeatureDrafterModel`).
"""

import importlib
from typing import TYPE_CHECKING, Any

# Names are imported on first use (PEP 562): torch-free parts (audio, CTranslate2 folders, subtitles, clip
# folders) can be read, e.g. to refuse bad input, without importing torch and transformers.
_EXPORTS = {
    "AR_FAST_DECODER_FOLDER": "ar_fast_decoder", "ARFastDecoder": "ar_fast_decoder", "ARHybridDrafter": "ar_fast_decoder",
    "DEFAULT_SAMPLING_RATE": "audio", "is_silent": "audio", "load_audio": "audio", "split_chunks": "audio",
    "is_ct2_whisper_folder": "ctranslate2", "load_ct2_whisper": "ctranslate2", "read_ct2_checkpoint": "ctranslate2",
    "CTCFastDecoder": "fast_decoder", "CTCFastDecoderConfig": "fast_decoder", "ctc_greedy_decode": "fast_decoder",
    "WhisperFeatureDrafter": "feature_drafter", "WhisperFeatureDrafterModel": "feature_drafter",
    "load_feature_drafter": "feature_drafter",
    "HybridDrafter": "hybrid", "align_hypothesis": "hybrid", "hybrid_drafter_for": "hybrid", "hybrid_generate": "hybrid",
    "hybrid_rule": "hybrid", "relaxed_top_r_rule": "hybrid",
    "WhisperTarget": "target", "whisper_logits_processors": "target", "whisper_prompt_ids": "target",
    "read_clip_folder": "train_fast", "train_ar_fast_decoder": "train_fast", "train_ctc_fast_decoder": "train_fast",
    "train_from_folder": "train_fast",
    "train_feature_drafter": "train_feature",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from .ar_fast_decoder import AR_FAST_DECODER_FOLDER, ARFastDecoder, ARHybridDrafter
    from .audio import DEFAULT_SAMPLING_RATE, is_silent, load_audio, split_chunks
    from .ctranslate2 import is_ct2_whisper_folder, load_ct2_whisper, read_ct2_checkpoint
    from .fast_decoder import CTCFastDecoder, CTCFastDecoderConfig, ctc_greedy_decode
    from .feature_drafter import WhisperFeatureDrafter, WhisperFeatureDrafterModel, load_feature_drafter
    from .hybrid import (
        HybridDrafter,
        align_hypothesis,
        hybrid_drafter_for,
        hybrid_generate,
        hybrid_rule,
        relaxed_top_r_rule,
    )
    from .target import WhisperTarget, whisper_logits_processors, whisper_prompt_ids
    from .train_fast import read_clip_folder, train_ar_fast_decoder, train_ctc_fast_decoder, train_from_folder
    from .train_feature import train_feature_drafter

__all__ = [
    "AR_FAST_DECODER_FOLDER",
    "ARFastDecoder",
    "ARHybridDrafter",
    "CTCFastDecoder",
    "CTCFastDecoderConfig",
    "DEFAULT_SAMPLING_RATE",
    "HybridDrafter",
    "WhisperFeatureDrafter",
    "WhisperFeatureDrafterModel",
    "WhisperTarget",
    "align_hypothesis",
    "ctc_greedy_decode",
    "hybrid_drafter_for",
    "hybrid_generate",
    "hybrid_rule",
    "is_ct2_whisper_folder",
    "is_silent",
    "load_audio",
    "load_ct2_whisper",
    "load_feature_drafter",
    "read_clip_folder",
    "read_ct2_checkpoint",
    "relaxed_top_r_rule",
    "split_chunks",
    "train_ar_fast_decoder",
    "train_ctc_fast_decoder",
    "train_feature_drafter",
    "train_from_folder",
    "whisper_logits_processors",
    "whisper_prompt_ids",
]
