"""Values typed into the demo's fields, checked before they reach a pipeline: one clear message in the page."""

from __future__ import annotations

import math
from typing import Any

from ..errors import MMSpecError

MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes any unsigned 64-bit value


def checked_seed(value: Any) -> int:
    """A gr.Number seed as an int in 0..2**64 - 1 (empty = 0); 1e30, -1, 2.5, inf and nan are refused."""
    if value is None or value == "":
        return 0
    if isinstance(value, int) and not isinstance(value, bool):  # exact: a float cannot hold 2**64 - 1
        seed: int | None = value
    else:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        seed = int(number) if math.isfinite(number) and number == math.floor(number) else None
    if seed is None or not 0 <= seed <= MAX_SEED:
        raise MMSpecError(f"seed must be a whole number in 0..{MAX_SEED}, got {value!r}")
    return seed
