"""Zoo models that ship no weights of their own: they are a part of another zoo model.

A card's `derived_from` names the model and the part:

    {"model": "shapes-video-captioner", "folder": "text"}
        the model's sub-folder, loaded as it is (e.g. a drafter shipped inside a target's folder)
    {"model": "shapes-video-captioner", "language_model": true, "vocab_size": 523}
        the language model of a vision-language checkpoint as a causal LM: its decoder and head,
        with the embedding (and head) rows past `vocab_size` dropped (ids a text model never reads,
        such as the `<video>` and `<image>` placeholders appended to the LM's vocabulary)
    {"model": "shapes-video-captioner", "overlay": "overlay.safetensors", "parent_sha256": "..."}
        the model with the entry's own `config.json` (e.g. another rotary scaling) and the overlay's
        tensors merged into its weights (replacements and low-rank updates; see `mmspec.low_rank`);
        the parent's weights must still be the ones the overlay was trained on (`parent_sha256`);
        `"folders": ["text", ...]` brings the parent's sub-folders along (its drafters)

Such a model is written once, on first use, into the user cache (`$MMSPEC_CACHE`, else
`$XDG_CACHE_HOME/mmspec`, else `~/.cache/mmspec`) under a name keyed by what it is made of, beside
the config, generation config and tokenizer files of the derived entry's own folder (an overlay's
entry takes the parent's for those it lacks); it then loads through the normal `from_pretrained`
path, like any folder. The package holds the parent's weights once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import MMSpecError
from ..paths import inside

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
    check_spec(name, folder, spec, parent)
    if "folder" in spec:
        return parent / str(spec["folder"])
    if spec.get("language_model"):
        return language_model_folder(name, folder, parent, spec["vocab_size"])
    return overlay_folder(name, folder, parent, spec)


def check_spec(name: str, folder: Path, spec: dict[str, Any], parent: Path) -> None:
    """Every refusal of a card's `derived_from` that needs no build (nor torch): paths outside their folder, a
    missing part, a bad vocab_size, a missing overlay; run by `derived_folder`, and by the CLI before it imports
    torch."""
    check_paths(name, folder, spec, parent)
    if "folder" in spec:
        part = parent / str(spec["folder"])
        if not any(part.glob("*.safetensors")):
            raise MMSpecError(f"zoo model {name!r} is the folder {spec['folder']!r} of {spec['model']!r}, which has no "
                              f"weights in {part}")
        return
    if spec.get("language_model"):
        vocab_size = spec.get("vocab_size")
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
            raise MMSpecError(f"the model card of {name!r}: derived_from.vocab_size must be an integer >= 1 (the rows "
                              f"of the language model kept), got {vocab_size!r}")
        parent_weights(name, parent)
        return
    if "overlay" in spec:
        parent_weights(name, parent)
        if not (folder / str(spec["overlay"])).is_file() or not (folder / "config.json").is_file():
            raise MMSpecError(f"zoo model {name!r} is an overlay on {parent.name!r}, but {folder} lacks "
                              f"{spec['overlay']} or config.json")
        missing = [f for f in map(str, spec.get("folders", [])) if not (parent / f / "config.json").is_file()]
        if missing:
            raise MMSpecError(f"zoo model {name!r} brings the folders {missing} of {parent.name!r}, which has none")
        return
    raise MMSpecError(f"the model card of {name!r} has a derived_from without 'folder', 'language_model' or "
                      f"'overlay': {spec}")


def check_paths(name: str, folder: Path, spec: dict[str, Any], parent: Path) -> None:
    """Every path the card names stays inside its folder: the part and the brought folders in `parent`'s, the
    overlay in the card's own."""
    card = f"the model card of {name!r}: derived_from"
    if "folder" in spec:
        inside(parent, spec["folder"], f"{card}.folder")
    if "overlay" in spec:
        inside(folder, spec["overlay"], f"{card}.overlay")
    folders = spec.get("folders", [])
    if not isinstance(folders, list):
        raise MMSpecError(f"{card}.folders must be a list of folder names, got {folders!r}")
    for part in folders:
        inside(parent, part, f"{card}.folders")


def file_digest(path: Path, digest=None):
    """`path`'s bytes fed to a sha256 (a new one unless given)."""
    digest = digest or hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest


def parent_weights(name: str, parent: Path) -> Path:
    weights = parent / WEIGHTS
    if not weights.is_file():
        raise MMSpecError(f"zoo model {name!r} comes from the weights of {parent.name!r}, but {weights} is missing")
    return weights


