"""`mmspec bench text`: plain greedy (eager, and static-cache compiled) vs mmspec speculative (each policy) vs
transformers' assisted generation."""

from __future__ import annotations

import time

import torch
from transformers import CompileConfig, PreTrainedModel

from .. import compat
from ..decoding import SpeculativeDecoder
from ..drafters import PromptLookupDrafter
from ..policies import make_policy
from ..sampling import SamplingConfig
from ..stats import SpecStats
from .harness import BenchReport, ForwardCounter, MethodFn, run_benchmark


def plain_greedy(target: PreTrainedModel, max_new_tokens: int, counter: ForwardCounter) -> MethodFn:
    def run(input_ids: torch.Tensor) -> tuple[list[int], SpecStats]:
        counter.take()
        start = time.perf_counter()
        with counter.counting():
            out = target.generate(input_ids, do_sample=False, max_new_tokens=max_new_tokens)
        stats = SpecStats(method="plain", total_time=time.perf_counter() - start)
        stats.new_tokens = out.shape[1] - input_ids.shape[1]
        stats.target_forwards = counter.take()
        return out[0, input_ids.shape[1]:].tolist(), stats

    return run


def static_cache_compile_config(device: torch.device) -> CompileConfig:
    """How the `generate-static-compiled` row compiles the target's forward: CUDA graphs on a GPU
    ("reduce-overhead"), inductor's default mode elsewhere; one static shape (no dynamic dimensions).

    transformers compiles a static-cache `generate` by itself only on accelerators (cuda, xpu, ...); on a CPU it
    needs a private flag, set through `compat.compile_on_every_device`.
    """
    config = CompileConfig(mode="reduce-overhead" if device.type == "cuda" else "default", dynamic=False)
    compat.compile_on_every_device(config)
    return config


def static_compiled_greedy(target: PreTrainedModel, max_new_tokens: int, max_cache_len: int,
                           counter: ForwardCounter) -> MethodFn:
    """transformers' fastest plain decoding: `generate(cache_implementation="static")` with a compiled forward.

    The cache is sized once for the longest prompt (`max_cache_len`), so every call decodes with the same shapes
    and the forward compiles once, on the harness's warm-up calls; the harness checks its tokens against eager
    `generate`'s.
    """
    config = static_cache_compile_config(target.device)

    def run(input_ids: torch.Tensor) -> tuple[list[int], SpecStats]:
        counter.take()
        start = time.perf_counter()
        with counter.counting():
            out = target.generate(input_ids, do_sample=False, max_new_tokens=max_new_tokens, cache_implementation="static",
                                  compile_config=config, max_cache_len=max_cache_len)
        stats = SpecStats(method="generate-static-compiled", total_time=time.perf_counter() - start)
        stats.new_tokens = out.shape[1] - input_ids.shape[1]
        stats.target_forwards = counter.take()
        return out[0, input_ids.shape[1]:].tolist(), stats

    return run


def hf_assisted(
    target: PreTrainedModel, drafter: PreTrainedModel, max_new_tokens: int, num_tokens: int, schedule: str,
    target_counter: ForwardCounter, drafter_counter: ForwardCounter,
) -> MethodFn:
    """transformers' assisted generation with the same drafter and draft length.

    The draft length lives in the assistant's generation_config; without it transformers keeps
    its own defaults (and a 0.4 confidence cut-off), so both are set before every call.
    """

    def run(input_ids: torch.Tensor) -> tuple[list[int], SpecStats]:
        config = drafter.generation_config
        config.num_assistant_tokens = num_tokens
        config.num_assistant_tokens_schedule = schedule
        config.assistant_confidence_threshold = 0.0
        target_counter.take()
        drafter_counter.take()
        start = time.perf_counter()
        with target_counter.counting(), drafter_counter.counting():
            out = target.generate(input_ids, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens)
        stats = SpecStats(method=f"hf-assisted-{schedule}", total_time=time.perf_counter() - start)
        stats.new_tokens = out.shape[1] - input_ids.shape[1]
        stats.target_forwards = target_counter.take()
        stats.drafter_forwards = drafter_counter.take()
        return out[0, input_ids.shape[1]:].tolist(), stats

    return run


