"""argparse types that check every numeric and path flag up front, before any model loads.

Each is a callable `type=` for `add_argument`: it returns the parsed value or raises
`argparse.ArgumentTypeError`, which argparse turns into one line and exit status 2. Every verb uses
these, so a flag means the same thing (and fails the same way) everywhere.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import MMSpecError

MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes any unsigned 64-bit value


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def finite_float(text: str) -> float:
    return float(_number(text, float))


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def temperature(text: str) -> float | list[float]:
    """One number >= 0 (0 = greedy), or comma-separated numbers > 0: one per scale (VAR models)."""
    if "," not in text:
        return non_negative_float(text)
    try:
        return [positive_float(part.strip()) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, or numbers > 0 separated by commas (one per "
                                         f"scale), got {text!r}") from None


def refuse_per_scale_temperature(temperature: float | list[float], family: str | None, name: str) -> None:
    if isinstance(temperature, list) and family != "var":
        raise MMSpecError(f"--temperature takes one value per scale for VAR models only; {name!r} is not one")


def probability(text: str) -> float:
    value = finite_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def open_probability(text: str) -> float:
    """A number in (0, 1] (a nucleus / top-p mass)."""
    value = finite_float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def int_in(low: int, high: int | None = None, why: str = "") -> Callable[[str], int]:
    """An integer in [low, high] (no upper bound when high is None); `why` explains the upper bound."""

    def parse(text: str) -> int:
        # int() accepts Unicode digits such as '²' only partly; ASCII digits (and a sign) only.
        stripped = text.strip()
        if not stripped.lstrip("+-").isascii() or not stripped.lstrip("+-").isdigit():
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
        value = int(stripped)
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"expected an integer {bound}{why}, got {text!r}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its "invalid <name> value" fallback
    return parse


positive_int = int_in(1)
non_negative_int = int_in(0)
seed = int_in(0, MAX_SEED)
threads = int_in(1, 1024)


def not_found(text: str) -> str:
    """Why `text` names nothing: a loop of symbolic links, a link to a missing file, or no such file."""
    try:
        os.stat(text)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return f"{text!r} is a loop of symbolic links (too many levels of symbolic links)"
        if os.path.islink(text):
            return f"{text!r} is a symbolic link to a missing file"
    return f"file not found: {text!r}"


def not_regular(text: str) -> str | None:
    """Why an existing path cannot be read as a file or a folder (a device such as /dev/zero, a pipe), or None."""
    path = Path(text)
    return None if path.is_file() or path.is_dir() else f"{text!r} is not a regular file (a device, pipe or socket)"


def existing_file(text: str) -> str:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(not_found(text))
    if not path.is_file():
        raise argparse.ArgumentTypeError(not_regular(text) or f"not a file: {text!r}")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text!r} (permission denied)")
    return text


def text_file(text: str) -> str:
    """An existing UTF-8 text file (e.g. one prompt per line)."""
    existing_file(text)
    try:
        Path(text).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a UTF-8 text file") from None
    return text


def existing_folder(text: str) -> str:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"folder not found: {text!r}" if not path.exists() else f"not a folder: {text!r}")
    return text


def _check_writable_folder(folder: Path, shown: str) -> None:
    """Create and remove a temporary file in `folder`: the one test that holds on /proc, /sys and read-only mounts."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".mmspec-write-check-"):
            pass
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot write to {shown!r}: {error.strerror or error}") from None


