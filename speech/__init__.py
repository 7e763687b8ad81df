"""Speech: Whisper-style encoder-decoder ASR targets and hybrid decoding (fast CTC draft + verify).

    from mmspec.speech import WhisperTarget, CTCFastDecoder, hybrid_generate
    out = hybrid_generate(whisper, fast_decoder, input_features, mode="strict")
"""

from .audio import DEFAULT_SAMPLING_RATE, is_silent, load_audio, split_chunks
from .fast_decoder import CTCFastDecoder, CTCFastDecoderConfig, ctc_greedy_decode, train_fast_decoder
from .hybrid import HybridDrafter, align_hypothesis, hybrid_generate, hybrid_rule, relaxed_top_r_rule
from .target import WhisperTarget, whisper_logits_processors, whisper_prompt_ids

__all__ = [
    "CTCFastDecoder",
    "CTCFastDecoderConfig",
    "DEFAULT_SAMPLING_RATE",
    "HybridDrafter",
    "WhisperTarget",
    "align_hypothesis",
    "ctc_greedy_decode",
    "hybrid_generate",
    "hybrid_rule",
    "is_silent",
    "load_audio",
    "relaxed_top_r_rule",
    "split_chunks",
    "train_fast_decoder",
    "whisper_logits_processors",
    "whisper_prompt_ids",
]
