"""What the text pipelines share to decode a list of inputs `batch_size` at a time.

A pipeline called with a list returns a list (one output per item, in order). `batch_size=1`
decodes the items one by one through the pipeline's single-input path (every method); a larger
`batch_size` decodes that many items in one left-padded batch (`mmspec.rounds.BatchRounds`), which
needs a target that `decodes_batches` and a drafter that `drafts_batches`.

This module is core: it imports no adapter.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from .drafters import Drafter
from .errors import MMSpecError
from .targets import Target

T = TypeVar("T")


def check_batch_size(batch_size: Any) -> int:
    """`batch_size` as a positive int, else one clear error."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise MMSpecError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return batch_size


def groups(items: Sequence[T], batch_size: int) -> list[list[T]]:
    """`items` cut into consecutive groups of `batch_size` (the last one may be shorter)."""
    return [list(items[start:start + batch_size]) for start in range(0, len(items), batch_size)]


def batching_refusal(target: Target, drafter: Drafter, method: str) -> str | None:
    """Why `method` (this target and drafter) cannot decode a batch, or None when it can."""
    if not target.decodes_batches:
        return f"the model ({type(target).__name__} over {type(target.model).__name__}) decodes one sequence at a time"
    if not drafter.drafts_batches:
        return f"method {method!r} drafts one sequence at a time ({type(drafter).__name__})"
    return None


def check_batching(target: Target, drafter: Drafter, method: str, batch_size: int, batching_methods: list[str]) -> None:
    """One clear error when `batch_size` > 1 asks `method` for a batch it cannot decode."""
    if batch_size == 1:
        return
    reason = batching_refusal(target, drafter, method)
    if reason is None:
        return
    others = [m for m in batching_methods if m != method]
    hint = f" or a method that batches ({', '.join(others)})" if others else ""
    raise MMSpecError(f"batch_size={batch_size}: {reason}; use batch_size=1{hint}")


@contextmanager
def left_padding(tokenizer: Any) -> Iterator[None]:
    """The tokenizer pads on the left inside the block (a batch's prompts must end together), as it did after."""
    saved = getattr(tokenizer, "padding_side", None)
    tokenizer.padding_side = "left"
    try:
        yield
    finally:
        if saved is not None:
            tokenizer.padding_side = saved


def per_item(value: Any, count: int, name: str) -> list[Any]:
    """`value` for each of `count` items: a list/tuple of exactly `count` values, or one value for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise MMSpecError(f"got {len(value)} {name}s for {count} inputs: pass one {name} for all, or one per input")
        return list(value)
    return [value] * count