def output_file(suffixes: Iterable[str] | None = None, kind: str = "") -> Callable[[str], str]:
    """A file that can be written: in an existing, writable folder, not itself a folder, with one of `suffixes`
    (`kind` names them: "image" -> "needs an image suffix")."""
    allowed = sorted(suffixes) if suffixes is not None else None

    def parse(text: str) -> str:
        path = Path(text)
        if allowed is not None and path.suffix.lower() not in allowed:
            article = "an" if kind[:1] in tuple("aeiou") else "a"
            named = f"{article} {kind} suffix" if kind else "one of the suffixes"
            raise argparse.ArgumentTypeError(f"{text!r} needs {named} ({', '.join(allowed)})")
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is an existing folder, not a file")
        parent = path.parent
        if not parent.is_dir():
            raise argparse.ArgumentTypeError(f"cannot write {text!r}: no existing folder {str(parent)!r}")
        _check_writable_folder(parent, str(parent))
        return text

    parse.__name__ = "output file"
    return parse


def output_folder(text: str) -> str:
    """A folder to save into: an existing writable folder, or a new one whose nearest existing parent is writable."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create {text!r}: {str(existing)!r} is not a folder")
    _check_writable_folder(existing, str(existing))
    return text


def pair_of_ints(name: str, first: str, second: str) -> Callable[[str], tuple[int, int]]:
    """'A,B' -> (A, B), both positive integers (e.g. Sparse-to-Dense's K,GAMMA)."""

    def parse(text: str) -> tuple[int, int]:
        parts = text.split(",")
        if len(parts) != 2:
            raise argparse.ArgumentTypeError(f"{name} settings are {first},{second} pairs of positive integers, got {text!r}")
        try:
            return positive_int(parts[0]), positive_int(parts[1])
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"{name} settings are {first},{second} pairs of positive integers, got {text!r}") from None

    parse.__name__ = f"{first},{second}"
    return parse


COMMON_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|meta)(:[0-9]+)?|[0-9]+")  # names torch.device takes, known here
DEVICE_SHAPE = re.compile(r"[a-z][a-z0-9_]*(:[0-9]+)?")  # anything else torch could take has this shape
# Files a GPU driver torch can use leaves on this machine (NVIDIA, ROCm, WSL's): with none, no CUDA GPU is usable.
GPU_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def device_name(text: str) -> str:
    """A torch device name or accelerator index (cpu, cuda, cuda:1, mps, 0); whether this machine has it is
    checked when the verb runs (`mmspec.devices.usable_device`). The common names are read without torch."""
    if COMMON_DEVICE.fullmatch(text):
        return text
    if not DEVICE_SHAPE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (e.g. cpu, cuda, cuda:1, mps, 0)")
    import torch

    try:
        torch.device(int(text) if text.isdigit() else text)
    except (RuntimeError, TypeError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (e.g. cpu, cuda, cuda:1, mps, 0)") from None
    return text


def _distinct_positive_ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(positive_int(part) for part in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{what} are positive integers separated by commas, got {text!r}") from None
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{what} repeat in {text!r}")
    return values


def batch_sizes(text: str) -> tuple[int, ...]:
    """'1,4,8' -> (1, 4, 8): distinct positive integers, in the order given."""
    return _distinct_positive_ints(text, "batch sizes")


def chain_lengths(text: str) -> tuple[int, ...]:
    """'4,6' -> (4, 6): distinct positive draft lengths, in the order given."""
    return _distinct_positive_ints(text, "chain lengths")


DTYPE_NAMES = ("float32", "bfloat16", "float16")


def dtype_name(text: str) -> str:
    """One of float32, bfloat16, float16 (also spelt fp32, bf16, fp16)."""
    short = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    name = short.get(text.lower(), text.lower().removeprefix("torch."))
    if name not in DTYPE_NAMES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(DTYPE_NAMES)} (or fp32, bf16, fp16), got {text!r}")
    return name


def refuse_cuda_without_driver(value: str | None, what: str) -> None:
    """`cuda` on a machine with no GPU driver at all, refused as `usable_device` says it, without importing torch
    (which would take seconds to find the same); with a driver, `usable_device` decides."""
    if value is not None and value.split(":")[0] == "cuda" and not any(map(os.path.exists, GPU_DRIVER_FILES)):
        raise MMSpecError(f"{what} {value}: this machine has no CUDA GPU that torch can use")
