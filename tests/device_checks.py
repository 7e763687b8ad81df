"""Device-discipline checks shared by the core, vision and image-AR tests (CPU-only machines).

A tensor made without a device lands on the CPU, where a CPU-only machine hides the bug; on a GPU
it surfaces as "Expected all tensors to be on the same device". Two checks catch it here:

- `violations` / `unreviewed`: a source scan for torch factory calls without `device=`;
- `default_device_elsewhere`: a run with "meta" as the default device, except inside the models'
  own forwards (transformers' code is not ours to check), so a tensor mmspec makes without a
  device fails where it would fail on a GPU.
"""

from __future__ import annotations

import ast
import functools
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
FACTORIES = {"tensor", "arange", "zeros", "ones", "full", "empty", "rand", "randn", "randint", "randperm",
             "linspace", "eye", "Generator", "as_tensor"}


def violations(source: str, module: str) -> list[str]:
    """`module:line function: ...` for each torch factory call without `device=`."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if not (isinstance(owner, ast.Name) and owner.id == "torch" and node.func.attr in FACTORIES):
                continue
            if any(keyword.arg == "device" or keyword.arg is None for keyword in node.keywords):
                continue  # device= given, or **kwargs that may carry it
            found.append(f"{module}:{node.lineno} {function.name}: torch.{node.func.attr}(...) without device=")
    return sorted(set(found))


def function_of(violation: str) -> str:
    return violation.split()[1].rstrip(":")


def unreviewed(module: str, reviewed: dict[tuple[str, str], str]) -> list[str]:
    """The violations in `module` outside the reviewed (module, function) exceptions."""
    found = violations((ROOT / module).read_text(), module)
    return [v for v in found if (module, function_of(v)) not in reviewed]


def stale_exceptions(reviewed: dict[tuple[str, str], str]) -> list[tuple[str, str]]:
    """Reviewed exceptions whose function no longer makes a device-less tensor (remove them)."""
    return [(module, function) for module, function in reviewed
            if not any(function_of(v) == function for v in violations((ROOT / module).read_text(), module))]


def decoding_modules(folder: str) -> list[str]:
    """Every module of an adapter folder but its toy-model recipes (CPU training scripts)."""
    paths = (ROOT / folder).rglob("*.py")
    return sorted(str(p.relative_to(ROOT)) for p in paths if "recipes" not in p.relative_to(ROOT).parts)


@contextmanager
def default_device_elsewhere(*models: nn.Module) -> Iterator[None]:
    """Make "meta" the default device, except inside the given models' own forwards.

    A tensor mmspec makes without a device then lands on "meta": it fails when it meets one of the
    model's CPU tensors or is copied to the CPU, exactly where a CPU tensor would fail on a GPU; a
    draw made on the default device with a CPU generator fails as it does on a GPU.
    """
    # mmspec also runs a model's base model alone (greedy verification through a certified head): shield it too.
    shielded = list(models) + [model.base_model for model in models if getattr(model, "base_model", model) is not model]
    for module in shielded:
        module.forward = _on_own_device(module.forward, module.device)
    try:
        with torch.device("meta"):
            yield
    finally:
        for module in shielded:
            del module.forward  # back to the class's forward


def _on_own_device(forward, device):
    @functools.wraps(forward)  # keeps the signature (mmspec inspects it for `logits_to_keep`)
    def shielded(*args, **kwargs):
        with torch.device(device):
            return forward(*args, **kwargs)

    return shielded
