"""The feature-drafter caption methods (MSD, FLASH): where their drafters live, how they load, what they must match.

A trained feature drafter is a folder saved with `save_pretrained` (config.json + safetensors).
For a zoo model it sits in a subfolder named after its kind, next to the target's weights:

    shapes-video-captioner/            the target
    shapes-video-captioner/msd/        its MSD drafter   (vision.msd)
    shapes-video-captioner/flash/      its FLASH drafter (vision.flash)
    shapes-video-captioner/text/       its text-only drafter (a causal LM on its vocabulary), when it has one

The pipeline and `mmspec bench vision` load them from there by default; any other folder can
be passed explicitly. A drafter borrows the target's embedding table and LM head, so it only
works with a target of the same hidden size and vocabulary: `check_compatible` says so clearly
instead of letting a matrix multiply fail deep inside torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from ..devices import as_device, input_device
from ..drafters import Drafter
from ..errors import MMSpecError
from .feature_drafter import FeatureDrafterModel

# kind -> (name in messages, config model_type), in the order methods are listed.
FEATURE_KINDS: dict[str, tuple[str, str]] = {"msd": ("MSD", "mmspec_msd"), "flash": ("FLASH", "mmspec_flash")}
BUILD_COMMAND = "python -m mmspec.vision.recipes.train_captioner_drafters"
DRAFTER_DTYPES = ("float32", "bfloat16", "float16")


def check_kind(kind: str) -> str:
    if kind not in FEATURE_KINDS:
        raise MMSpecError(f"unknown feature drafter kind {kind!r}; choose from {', '.join(FEATURE_KINDS)}")
    return kind


def zoo_drafter_folder(model_folder: str | Path, kind: str) -> Path | None:
    """`model_folder/<kind>` if it holds a saved drafter, else None."""
    folder = Path(model_folder) / check_kind(kind)
    return folder if (folder / "config.json").is_file() else None


def load_feature_drafter(kind: str, folder: str | Path) -> FeatureDrafterModel:
    """Load the `kind` drafter saved in `folder`; one clear error for a missing folder or a drafter of another kind."""
    name, model_type = FEATURE_KINDS[check_kind(kind)]
    config_file = Path(folder).expanduser() / "config.json"
    if not config_file.is_file():
        raise MMSpecError(f"no {name} drafter in {str(folder)!r} (config.json not found)")
    try:
        found = json.loads(config_file.read_text()).get("model_type")
    except (OSError, ValueError) as err:
        raise MMSpecError(f"cannot read {config_file}: {err}") from None
    if found != model_type:
        # transformers would only warn and load random weights into the wrong class.
        other = next((n for n, t in FEATURE_KINDS.values() if t == found), found)
        raise MMSpecError(f"{str(folder)!r} holds a {other} drafter, expected {name}")
    if kind == "msd":
        from .msd import load_msd_drafter

        return load_msd_drafter(folder)
    from .flash import load_flash_drafter

    return load_flash_drafter(folder)


def check_compatible(drafter: FeatureDrafterModel, target: PreTrainedModel, where: str = "") -> None:
    """Raise MMSpecError unless `drafter` was built for `target`'s hidden size and vocabulary."""
    name = FEATURE_KINDS.get(drafter.kind, (drafter.kind,))[0]
    source = f" ({where})" if where else ""
    text = target.config.get_text_config()
    if drafter.config.hidden_size != text.hidden_size:
        raise MMSpecError(f"the {name} drafter{source} was built for hidden size {drafter.config.hidden_size}, the "
                          f"target's language model has {text.hidden_size}: train a drafter for this target ({BUILD_COMMAND})")
    # MSD records the target's vocabulary as target_vocab_size, FLASH as vocab_size.
    vocab = getattr(drafter.config, "target_vocab_size", None) or getattr(drafter.config, "vocab_size", None)
    head = target.get_output_embeddings()
    target_vocab = head.weight.shape[0] if head is not None else text.vocab_size
    if vocab is not None and vocab != target_vocab:
        raise MMSpecError(f"the {name} drafter{source} was trained for a vocabulary of {vocab} tokens, the target has "
                          f"{target_vocab}: train a drafter for this target ({BUILD_COMMAND})")


def load_checked(kind: str, folder_or_model: str | Path | FeatureDrafterModel, target: PreTrainedModel,
                 dtype: torch.dtype | None = None, device: str | torch.device | None = None) -> FeatureDrafterModel:
    """A drafter of `kind` (loaded from a folder, or given) that is checked against `target`, in `dtype` (default the
    target's), on `device` (default the target's input device)."""
    if isinstance(folder_or_model, FeatureDrafterModel):
        drafter, where = folder_or_model, ""
        if drafter.kind != kind:
            raise MMSpecError(f"the {kind!r} method got a {drafter.kind!r} drafter")
    else:
        drafter, where = load_feature_drafter(kind, folder_or_model), str(folder_or_model)
    check_compatible(drafter, target, where)
    # The target's input device: `target.device` reads "meta" when accelerate offloaded its first parameter.
    where = input_device(target) if device is None else as_device(device, "drafter_device")
    return drafter.to(device=where, dtype=dtype or target.dtype).eval()


def runtime_drafter(drafter: FeatureDrafterModel, lean: bool = True, device: str | torch.device | None = None) -> Drafter:
    """The draft/verify-loop drafter that runs a trained feature drafter model (`lean`: its layers step through
    `mmspec.kernels.lean_llama`; False: transformers' forward), on `device` (None: next to the target's LM head)."""
    if drafter.kind == "msd":
        from .msd import MSDDrafter

        return MSDDrafter(drafter, lean=lean, device=device)
    if drafter.kind == "flash":
        from .flash import FlashDrafter

        return FlashDrafter(drafter, lean=lean, device=device)
    raise MMSpecError(f"no runtime for feature drafters of kind {drafter.kind!r}")


def parse_drafter_spec(spec: str) -> tuple[str, str, str, torch.dtype | None]:
    """`LABEL=KIND:PATH[@DTYPE]` (the bench's --extra-drafter) -> (label, kind, path, dtype or None).

    DTYPE (float32, bfloat16, float16) runs that drafter in that precision, so one bench compares a
    drafter's precisions side by side (`flash-bf16=flash:model/flash@bfloat16`)."""
    label, sep, rest = spec.partition("=")
    kind, sep2, path = rest.partition(":")
    if not (sep and sep2 and label.strip() and path.strip()):
        raise MMSpecError(f"--extra-drafter takes LABEL=KIND:PATH[@DTYPE] (KIND msd or flash), got {spec!r}")
    dtype = None
    stem, at, suffix = path.rpartition("@")
    if at and suffix.strip() in DRAFTER_DTYPES:
        path, dtype = stem, getattr(torch, suffix.strip())
    return label.strip(), check_kind(kind.strip()), path.strip(), dtype


def describe(drafter: FeatureDrafterModel) -> dict[str, Any]:
    """The options that tell drafters of one kind apart (for bench settings and reports)."""
    config = drafter.config
    if drafter.kind == "flash":
        return {"kind": "flash", "num_queries": config.num_queries, "semi_ar_tokens": config.semi_ar_tokens,
                "compress": config.compress}
    return {"kind": drafter.kind, "layers": getattr(config, "num_hidden_layers", 1)}
