"""`transcribe --language` on an English-only Whisper, refused before torch is imported: whether the model is
English-only is read from its files (a CTranslate2 folder's vocabulary size, a transformers folder's
generation_config.json), as the loader reads it. The loaded model's own check still runs; this one only makes the
common refusal fast. What cannot be told without loading (a Hub id, an unreadable folder) is left to the loader."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MMSpecError


def check_language(model: str | None, language: str | None) -> None:
    """MMSpecError (the loaded model's message) if `model` (None: the default) is English-only and `language` is not
    English; None when it may be fine or only loading can tell."""
    from ..speech.english_only import ENGLISH, english_only

    if language is None or language.lower() in ENGLISH:
        return
    if _english_only_model(model):
        english_only(language, None)


def _english_only_model(model: str | None) -> bool:
    from ..speech.ctranslate2 import CT2_MODEL_FILE, ENGLISH_ONLY_VOCAB, is_ct2_whisper_folder, read_ct2_checkpoint
    from ..speech.models import DEFAULT_ASR_MODEL, packaged_weights, zoo_entry

    name = model or DEFAULT_ASR_MODEL
    entry = zoo_entry(name)
    try:
        folder = packaged_weights(entry) if entry is not None and entry.card.get("weights_package") else Path(name).expanduser()
        if is_ct2_whisper_folder(folder):  # the loader's rule: a vocabulary of ENGLISH_ONLY_VOCAB tokens or fewer
            embeddings = read_ct2_checkpoint(folder / CT2_MODEL_FILE).variables.get("decoder/embeddings/weight")
            return embeddings is not None and embeddings.ndim == 2 and embeddings.shape[0] <= ENGLISH_ONLY_VOCAB
    except MMSpecError:  # the loader says what is wrong with it
        return False
    try:
        generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(generation, dict) and generation.get("is_multilingual") is False
