"""The placement flags of the verbs that load a big target: `--device-map`, `--max-memory`, `--offload-folder`
and `--drafter-device`, passed to the pipeline's `from_pretrained` (accelerate spreads the model)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import MMSpecError
from . import checks

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")  # as mmspec.devices, without importing torch here


def add_placement_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("big models (spread by accelerate)")
    group.add_argument("--device-map", type=device_map, default=None, metavar="auto|FILE.json",
                       help="spread the model over devices, the CPU and the disk: a strategy (auto, balanced, "
                            "sequential) or a JSON file mapping module names to devices ({\"model.layers.9\": \"disk\"})")
    group.add_argument("--max-memory", type=max_memory, default=None, metavar="DEVICE=SIZE,...",
                       help="memory each device may hold, e.g. cpu=200MB or 0=10GiB,cpu=30GiB (implies --device-map auto)")
    group.add_argument("--offload-folder", type=checks.output_folder, default=None, metavar="DIR",
                       help="where layers offloaded to the disk are kept")
    group.add_argument("--drafter-device", type=checks.device_name, default=None, metavar="DEVICE",
                       help="device of the drafter (default: the model's first device)")


def add_drafter_dtype_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drafter-dtype", type=checks.dtype_name, default=None, metavar="DTYPE",
                        help="precision the drafters run in: float32, bfloat16 or float16 (default: the model's). "
                             "Lossless either way; bfloat16 drafts faster on a CPU with AVX512-BF16 / AMX (BENCHMARKS.md)")


def placement_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `from_pretrained` keyword arguments of the flags, checked together before any model loads."""
    options = {"device_map": args.device_map, "max_memory": args.max_memory, "offload_folder": args.offload_folder,
               "drafter_device": args.drafter_device}
    if all(value is None for value in options.values()):
        return {}  # nothing to check: torch is not imported yet, so a bad input file is still refused at once
    if args.drafter_device is not None and args.device_map is None and args.max_memory is None:
        raise MMSpecError("--drafter-device places the drafter of a model spread by --device-map / --max-memory")
    checks.refuse_cuda_without_driver(args.drafter_device, "--drafter-device")
    from ..devices import load_options

    load_options(None, args.device_map, args.max_memory, args.offload_folder)  # combinations: one clear error
    if args.drafter_device is not None:  # present on this machine, before any weights load
        from ..devices import usable_device

        usable_device(args.drafter_device, "--drafter-device")
    return {name: value for name, value in options.items() if value is not None}


def device_map(text: str) -> str | dict[str, Any]:
    """A strategy name, or a JSON file holding a {module name: device} object."""
    if text in STRATEGIES:
        return text
    if not text.endswith(".json") and not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"expected {', '.join(STRATEGIES)} or a JSON file, got {text!r}")
    checks.existing_file(text)
    try:
        mapping = json.loads(Path(text).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid JSON: {error}") from None
    if not isinstance(mapping, dict) or not mapping:  # as mmspec.devices says it, before torch is imported
        raise argparse.ArgumentTypeError(f"device_map must be a strategy ({', '.join(STRATEGIES)}) or a non-empty "
                                         f"{{module name: device}} dict, got {mapping!r}")
    from ..devices import check_device_map

    return _checked(check_device_map, mapping)


def max_memory(text: str) -> dict[Any, str]:
    """'cpu=200MB,0=10GiB' -> {"cpu": "200MB", 0: "10GiB"}."""
    sizes: dict[Any, str] = {}
    for part in text.split(","):
        name, equals, size = part.strip().partition("=")
        if not equals or not name or not size:
            raise argparse.ArgumentTypeError(f"expected DEVICE=SIZE pairs such as cpu=200MB,0=10GiB, got {text!r}")
        key = int(name) if name.isdigit() else name
        if key in sizes:
            raise argparse.ArgumentTypeError(f"{name} is given twice in {text!r}")
        if not _positive_size(size):  # as mmspec.devices says it, before torch is imported
            raise argparse.ArgumentTypeError(f"max_memory[{key!r}]: {size!r} is not a size (bytes, or e.g. 200MB, 2GiB)")
        sizes[key] = size
    from ..devices import check_max_memory

    return _checked(check_max_memory, sizes)


def _positive_size(size: str) -> bool:
    """False for a size whose number is not a finite number > 0 (-1GB, 1e999GB, 0); True otherwise (accelerate's
    own parser then reads the unit)."""
    digits = size.upper().rstrip("IBKMGT") or size
    try:
        number = float(digits)
    except ValueError:
        return True  # not a number this reads: accelerate decides
    return math.isfinite(number) and number > 0


def _checked(check: Callable[[Any], Any], value: Any) -> Any:
    """mmspec.devices' own check of `value`, its one-line error as argparse's."""
    try:
        return check(value)
    except MMSpecError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
