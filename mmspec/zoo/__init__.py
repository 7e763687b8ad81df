"""The toy model zoo: small models trained here on the shapes world.

A zoo name (e.g. "shapes-video-captioner") resolves to its folder, which loads through the normal
`from_pretrained` path of its class. The folders are found in the installed zoo distributions first
(`mmspec-zoo-vision`, ...; see `distributions`), then in a source checkout's `mmspec/zoo/models` (an
editable install); a zoo name that neither has is one error naming the distribution to install. A
model that is a part of another (a card with `derived_from`, see `derived`) resolves to that part.
Each folder has a `zoo_card.json` that says what the model is, what it was trained on, how well it
does and how to rebuild it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MMSpecError
from .distributions import installed_model_dirs, not_installed

# The zoo of a source checkout; an installed mmspec wheel has none (its models come with the zoo distributions).
MODELS_DIR = Path(__file__).parent / "models"


@dataclass
class ZooEntry:
    name: str
    path: Path
    card: dict[str, Any] = field(default_factory=dict)

    @property
    def file_size_bytes(self) -> int:
        """Bytes on disk of every file in the folder, subfolders (drafters, fast decoders) included."""
        return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())

    def to_dict(self) -> dict[str, Any]:
        return {**self.card, "name": self.name, "path": str(self.path), "file_size_bytes": self.file_size_bytes}


def model_dirs() -> list[Path]:
    """Where zoo models are looked up, in order (the first folder with a name wins): the installed zoo
    distributions, then the source checkout's."""
    return [*installed_model_dirs(), MODELS_DIR]


def entries() -> list[ZooEntry]:
    """Every zoo model this install has, sorted by name."""
    found: dict[str, ZooEntry] = {}
    for models in model_dirs():
        for folder in sorted(models.iterdir()) if models.is_dir() else []:
            card_file = folder / "zoo_card.json"
            if card_file.is_file() and folder.name not in found:
                found[folder.name] = ZooEntry(name=folder.name, path=folder, card=read_card(card_file))
    return sorted(found.values(), key=lambda entry: entry.name)


