"""Big targets through accelerate: loading options, where a dispatched model takes its inputs, and a
drafter on its own device.

A target too big for one device is loaded as transformers loads it,
`from_pretrained(..., device_map="auto" | {module: device}, max_memory={...}, offload_folder=...)`:
accelerate spreads its layers over the devices, the CPU and the disk, and hooks move each layer's
inputs to where it runs. Such a model's `model.device` is its first parameter's, which reads "meta"
when that parameter is offloaded; `input_device` says where its inputs belong instead.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch

from .errors import MMSpecError

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
OFFLOADED = ("cpu", "disk")  # device_map values accelerate runs on the main device


def is_spread(model: torch.nn.Module | None) -> bool:
    """Whether accelerate spread the model over several devices, or offloaded part of it to the disk
    (such a model cannot be moved with `.to()`)."""
    placed = set((getattr(model, "hf_device_map", None) or {}).values())
    return len(placed) > 1 or "disk" in placed


def input_device(model: torch.nn.Module) -> torch.device:
    """The device a model takes its inputs on (and, through accelerate's hooks, returns its outputs on).

    A model in one piece: its parameters' device. A dispatched one: accelerate's main device, the
    first accelerator in its device map, else the CPU (where layers offloaded to the CPU or the disk run).
    """
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return next(model.parameters()).device
    placed = [device for device in device_map.values() if device not in OFFLOADED]
    return torch.device(placed[0]) if placed else torch.device("cpu")


def on_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor.to(device)`, skipping the call (a dispatched no-op) when it is there already: drafters move small
    tensors between their device and the target's several times a round."""
    return tensor if tensor.device == device else tensor.to(device)


def place_drafter(drafter: torch.nn.Module, device: str | torch.device | None,
                  target: torch.nn.Module) -> torch.nn.Module:
    """Put a drafter network on `device` (None: the target's input device).

    On a device of its own, accelerate's `AlignDevicesHook` moves what the loop feeds it (tokens and
    states on the target's device) to the drafter's device, and its outputs back, so the loop never sees
    the difference; its KV cache stays on its own device.
    """
    home = input_device(target)
    device = home if device is None else as_device(device, "drafter_device")
    drafter.to(device)
    if device != home:
        from accelerate.hooks import AlignDevicesHook, add_hook_to_module

        from .compat import skip_keys_device_placement

        skip = skip_keys_device_placement(drafter)
        add_hook_to_module(drafter, AlignDevicesHook(execution_device=device, io_same_device=True, skip_keys=skip))
    return drafter


def as_device(value: str | int | torch.device, what: str = "device") -> torch.device:
    """A torch.device from "cpu", "cuda:1", 0 (an accelerator index), ...; one clear error otherwise."""
    try:
        return torch.device(int(value) if isinstance(value, str) and value.isdigit() else value)
    except (RuntimeError, TypeError) as error:
        raise MMSpecError(f"{what}: {value!r} is not a device (e.g. cpu, cuda, cuda:1, mps, 0)") from error


def usable_device(value: str | int | torch.device, what: str = "--device") -> torch.device:
    """`as_device`, and present on this machine: "cuda" without a CUDA GPU (or "cuda:3" on a machine with two)
    is one clear error here rather than a traceback at the first tensor moved."""
    device = as_device(value, what)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise MMSpecError(f"{what} {value}: this machine has no CUDA GPU that torch can use")
        if device.index is not None and device.index >= count:
            raise MMSpecError(f"{what} {value}: this machine has {count} CUDA GPU(s), numbered 0 to {count - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise MMSpecError(f"{what} {value}: MPS is not available on this machine")
    elif device.type == "meta":
        raise MMSpecError(f"{what} {value}: the meta device holds shapes, not numbers; name a device to compute on "
                          "(cpu, cuda, mps)")
    return device


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work, so a wall-clock timing covers it (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_options(device: str | torch.device | None = None, device_map: str | Mapping[str, Any] | None = None,
                 max_memory: Mapping[Any, Any] | None = None,
                 offload_folder: str | os.PathLike | None = None) -> dict[str, Any]:
    """The `from_pretrained` keyword arguments placing a target: `device_map` (a strategy or a
    {module name: device} dict; `max_memory` alone means "auto"), `max_memory` ({device: size}, sizes as
    bytes or "200MB" / "2GiB") and `offload_folder` (where layers mapped to "disk" live). Empty when none
    is given: the model is then loaded whole and moved to `device`. Bad values raise one `MMSpecError`."""
    if device_map is None and max_memory is not None:
        device_map = "auto"
    if device_map is None:
        if offload_folder is not None:
            raise MMSpecError("offload_folder applies to a dispatched model: pass device_map too (e.g. device_map='auto')")
        return {}
    if device is not None:
        raise MMSpecError("pass device= (the whole model on one device) or device_map= (spread by accelerate), not both")
    options: dict[str, Any] = {"device_map": check_device_map(device_map)}
    if max_memory is not None:
        options["max_memory"] = check_max_memory(max_memory)
    if offload_folder is not None:
        options["offload_folder"] = str(offload_folder)
    return options


def check_device_map(device_map: Any) -> str | dict[str, Any]:
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise MMSpecError(f"device_map {device_map!r} is not a strategy ({', '.join(DEVICE_MAP_STRATEGIES)}) "
                              "nor a {module name: device} dict")
        return device_map
    if not isinstance(device_map, Mapping) or not device_map:
        raise MMSpecError(f"device_map must be a strategy ({', '.join(DEVICE_MAP_STRATEGIES)}) or a non-empty "
                          f"{{module name: device}} dict, got {device_map!r}")
    checked: dict[str, Any] = {}
    for name, device in device_map.items():
        if not isinstance(name, str):
            raise MMSpecError(f"device_map keys are module names (strings), got {name!r}")
        checked[name] = _map_device(device, f"device_map[{name!r}]")
    return checked


def check_max_memory(max_memory: Any) -> dict[Any, Any]:
    from accelerate.utils import convert_file_size_to_int

    if not isinstance(max_memory, Mapping) or not max_memory:
        raise MMSpecError(f"max_memory must be a non-empty {{device: size}} dict such as {{'cpu': '200MB'}}, got {max_memory!r}")
    checked: dict[Any, Any] = {}
    for device, size in max_memory.items():
        key = _map_device(device, "max_memory")
        if key == "disk":
            raise MMSpecError("max_memory bounds devices and the CPU; the disk takes what is left (offload_folder)")
        try:
            if isinstance(size, bool) or convert_file_size_to_int(size) <= 0:
                raise ValueError
        except (ValueError, TypeError, OverflowError):  # OverflowError: 1e999GB
            raise MMSpecError(f"max_memory[{device!r}]: {size!r} is not a size (bytes, or e.g. 200MB, 2GiB)") from None
        checked[key] = size
    return checked


def _map_device(device: Any, what: str) -> str | int:
    """A device_map / max_memory device as accelerate takes it: "cpu", "disk", "cuda:1", "mps" or an index."""
    if isinstance(device, bool):
        raise MMSpecError(f"{what}: {device!r} is not a device")
    if isinstance(device, int):
        if device < 0:
            raise MMSpecError(f"{what}: accelerator index {device} is negative")
        return device
    if isinstance(device, str) and device.isdigit():
        return int(device)
    if device == "disk":
        return device
    return str(as_device(device, what)) if isinstance(device, (str, torch.device)) else _not_a_device(device, what)


def _not_a_device(device: Any, what: str) -> str:
    raise MMSpecError(f"{what}: {device!r} is not a device (cpu, disk, cuda:N, mps or an accelerator index)")
