"""`from_pretrained` that refuses a checkpoint whose weights do not cover its config.

transformers initialises any parameter the weights lack at random and only logs it (a config saying 64
layers over weights holding 1 loads 63 random layers, and the model then emits confident garbage).
Missing weights are an error here, named with a few of the absent parameters; so is a device map that
names modules the model does not have (accelerate would ignore them).
"""

from __future__ import annotations

from typing import Any

from .errors import MMSpecError


def from_pretrained_complete(model_class: Any, where: str, what: str, **kwargs: Any) -> Any:
    """`model_class.from_pretrained(where, **kwargs)`; MMSpecError if the folder's weights lack parameters its
    config names (`what` names the model in the message)."""
    from safetensors import SafetensorError

    try:
        model, info = model_class.from_pretrained(where, output_loading_info=True, **kwargs)
    except SafetensorError as error:  # a truncated file, a header that lies about its size or offsets
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise MMSpecError(f"the {what} {str(where)!r} has weights that cannot be read ({reason}): a damaged or "
                          "truncated .safetensors file") from None
    check_loading_info(info, where, what)
    check_device_map_names(model, kwargs.get("device_map"), where)
    return model


def check_device_map_names(model: Any, device_map: Any, where: str) -> None:
    """A device map naming a module the model lacks (a typo, another model's layout) is an error, not ignored.

    accelerate also places single parameters and buffers by name (LLaVA-NeXT's `model.image_newline`)."""
    if not isinstance(device_map, dict):
        return
    modules = {name for name, _ in model.named_modules()}
    modules |= {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    unknown = sorted(name for name in device_map if name and name not in modules)
    if unknown:
        raise MMSpecError(f"the device map names module(s) {', '.join(map(repr, unknown[:5]))} that {str(where)!r} "
                          "does not have: name modules of this model (e.g. model.layers.0)")


def check_loading_info(info: dict[str, Any], where: str, what: str) -> None:
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise MMSpecError(f"the {what} {str(where)!r} lacks weights for {len(missing)} parameter(s) its config.json "
                          f"names ({shown}): its weights do not match its config; they would be random")


def check_finite(model: Any, where: str, what: str) -> None:
    """A model whose weights hold NaN or infinity is refused: its probabilities would reach a sampler."""
    import torch

    with torch.no_grad():
        bad = [name for name, tensor in model.state_dict().items()
               if tensor.is_floating_point() and not tensor.is_meta and not bool(torch.isfinite(tensor).all())]
    if bad:
        raise MMSpecError(f"the {what} {str(where)!r} holds weights that are not finite (NaN or infinity) in "
                          f"{', '.join(bad[:3])}{' and more' if len(bad) > 3 else ''}: a broken training run or file")
