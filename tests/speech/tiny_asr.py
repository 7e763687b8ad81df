"""Folders for the train / bench tests: a tiny Whisper model folder (with fast decoders) and a clip folder.

The model folder follows the pipeline's convention: the Whisper checkpoint + processor, a random
`CTCFastDecoder` in `fast_decoder/`, an `ARFastDecoder` (initialised from the target) in
`ar_fast_decoder/`. The clip folder is the training / held-out format: `metadata.jsonl` with one
`{"file": ..., "text": ...}` per line and 16 kHz mono wav files (written with the stdlib `wave`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mmspec.speech import AR_FAST_DECODER_FOLDER, ARFastDecoder, CTCFastDecoder
from mmspec.speech.pipeline import FAST_DECODER_FOLDER

from .test_pipeline import speechy, tiny_processor, write_wav
from .tiny_whisper import tiny_whisper

TEXTS = ["a red circle", "two blue squares, again", "the the green triangle", "a small yellow star!"]


def make_asr_folder(folder: Path, *, ctc: bool = True, ar: bool = True, decoder_layers: int = 2) -> Path:
    whisper = tiny_whisper(decoder_layers=decoder_layers)
    # Ids above <|notimestamps|> are timestamps to transformers' Whisper generate, which splits the
    # segment and decodes again when a random model emits them: suppress them, as real models never
    # emit timestamps without being asked to.
    whisper.generation_config.suppress_tokens = sorted(set(whisper.generation_config.suppress_tokens) | {126, 127})
    whisper.save_pretrained(folder)
    tiny_processor().save_pretrained(folder)
    if ctc:
        torch.manual_seed(0)
        head = CTCFastDecoder.for_target(whisper, hidden_size=32, intermediate_size=64, num_attention_heads=4, upsample=2)
        head.head.bias.data[head.blank_id] = -5.0  # mostly non-blank frames: a long, mostly wrong draft
        head.save_pretrained(folder / FAST_DECODER_FOLDER)
    if ar:
        ARFastDecoder.for_target(whisper).save_pretrained(folder / AR_FAST_DECODER_FOLDER)
    return folder


def make_clip_folder(folder: Path, count: int = 4, seconds: float = 0.8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        name = f"clip_{i:05d}.wav"
        write_wav(folder / name, speechy(seconds, seed=i))
        lines.append(json.dumps({"file": name, "text": TEXTS[i % len(TEXTS)]}))
    (folder / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return folder