def read_card(card_file: Path) -> dict[str, Any]:
    """A `zoo_card.json`: a JSON object, else one clear error naming the file."""
    try:
        card = json.loads(card_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MMSpecError(f"cannot read the model card {str(card_file)!r}: not valid JSON ({error})") from None
    if not isinstance(card, dict):
        raise MMSpecError(f"the model card {str(card_file)!r} must hold a JSON object, got a {type(card).__name__}")
    return card


def card_of(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """The zoo card of a zoo name or a model folder, else {} (a Hub id has none)."""
    for entry in entries():
        if entry.name == str(name_or_path):
            return entry.card
    return folder_card(name_or_path) if Path(name_or_path).expanduser().is_dir() else {}


def folder_card(folder: str | os.PathLike) -> dict[str, Any]:
    """The `zoo_card.json` of a model folder (a zoo model, or one rebuilt elsewhere), else {}."""
    card_file = Path(folder) / "zoo_card.json"
    return read_card(card_file) if card_file.is_file() else {}


def resolve(name_or_path: str | os.PathLike, role: str = "model") -> str:
    """A zoo name -> its packaged folder; a local folder -> itself; a Hub id -> itself, once it is known to be
    loadable without a long wait (in the local Hub cache, or the Hub answered within seconds; see `hub`).

    A zoo name never touches the network. A folder holding only pickle checkpoints is refused: mmspec
    loads safetensors only (unpickling can run code).
    """
    from . import hub

    text = str(name_or_path)
    found = entries()
    for entry in found:
        if entry.name == text and "derived_from" in entry.card:
            return str(derived_path(entry, found))
        if entry.name == text:
            pattern = "*/*.safetensors" if (entry.path / "model_index.json").is_file() else "*.safetensors"
            if not any(entry.path.glob(pattern)):  # a saved pipeline keeps its weights in its components' folders
                raise MMSpecError(f"zoo model {text!r} has no weights in {entry.path}; rebuild it: {entry.card.get('rebuild_command')}")
            return str(entry.path)
    path = Path(text).expanduser()
    if path.is_dir():
        card = folder_card(path)
        if "derived_from" in card:  # a derived model rebuilt outside the package (e.g. a recipe's --out)
            return str(derived_path(ZooEntry(name=path.name, path=path, card=card), found))
        hub.refuse_pickle_only(path, role)
        return text
    missing = not_installed(text, role)
    if missing is not None:
        raise missing
    hub.check_hub_id(text, role, f"not a zoo model (known: {known_names()})")
    return text


def check(name_or_path: str | os.PathLike, role: str = "model") -> Path | None:
    """What `resolve` refuses, found without torch, without building a derived model and without asking the
    network: a card that is not JSON or names paths outside its folder, a derived model whose parent or part is
    missing, a pickle-only folder, a path that is not there, an id that is no zoo model and not in the Hub cache
    offline. Returns the local folder the name stands for (a zoo model's own, for a derived one the folder
    holding its card), else None (a Hub id)."""
    from . import hub

    text = str(name_or_path)
    found = entries()
    for entry in found:
        if entry.name == text:
            if "derived_from" in entry.card:
                check_derived(entry, found)
            return entry.path
    path = Path(text).expanduser()
    if path.is_dir():
        card = folder_card(path)
        if "derived_from" in card:
            check_derived(ZooEntry(name=path.name, path=path, card=card), found)
        else:
            hub.refuse_pickle_only(path, role)
        return path
    missing = not_installed(text, role)
    if missing is not None:
        raise missing
    hub.check_hub_id(text, role, f"not a zoo model (known: {known_names()})", ask=False)
    return None


def check_derived(entry: ZooEntry, found: list[ZooEntry]) -> None:
    """`derived_path`'s refusals, without building the model."""
    from .derived import check_spec

    check_spec(entry.name, entry.path, entry.card["derived_from"], parent_of(entry, found))


def parent_of(entry: ZooEntry, found: list[ZooEntry]) -> Path:
    """The folder of the zoo model a derived entry comes from (its card's `derived_from.model`)."""
    spec = entry.card["derived_from"]
    parent = next((e for e in found if isinstance(spec, dict) and e.name == spec.get("model")), None)
    if parent is None:
        raise MMSpecError(f"zoo model {entry.name!r} is derived from {spec!r}, which is not in the zoo")
    return parent.path


def derived_path(entry: ZooEntry, found: list[ZooEntry]) -> Path:
    """The folder of a zoo model that is a part of another one (its card's `derived_from`; see `derived`)."""
    from .derived import derived_folder

    return derived_folder(entry.name, entry.path, entry.card["derived_from"], parent_of(entry, found))


def known_names() -> str:
    """The zoo's model names, comma-separated ("none" for an empty zoo)."""
    return ", ".join(e.name for e in entries()) or "none"


def cannot_load(role: str, name: str, checkpoint: str, reason: str) -> MMSpecError:
    """The one-line error for a name that is no zoo model, no folder with a `checkpoint` and no Hub id available
    offline; `reason` says what loading raised."""
    return MMSpecError(f"cannot load the {role} {name!r}: not a zoo model (known: {known_names()}), not a folder with a "
                       f"{checkpoint}, and not a Hub id available offline ({reason})")


def saved_kind(folder: str | os.PathLike) -> str | None:
    """What a local model folder holds, by its config (architecture or model type) or pipeline index (class), if
    it says."""
    for index, keys in (("config.json", ("architectures", "model_type")), ("model_index.json", ("_class_name",))):
        try:
            saved = json.loads((Path(folder) / index).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        for key in keys:
            value = saved.get(key) if isinstance(saved, dict) else None
            if isinstance(value, list) and value:
                value = value[0]
            if isinstance(value, str) and value:
                return value
    return None


def load_causal_lm(name_or_path: str | os.PathLike, role: str = "model"):
    """Load a causal LM (and its tokenizer) from a zoo name, a local folder or a cached Hub id, in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..loading import from_pretrained_complete

    path = resolve(name_or_path, role)
    try:
        model = from_pretrained_complete(AutoModelForCausalLM, path, role, dtype=torch.float32).eval()
    except MMSpecError:
        raise
    except (OSError, ValueError) as error:
        kind = saved_kind(path) if isinstance(error, ValueError) else None
        if kind is not None and "CausalLM" not in kind:  # a model of another kind (transformers: no causal-LM class)
            task = card_of(name_or_path).get("task")
            raise MMSpecError(f"the {role} {str(name_or_path)!r} is a {kind}{f' ({task})' if task else ''}, not a causal "
                              f"language model; text needs one (the zoo's text pair: shapes-caption-lm + "
                              f"shapes-caption-drafter)") from None
        raise cannot_load(role, str(name_or_path), "checkpoint", type(error).__name__) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        tokenizer = None
    return model, tokenizer
