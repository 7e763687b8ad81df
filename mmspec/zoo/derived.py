"""Zoo models that ship no weights of their own: they are a part of another zoo model.

A card's `derived_from` names the model and the part:

    {"model": "shapes-video-captioner", "folder": "text"}
        the model's sub-folder, loaded as it is (e.g. a drafter shipped inside a target's folder)
    {"model": "shapes-video-captioner", "language_model": true, "vocab_size": 523}
        the language model of a vision-language checkpoint as a causal LM: its decoder and head,
        with the embedding (and head) rows past `vocab_size` dropped (ids a text model never reads,
        such as the `<video>` and `<image>` placeholders appended to the LM's vocabulary)

A language model is written once, on first use, into the user cache (`$MMSPEC_CACHE`, else
`$XDG_CACHE_HOME/mmspec`, else `~/.cache/mmspec`) under a name keyed by the parent's weights, beside
the config, generation config and tokenizer files of the derived entry's own folder; it then loads
through the normal `from_pretrained` path, like any folder. The package holds its weights once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import MMSpecError

WEIGHTS = "model.safetensors"
# Where a vision-language checkpoint keeps its language model: under the names transformers' classes hold in
# memory since its 4.52 refactor (a state dict saved as it is), and under the older names that `save_pretrained`
# still writes (published checkpoints, ours). Each maps a stored prefix to the causal LM's.
LANGUAGE_MODEL_PREFIXES = (
    {"model.language_model.": "model.", "lm_head.": "lm_head."},
    {"language_model.model.": "model.", "language_model.lm_head.": "lm_head."},
)


def cache_root() -> Path:
    chosen = os.environ.get("MMSPEC_CACHE")
    if chosen:
        return Path(chosen).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mmspec"


def derived_folder(name: str, folder: Path, spec: dict[str, Any], parent: Path) -> Path:
    """The folder a derived zoo entry `name` loads from; `folder` holds its card, `parent` the model it comes from."""
    if "folder" in spec:
        part = parent / str(spec["folder"])
        if not any(part.glob("*.safetensors")):
            raise MMSpecError(f"zoo model {name!r} is the folder {spec['folder']!r} of {spec['model']!r}, which has no "
                              f"weights in {part}")
        return part
    if spec.get("language_model"):
        return language_model_folder(name, folder, parent, int(spec["vocab_size"]))
    raise MMSpecError(f"the model card of {name!r} has a derived_from without 'folder' or 'language_model': {spec}")


def language_model_folder(name: str, folder: Path, parent: Path, vocab_size: int) -> Path:
    """The cached folder of `parent`'s language model cut to `vocab_size` rows, written first if missing."""
    weights = parent / WEIGHTS
    if not weights.is_file():
        raise MMSpecError(f"zoo model {name!r} comes from the weights of {parent.name!r}, but {weights} is missing")
    digest = hashlib.sha256()
    with weights.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    digest.update(f"{vocab_size}".encode())
    target = cache_root() / "zoo" / f"{name}-{digest.hexdigest()[:16]}"
    if (target / WEIGHTS).is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    except OSError as error:
        raise MMSpecError(f"cannot write zoo model {name!r} to {target.parent} ({error.strerror or error}): set "
                          "MMSPEC_CACHE to a writable folder") from None
    try:
        write_language_model(weights, folder, scratch, vocab_size)
        try:
            scratch.rename(target)  # atomic: a killed run leaves a stray scratch folder, never a half-written model
        except OSError:
            if not (target / WEIGHTS).is_file():  # not another process that got there first
                raise
    except OSError as error:
        raise MMSpecError(f"cannot write zoo model {name!r} to {target} ({error.strerror or error}): set "
                          "MMSPEC_CACHE to a folder with room") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def write_language_model(weights: Path, folder: Path, out: Path, vocab_size: int) -> None:
    """Save the causal LM held in the vision-language `weights` into `out`, with the non-weight files of `folder`.

    Every tensor of the LM that `folder`'s config builds must be found, with its shape: anything else is an error."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        expected = {k: v.shape for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    tied = getattr(config, "tie_word_embeddings", False)
    with safe_open(str(weights), "pt") as stored:
        keys = list(stored.keys())
        mapping = next((m for m in LANGUAGE_MODEL_PREFIXES if any(k.startswith(p) for k in keys for p in m)), None)
        if mapping is None:
            raise MMSpecError(f"{weights} holds no language model (no tensor under "
                              f"{', '.join(p for m in LANGUAGE_MODEL_PREFIXES for p in m)})")
        tensors = {}
        for key in keys:
            prefix = next((p for p in mapping if key.startswith(p)), None)
            if prefix is not None:
                tensors[mapping[prefix] + key[len(prefix):]] = stored.get_tensor(key)
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        if key in tensors:
            tensors[key] = tensors[key][:vocab_size].contiguous()
    if tied:
        tensors.pop("lm_head.weight", None)  # saved once, as transformers saves tied weights
    wanted = {k: v for k, v in expected.items() if not (tied and k == "lm_head.weight")}
    wrong = sorted(k for k in wanted if k in tensors and tuple(tensors[k].shape) != tuple(wanted[k]))
    missing, unused = sorted(set(wanted) - set(tensors)), sorted(set(tensors) - set(wanted))
    if missing or unused or wrong:
        raise MMSpecError(f"the language model in {weights} does not match the config in {folder}: missing "
                          f"{missing[:3]}, unused {unused[:3]}, other shapes {wrong[:3]}")
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    for extra in folder.iterdir():
        if extra.is_file() and extra.name != "zoo_card.json" and not extra.name.endswith(".safetensors"):
            shutil.copy2(extra, out / extra.name)
