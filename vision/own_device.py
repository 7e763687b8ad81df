"""A feature drafter network on a device of its own (`drafter_device`), apart from the target it drafts for.

The runtime drafters (MSD, FLASH) keep their state where the target's tensors live (its input device):
the target's features, the tokens, the positions and masks. A network method marked `on_own_device`
takes those tensors, computes on the network's own device, and hands its tensor results back on the
device of the first tensor it was given, as accelerate's hooks do for a text drafter. On one device
it is a no-op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from transformers.utils import ModelOutput

Method = TypeVar("Method", bound=Callable[..., Any])


def on_own_device(method: Method) -> Method:
    """Run a network method on the network's device; tensor results return to the caller's device."""

    @functools.wraps(method)
    def wrapper(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        home = next(self.parameters()).device
        caller = next((value.device for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)), home)
        if caller == home:
            return method(self, *args, **kwargs)
        moved = method(self, *(moved_to(value, home) for value in args),
                       **{name: moved_to(value, home) for name, value in kwargs.items()})
        return moved_to(moved, caller)

    return wrapper  # type: ignore[return-value]


def moved_to(value: Any, device: torch.device) -> Any:
    """Tensors (alone, in a tuple or list, or the tensor fields of a model output) on `device`; anything else,
    a KV cache included (it lives with the network that fills it), as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, ModelOutput):
        for name, field in value.items():
            if isinstance(field, torch.Tensor):
                value[name] = field.to(device)
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(moved_to(item, device) for item in value)
    return value