def mmspec_method(decoder: SpeculativeDecoder, max_new_tokens: int) -> MethodFn:
    def run(input_ids: torch.Tensor) -> tuple[list[int], SpecStats]:
        out = decoder.generate(input_ids, max_new_tokens=max_new_tokens, sampling=SamplingConfig())
        return out.sequences[0, input_ids.shape[1]:].tolist(), out.stats

    return run


def bench_text(
    target: PreTrainedModel,
    drafter: PreTrainedModel,
    prompts: list[torch.Tensor],
    *,
    max_new_tokens: int = 48,
    num_draft_tokens: int = 5,
    policies: tuple[str, ...] = ("fixed", "heuristic", "adaptive"),
    include_assisted: bool = True,
    include_lookup: bool = True,
    include_compiled: bool = True,
    include_mmspec_compiled: bool = False,
    repeats: int = 3,
    title: str = "bench text",
    progress: bool = True,
) -> BenchReport:
    # Hooks only while a transformers row runs: mmspec's rows count their own forwards, and run hook-free as users do.
    target_counter, drafter_counter = ForwardCounter(target, attached=False), ForwardCounter(drafter, attached=False)
    methods: dict[str, MethodFn] = {"plain-greedy": plain_greedy(target, max_new_tokens, target_counter)}
    longest = max(int(p.shape[1]) for p in prompts)
    compile_seconds: dict[str, float] = {}
    if include_compiled:
        methods["generate-static-compiled"] = static_compiled_greedy(target, max_new_tokens, longest + max_new_tokens,
                                                                     target_counter)
        start = time.perf_counter()  # its first call compiles: time it apart from the timed passes
        with torch.inference_mode():
            methods["generate-static-compiled"](prompts[0])
        compile_seconds["generate-static-compiled"] = time.perf_counter() - start
    if include_mmspec_compiled:
        from .compiled import compiled_mmspec

        methods["mmspec-compiled"], compile_seconds["mmspec-compiled"] = compiled_mmspec(
            target, drafter, max_new_tokens, num_draft_tokens, longest + max_new_tokens + num_draft_tokens + 1, prompts[0])
    for policy in policies:
        decoder = SpeculativeDecoder(target, drafter, policy=make_policy(policy, num_draft_tokens), method=f"mmspec-{policy}")
        methods[f"mmspec-{policy}"] = mmspec_method(decoder, max_new_tokens)
    if include_lookup:
        lookup = SpeculativeDecoder(target, PromptLookupDrafter(), policy=make_policy("fixed", num_draft_tokens))
        methods["mmspec-prompt-lookup"] = mmspec_method(lookup, max_new_tokens)
    if include_assisted:
        for schedule in ("constant", "heuristic"):
            methods[f"hf-assisted-{schedule}"] = hf_assisted(
                target, drafter, max_new_tokens, num_draft_tokens, schedule, target_counter, drafter_counter
            )
    try:
        with torch.inference_mode():
            return run_benchmark(
                title, methods, prompts, reference="plain-greedy", repeats=repeats, progress=progress,
                settings={"prompts": len(prompts), "max_new_tokens": max_new_tokens, "k": num_draft_tokens,
                          "repeats": repeats, "threads": torch.get_num_threads(),
                          # first calls, compiling included, before the timed passes
                          **{f"compile_s[{name}]": round(seconds, 1) for name, seconds in compile_seconds.items()}},
            )
    finally:
        target_counter.close()
        drafter_counter.close()


def inert_layer_pair(base: PreTrainedModel, drafter_layers: int) -> tuple[PreTrainedModel, PreTrainedModel]:
    """A target whose layers past `drafter_layers` are inert (zeroed output projections, so each is
    the identity through its residual) and a drafter made of its first layers: they agree on
    every token while the target still pays for all its layers. Measures pure loop overhead."""
    import copy

    target = copy.deepcopy(base).eval()
    with torch.no_grad():
        for layer in target.model.layers[drafter_layers:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    drafter = copy.deepcopy(target)
    drafter.model.layers = drafter.model.layers[:drafter_layers]
    drafter.config.num_hidden_layers = drafter_layers
    return target, drafter