def language_model_folder(name: str, folder: Path, parent: Path, vocab_size: int) -> Path:
    """The cached folder of `parent`'s language model cut to `vocab_size` rows, written first if missing."""
    weights = parent_weights(name, parent)
    digest = file_digest(weights)
    digest.update(f"{vocab_size}".encode())
    return cached_build(name, digest.hexdigest(), lambda out: write_language_model(weights, folder, out, vocab_size))


def overlay_folder(name: str, folder: Path, parent: Path, spec: dict[str, Any]) -> Path:
    """The cached folder of `parent` with `folder`'s config and overlay merged in, written first if missing."""
    weights = parent_weights(name, parent)
    overlay = folder / str(spec["overlay"])  # there, with config.json (`check_spec`)
    parent_digest = file_digest(weights).hexdigest()
    if spec.get("parent_sha256") and spec["parent_sha256"] != parent_digest:
        raise MMSpecError(f"zoo model {name!r} is an overlay trained on other weights of {parent.name!r} than the "
                          f"installed ones (sha256 {parent_digest[:12]}..., the overlay's {spec['parent_sha256'][:12]}...): "
                          "rebuild it with its card's rebuild_command")
    folders = [str(f) for f in spec.get("folders", [])]  # each with a config.json (`check_spec`)
    digest = file_digest(folder / "config.json", file_digest(overlay))
    digest.update(f"{parent_digest} {folders}".encode())
    return cached_build(name, digest.hexdigest(),
                        lambda out: write_overlaid_model(parent, folder, overlay, out, folders))


def cached_build(name: str, key: str, write) -> Path:
    """The user-cache folder `<name>-<key>` holding a model, made by `write(folder)` first if missing; written
    to a scratch folder and renamed, so a killed run never leaves a half-written model. The digest of its files,
    kept beside them, is checked on every use: an entry damaged since (a flipped byte, a truncated file) is
    built again, not trusted."""
    from safetensors import SafetensorError

    target = cache_root() / "zoo" / f"{name}-{key[:16]}"
    if (target / WEIGHTS).is_file():
        if intact(target):
            return target
        shutil.rmtree(target, ignore_errors=True)  # damaged: build it again
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    except OSError as error:
        raise MMSpecError(f"cannot write zoo model {name!r} to {target.parent} ({error.strerror or error}): set "
                          "MMSPEC_CACHE to a writable folder") from None
    try:
        write(scratch)
        (scratch / BUILD_DIGEST).write_text(folder_digest(scratch))
        try:
            scratch.rename(target)  # atomic: a killed run leaves a stray scratch folder, never a half-written model
        except OSError:
            if not (target / WEIGHTS).is_file():  # not another process that got there first
                raise
    except (OSError, SafetensorError) as error:  # SafetensorError: the disk filled while the weights were written
        raise MMSpecError(f"cannot write zoo model {name!r} to {target} ({getattr(error, 'strerror', None) or error}): set "
                          "MMSPEC_CACHE to a folder with room") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


BUILD_DIGEST = ".build.sha256"  # the sha256 of a cache entry's files, written with them


def folder_digest(folder: Path) -> str:
    """sha256 over the names and bytes of a folder's files (the digest file itself left out), in name order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != BUILD_DIGEST):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        file_digest(path, digest)
    return digest.hexdigest()


def intact(folder: Path) -> bool:
    """Whether a cache entry's files still have the digest written with them (an entry without one: not intact)."""
    try:
        return (folder / BUILD_DIGEST).read_text().strip() == folder_digest(folder)
    except OSError:
        return False


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


def write_overlaid_model(parent: Path, folder: Path, overlay: Path, out: Path, folders: list[str] = ()) -> None:
    """Save `parent` built with `folder`'s config and `overlay` merged in (fp16, as the zoo ships weights) into
    `out`, with `folder`'s non-weight files, then the parent's for those `folder` lacks, and the parent's
    sub-folders named in `folders`."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from ..low_rank import apply_overlay

    config = AutoConfig.from_pretrained(folder)
    architecture = (getattr(config, "architectures", None) or [None])[0]
    model_class = getattr(transformers, architecture or "", None)
    if model_class is None:
        raise MMSpecError(f"the config in {folder} names no transformers model class ({architecture!r})")
    model = model_class.from_pretrained(parent, config=config, dtype=torch.float32)
    apply_overlay(model, load_file(str(overlay)))
    model.half().save_pretrained(out, safe_serialization=True)
    for source in (folder, parent):
        for extra in source.iterdir():
            skip = extra.name in ("zoo_card.json", "heldout_samples.json") or extra.suffix == ".safetensors"
            if extra.is_file() and not skip and not (out / extra.name).exists():
                shutil.copy2(extra, out / extra.name)
    for sub in folders:
        shutil.copytree(parent / sub, out / sub)
