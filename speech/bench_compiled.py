"""The compiled twins of `mmspec bench speech`'s rows (`--compile`): the same methods on the static-shape path.

Each twin decodes as its row does, through `SpeculativeDecoder(compile=True)` (`speech/static_target.py`). The
decoder graphs are compiled before the timed passes, every width once, and that time is reported apart.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from transformers import PreTrainedModel

from .. import static_target as core_static
from ..drafters import Drafter
from .hybrid import hybrid_policy
from .static_target import StaticWhisperTarget, whisper_widths

# The rows that get a compiled twin (the others draft the same way as one of these, or batch).
TWINNED_ROWS = ("greedy-loop", "hybrid-strict", "hybrid-strict-ar")
SUFFIX = " compiled"


def compiled_twins(rows: dict[str, Callable[[], Drafter]], make_row: Callable[[Callable[[], Drafter]], Any]
                   ) -> dict[str, Any]:
    """{row name + " compiled": its decode} for the rows of `TWINNED_ROWS` among `rows` ({name: drafter factory});
    `make_row(make_drafter)` builds a compiled decode."""
    return {f"{name}{SUFFIX}": make_row(make) for name, make in rows.items() if name in TWINNED_ROWS}


def compile_decoder(model: PreTrainedModel, greedy_only: bool = False) -> float:
    """Compile every decoder width the compiled rows use (greedy: one token; hybrid: its padded widths) now;
    returns the seconds it took."""
    widths = {1} if greedy_only else {1, *whisper_widths(core_static.verify_widths(hybrid_policy()))}
    start = time.perf_counter()
    with torch.inference_mode():
        StaticWhisperTarget(model, widths=tuple(sorted(widths)), backend=core_static.DEFAULT_BACKEND).warm_up()
    return time.perf_counter() - start
