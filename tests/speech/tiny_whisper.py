"""A tiny random `WhisperForConditionalGeneration` with Whisper's special-token conventions.

Vocabulary of 128: ordinary "text" tokens 0..117, then the specials laid out like Whisper's
(end-of-text, start-of-transcript, two languages, translate/transcribe, no-timestamps).
Its generation config carries what real checkpoints carry: language and task tables, a legacy
`forced_decoder_ids` entry asking for language detection, `suppress_tokens` and
`begin_suppress_tokens` (end-of-text and a "blank" text token), so the tests exercise the same
forced prompt and suppression path real checkpoints take.
"""

from __future__ import annotations

import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

from mmspec.testing import reload_from_disk

VOCAB = 128
EOT = 118          # <|endoftext|> (eos = pad = bos, as in Whisper)
SOT = 119          # <|startoftranscript|>
LANG_EN, LANG_FR = 120, 121
TRANSLATE, TRANSCRIBE = 122, 123
NO_TIMESTAMPS = 124
PREV = 125         # <|startofprev|>
BLANK = 7          # plays Whisper's " " (id 220): suppressed at the first position only
SUPPRESSED = [1, 2, 3, PREV]
NUM_MEL_BINS = 16
NUM_FRAMES = 64    # 2 x max_source_positions (the encoder's two convolutions halve the frames)
MAX_TARGET_POSITIONS = 64


def tiny_whisper(seed: int = 0, decoder_layers: int = 2, eos: int = EOT, init_std: float = 0.5,
                 suppress: bool = True, eos_scale: float = 1.5) -> WhisperForConditionalGeneration:
    """A random tiny Whisper, saved and loaded back (the `from_pretrained` path)."""
    torch.manual_seed(seed)
    config = WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=NUM_MEL_BINS,
        d_model=48,
        encoder_layers=1,
        decoder_layers=decoder_layers,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
        max_source_positions=NUM_FRAMES // 2,
        max_target_positions=MAX_TARGET_POSITIONS,
        decoder_start_token_id=SOT,
        pad_token_id=eos,
        bos_token_id=eos,
        eos_token_id=eos,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        init_std=init_std,
    )
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        # pad = eos zeroes the eos embedding row at init (padding_idx), so a random model would never
        # end; give it a random row (the LM head is tied) so transcripts end at varied lengths.
        embeddings = model.get_input_embeddings().weight
        embeddings[eos] = torch.randn(embeddings.shape[1]) * init_std * eos_scale
    generation = model.generation_config
    # A generation config marked as derived from the model config is rebuilt from it on loading
    # (dropping the Whisper tables); real checkpoints ship a standalone generation_config.json.
    generation._from_model_config = False
    generation.decoder_start_token_id = SOT
    generation.eos_token_id = eos
    generation.pad_token_id = eos
    generation.bos_token_id = eos
    generation.no_timestamps_token_id = NO_TIMESTAMPS
    generation.prev_sot_token_id = PREV
    generation.lang_to_id = {"<|en|>": LANG_EN, "<|fr|>": LANG_FR}
    generation.task_to_id = {"translate": TRANSLATE, "transcribe": TRANSCRIBE}
    generation.is_multilingual = True
    generation.forced_decoder_ids = [[1, None], [2, TRANSCRIBE]]
    generation.return_timestamps = False
    generation.max_length = MAX_TARGET_POSITIONS
    if suppress:
        generation.suppress_tokens = list(SUPPRESSED)
        generation.begin_suppress_tokens = [BLANK, eos]
    return reload_from_disk(model)


def features(seed: int, batch: int = 1) -> torch.Tensor:
    """Random log-mel-like input features [batch, mel bins, frames]."""
    return torch.randn(batch, NUM_MEL_BINS, NUM_FRAMES, generator=torch.Generator().manual_seed(seed))
