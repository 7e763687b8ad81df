"""The `mmspec-compiled` row of `mmspec bench text`: mmspec's static-shape compiled path (`compile=True`).

Its graphs are compiled before the timed passes, every verify and drafter width once, and that time is reported
apart from the decoding times.
"""

from __future__ import annotations

import time
from typing import cast

import torch
from transformers import PreTrainedModel

from ..decoding import SpeculativeDecoder
from ..policies import FixedDraftLength
from ..sampling import SamplingConfig
from ..static_steps import StaticSteps
from ..static_target import StaticModelDrafter, StaticTarget, verify_widths
from ..stats import SpecStats
from .harness import MethodFn


def compiled_mmspec(target: PreTrainedModel, drafter: PreTrainedModel, max_new_tokens: int, num_draft_tokens: int,
                    max_cache_len: int, first_prompt: torch.Tensor) -> tuple[MethodFn, float]:
    """The method and its compile time in seconds (every width compiled, then one call on `first_prompt`).

    Both caches are sized once for the longest call (`max_cache_len`), so no call grows them (a recompile)."""
    policy = FixedDraftLength(num_draft_tokens)
    static_target = StaticTarget(target, widths=verify_widths(policy), max_cache_len=max_cache_len)
    static_drafter = StaticModelDrafter(drafter, max_cache_len=max_cache_len)
    decoder = SpeculativeDecoder(static_target, static_drafter, policy=policy, method="mmspec-compiled")

    def run(input_ids: torch.Tensor) -> tuple[list[int], SpecStats]:
        out = decoder.generate(cast(torch.LongTensor, input_ids), max_new_tokens=max_new_tokens, sampling=SamplingConfig())
        return out.sequences[0, input_ids.shape[1]:].tolist(), out.stats

    start = time.perf_counter()
    with torch.inference_mode():
        static_target.warm_up()
        assert isinstance(static_drafter.lm, StaticSteps)
        static_drafter.lm.warm_up()
        run(first_prompt)
    return run, time.perf_counter() - start
