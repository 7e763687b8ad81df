"""`mmspec bench vision`: caption methods side by side on the same videos, in one process.

Besides the harness's numbers (tau, alpha, forwards, wall time, speed-up, identical outputs) it
reports two things that explain them:

- the share of one decoding step spent on attention over visual KV entries (measured: a step
  over the full cache vs the same step over the text KV alone);
- the decode phase alone: wall time minus prefill (vision tower + prompt prefill, the same for
  every method), against mmspec's own plain loop (`greedy-loop`). Short captions make prefill a
  large share of a plain caption, which caps any decoding method's whole-caption speed-up;
- a modelled memory-bound speed-up: bytes of weights and KV a method reads per committed token,
  plain vs method. On a GPU decoding is memory-bound and this predicts the gain; on this CPU
  small-matrix compute dominates, so the measured wall-clock speed-up is lower. Both are shown
  and labelled.

With a text-only drafter there is also an `hf-assisted k=K` row: transformers' own assisted
generation with that drafter as `assistant_model` (see `hf_assisted.py` for how the drafter is
made an assistant, and why it reads the visual placeholders that mmspec's drafter strips). When
transformers cannot run it for this model / drafter pair, the extras carry a note saying why
instead of a row.

Trained feature drafters (MSD, FLASH) get one row each, named by a label: "msd" / "flash" for
the model's own (zoo) drafters, any label for extra ablation drafters (`--extra-drafter`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from transformers import PreTrainedModel

from ..bench.harness import BenchReport, ForwardCounter, MethodFn, run_benchmark
from ..cached_model import cache_argument
from ..compat import cache_layers
from ..decoding import SpeculativeDecoder
from ..devices import synchronize
from ..drafters import NoDrafter
from ..errors import MMSpecError
from ..policies import ConfidenceStopDraftLength, DraftLengthPolicy, FixedDraftLength
from ..stats import SpecStats
from ..trees import TreeConfig
from .feature_drafter import FeatureDrafterModel
from .feature_methods import describe, runtime_drafter
from .hf_assisted import NOTE as HF_ASSISTED_NOTE
from .hf_assisted import assistant_for, hf_assisted
from .models import feature_token_ids
from .sparse_to_dense import SparseToDenseDrafter, gather_positions
from .target import VisionTarget
from .text_drafter import TextOnlyDrafter


@dataclass
class CaptionInput:
    input_ids: torch.Tensor
    model_inputs: dict[str, Any]


def plain_greedy(model: PreTrainedModel, max_new_tokens: int, counter: ForwardCounter) -> MethodFn:
    def run(item: CaptionInput) -> tuple[list[int], SpecStats]:
        counter.take()
        start = time.perf_counter()
        out = model.generate(item.input_ids, do_sample=False, max_new_tokens=max_new_tokens, **item.model_inputs)
        stats = SpecStats(method="plain", total_time=time.perf_counter() - start)
        stats.new_tokens = out.shape[1] - item.input_ids.shape[1]
        stats.target_forwards = counter.take()
        return out[0, item.input_ids.shape[1]:].tolist(), stats

    return run


def speculative(model: PreTrainedModel, make_drafter, k: int, max_new_tokens: int, name: str,
                tree: TreeConfig | None = None, policy: DraftLengthPolicy | None = None, compile: bool = False) -> MethodFn:
    """A row of mmspec's loop: `k` drafts per round, or `policy` when given; `compile`: the static-shape path."""
    target = VisionTarget(model)

    def run(item: CaptionInput) -> tuple[list[int], SpecStats]:
        rounds = policy.fresh() if policy is not None else FixedDraftLength(k)
        decoder = SpeculativeDecoder(target, make_drafter(), policy=rounds, method=name, tree=tree, compile=compile)
        out = decoder.generate(item.input_ids, max_new_tokens=max_new_tokens, **item.model_inputs)
        return out.sequences[0, item.input_ids.shape[1]:].tolist(), out.stats

    return run


def visual_attention_share(model: PreTrainedModel, item: CaptionInput, repeats: int = 20) -> dict[str, float]:
    """Time of one decoding step over the full prompt cache vs over its text entries only."""
    target = VisionTarget(model)
    with torch.inference_mode():
        target.start(item.input_ids, **item.model_inputs)
        dense = target.cache
        length = dense.get_seq_length()
        device = item.input_ids.device
        ids = torch.tensor(sorted(feature_token_ids(model)), device=device)
        text = (~torch.isin(item.input_ids[0], ids)).nonzero().flatten()
        token = item.input_ids[:, -1:]
        position = torch.tensor([[length]], device=device)

        def step_time(cache_factory) -> float:
            times = []
            for _ in range(repeats):
                cache = cache_factory()
                kv_length = cache.get_seq_length() + 1
                mask = torch.ones(1, 1, 1, kv_length, dtype=torch.bool, device=device)
                synchronize(device)
                start = time.perf_counter()
                model(input_ids=token, **{cache_argument(model): cache}, position_ids=position, attention_mask=mask,
                      use_cache=True, logits_to_keep=1)
                synchronize(device)
                times.append(time.perf_counter() - start)
            return sorted(times)[len(times) // 2]

        def copy_of(positions: torch.Tensor):
            from transformers import DynamicCache

            cache = DynamicCache()
            for i, (keys, values) in enumerate(cache_layers(dense)):
                index = positions.to(keys.device).view(1, 1, -1).expand(keys.shape[0], keys.shape[1], -1)
                cache.update(gather_positions(keys, index), gather_positions(values, index), i)
            return cache

        everything = torch.arange(length, device=device)
        full = step_time(lambda: copy_of(everything))
        text_only = step_time(lambda: copy_of(text))
    return {"step_ms_full_cache": full * 1e3, "step_ms_text_cache": text_only * 1e3,
            "visual_attention_share": max(0.0, (full - text_only) / full), "prompt_tokens": length,
            "visual_tokens": length - text.numel()}


def bytes_per_committed_token(stats: SpecStats, target_read: int, drafter_read: int = 0) -> float:
    """Memory-bound model: bytes read per committed token.

    `target_read` / `drafter_read` are the bytes one forward of each reads (weights + KV entries).
    """
    total = stats.target_forwards * target_read + stats.drafter_forwards * drafter_read
    return total / max(stats.new_tokens, 1)


def kv_bytes_per_token(config: Any) -> int:
    """fp16 K and V bytes of one token across all layers."""
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * 2


def model_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def feature_drafter_read(drafter: FeatureDrafterModel, model: PreTrainedModel, context: int, visual_tokens: int) -> int:
    """fp16 bytes one feature-drafter forward reads: its weights, the borrowed LM head and its own KV entries.

    MSD keeps a KV entry for every position (visual ones included); FLASH replaces each video's
    visual entries with `num_queries` compressed ones when `compress` is on.
    """
    config = drafter.config
    head = model.get_output_embeddings()
    entries = context
    if drafter.kind == "flash" and config.compress:
        entries = context - visual_tokens + config.num_queries
    layers = getattr(config, "num_hidden_layers", 1)
    kv_per_entry = 2 * layers * config.num_key_value_heads * config.head_dim * 2
    return model_bytes(drafter) // 2 + head.weight.numel() * 2 + kv_per_entry * entries


def bench_vision(
    model: PreTrainedModel,
    inputs: list[CaptionInput],
    *,
    drafter: PreTrainedModel | None,
    feature_drafters: Mapping[str, FeatureDrafterModel] | None = None,
    max_new_tokens: int = 48,
    num_draft_tokens: int = 5,
    std_settings: tuple[tuple[int, int], ...] = ((32, 5), (32, 9), (72, 5)),
    repeats: int = 3,
    progress: bool = True,
    title: str = "bench vision",
    tree: TreeConfig | None = None,
    confidence_stop: tuple[int, float] | None = None,
    lean_ablation: bool = False,
    compiled: bool = False,
) -> tuple[BenchReport, dict[str, Any]]:
    """Plain greedy, the text-only drafter (mmspec's loop and transformers' assisted generation),
    Sparse-to-Dense settings and each feature drafter, on `inputs`.

    `feature_drafters` maps a row label ("msd", "flash", or an ablation's name) to a trained MSD /
    FLASH drafter model for `model`; each row drafts `num_draft_tokens` per round. Returns the
    report and the extras described in the module docstring. With `tree`, the text-only drafter and every
    feature drafter that can draft trees get a second row drafting that tree instead of a chain. With
    `confidence_stop` = (K, threshold), they get a row drafting up to K tokens that stops at the first draft
    whose drafter probability is below the threshold (`ConfidenceStopDraftLength`). With `lean_ablation`, every
    text-only and feature-drafter row gets a twin (" hf-fwd") whose drafter steps through transformers' forward
    instead of `mmspec.kernels.lean_llama`: the same drafts, the cost of the call machinery. With `compiled`, every
    chain row (and the greedy loop) gets a twin (" compiled") on the static-shape path (`compile=True`), compiled
    before the timed passes; the settings report each twin's first call, compiling included.
    """
    counter = ForwardCounter(model)
    counters = [counter]
    notes: list[str] = []
    methods: dict[str, MethodFn] = {"plain-greedy": plain_greedy(model, max_new_tokens, counter),
                                    "greedy-loop": speculative(model, NoDrafter, 1, max_new_tokens, "greedy-loop")}
    assistant = None
    hf_name = f"hf-assisted k={num_draft_tokens}"
    feature_rows: dict[str, FeatureDrafterModel] = {}
    tree_feature_rows: dict[str, FeatureDrafterModel] = {}

    def add_rows(name: str, make, k: int, kind: str, net: FeatureDrafterModel | None = None, **options: Any) -> None:
        """A row drafting with make(lean=True), and with lean_ablation its twin drafting with make(lean=False)."""
        rows = [(name, True)] + ([(f"{name} hf-fwd", False)] if lean_ablation else [])
        for row, lean in rows:
            if row in methods:
                raise MMSpecError(f"two bench rows would be named {row!r}: pick another label")
            methods[row] = speculative(model, lambda lean=lean: make(lean), k, max_new_tokens, kind, **options)
            if net is not None:
                (tree_feature_rows if options.get("tree") is not None else feature_rows)[row] = net
        if compiled and options.get("tree") is None:
            methods[f"{name} compiled"] = speculative(model, lambda: make(True), k, max_new_tokens, kind, compile=True,
                                                      **options)
            if net is not None:
                feature_rows[f"{name} compiled"] = net

    def text_only(lean: bool) -> TextOnlyDrafter:
        return TextOnlyDrafter(drafter, model, lean=lean)

    if drafter is not None:
        add_rows(f"text-only k={num_draft_tokens}", text_only, num_draft_tokens, "text-only")
        assistant, assistant_counter, reason = _hf_assistant(model, drafter, inputs[0], num_draft_tokens, counter)
        if assistant is None:
            notes.append(f"{hf_name} not run: {reason}")
        else:
            counters.append(assistant_counter)
            methods[hf_name] = hf_assisted(model, assistant, num_draft_tokens, max_new_tokens, counter, assistant_counter)
            notes.append(f"{hf_name}: {HF_ASSISTED_NOTE}")
    for keep, gamma in std_settings:
        methods[f"std K={keep} gamma={gamma}"] = speculative(
            model, lambda keep=keep: SparseToDenseDrafter(model, visual_keep=keep), gamma, max_new_tokens, "std")
    for label, net in (feature_drafters or {}).items():
        add_rows(f"{label} k={num_draft_tokens}", lambda lean, net=net: runtime_drafter(net, lean=lean), num_draft_tokens,
                 net.kind, net)
    if confidence_stop is not None:
        most, threshold = confidence_stop
        stop = ConfidenceStopDraftLength(most, threshold)
        label = f"stop<{threshold:g} k<={most}"
        if drafter is not None:
            add_rows(f"text-only {label}", text_only, most, "text-only", policy=stop)
        for name, net in (feature_drafters or {}).items():
            add_rows(f"{name} {label}", lambda lean, net=net: runtime_drafter(net, lean=lean), most, net.kind, net, policy=stop)
    if tree is not None:
        shape = f"tree {tree.num_nodes},{tree.top_k},{tree.depth}"
        if drafter is not None:
            add_rows(f"text-only {shape}", text_only, num_draft_tokens, "text-only", tree=tree)
        for label, net in (feature_drafters or {}).items():
            if not runtime_drafter(net).drafts_trees:
                notes.append(f"{label}: no tree row ({net.kind} drafts chains only)")
                continue
            add_rows(f"{label} {shape}", lambda lean, net=net: runtime_drafter(net, lean=lean), num_draft_tokens, net.kind,
                     net, tree=tree)
    compile_seconds: dict[str, float] = {}
    if compiled:
        methods["greedy-loop compiled"] = speculative(model, NoDrafter, 1, max_new_tokens, "greedy-loop", compile=True)
        with torch.inference_mode():
            for name in [n for n in methods if n.endswith(" compiled")]:
                start = time.perf_counter()  # the first call compiles: timed apart from the timed passes
                methods[name](inputs[0])
                compile_seconds[f"compile_s[{name}]"] = round(time.perf_counter() - start, 1)
    try:
        with torch.inference_mode():
            report = run_benchmark(title, methods, inputs, reference="plain-greedy", repeats=repeats, progress=progress,
                                   settings={"videos": len(inputs), "max_new_tokens": max_new_tokens, "repeats": repeats,
                                             "threads": torch.get_num_threads(), "device": str(model.device),
                                             **compile_seconds})
    finally:
        for each in counters:
            each.close()

    share = visual_attention_share(model, inputs[0])
    weights = model_bytes(model) // 2  # as fp16
    visual_tokens = share["visual_tokens"]
    context = share["prompt_tokens"] + max_new_tokens // 2  # mean context over a caption
    target_read = weights + kv_bytes_per_token(model.config) * context
    modelled = {}
    for result in report.results:
        name = result.name
        if name in feature_rows or name in tree_feature_rows:
            net = feature_rows.get(name) or tree_feature_rows[name]
            drafter_read = feature_drafter_read(net, model, context, visual_tokens)
        elif name == hf_name:
            # The assistant keeps KV entries for the visual placeholders too (it reads them as tokens).
            drafter_read = model_bytes(assistant) // 2 + kv_bytes_per_token(assistant.config) * context
        elif name.startswith("text-only"):
            drafter_read = model_bytes(drafter) // 2 + kv_bytes_per_token(drafter.config) * (context - visual_tokens)
        elif name.startswith("std"):
            keep = int(name.split("K=")[1].split()[0])
            drafter_read = weights + kv_bytes_per_token(model.config) * (context - visual_tokens + keep)
        else:
            drafter_read = 0
        modelled[name] = bytes_per_committed_token(result.stats, target_read, drafter_read)
    plain_bytes = modelled["plain-greedy"]
    extras = {
        "decode_phase": decode_phase(report, baseline="greedy-loop"),
        **share,
        "modelled_bytes_per_token": modelled,
        "modelled_memory_bound_speed_up": {name: plain_bytes / b for name, b in modelled.items()},
        "feature_drafters": {name: describe(net) for name, net in feature_rows.items()},
        "notes": notes,
    }
    return report, extras


def decode_phase(report: BenchReport, baseline: str) -> dict[str, dict[str, float]]:
    """Per mmspec-loop row: median prefill and decode seconds (all inputs) and the decode-only
    speed-up over `baseline` (rows timed outside mmspec's loop have no prefill split and are left out)."""
    rows = {r.name: r for r in report.results if r.median_decode_time is not None}
    if baseline not in rows:
        return {}
    base = rows[baseline].median_decode_time
    return {name: {"prefill_s": r.median_wall_time - r.median_decode_time, "decode_s": r.median_decode_time,
                   "decode_speed_up": base / r.median_decode_time if r.median_decode_time else 0.0}
            for name, r in rows.items()}


def _hf_assistant(model: PreTrainedModel, drafter: PreTrainedModel, item: CaptionInput, k: int,
                  counter: ForwardCounter) -> tuple[PreTrainedModel | None, ForwardCounter | None, str]:
    """The assistant copy of `drafter` and its forward counter, once a short assisted call on `item` ran;
    or (None, None, why not)."""
    try:
        assistant = assistant_for(drafter, model)
    except MMSpecError as error:
        return None, None, str(error)
    assistant_counter = ForwardCounter(assistant)
    try:
        with torch.inference_mode():
            hf_assisted(model, assistant, k, 2, counter, assistant_counter)(item)
    except Exception as error:  # noqa: BLE001 - transformers refuses with ValueError, TypeError, NotImplementedError...
        assistant_counter.close()
        first = (str(error).splitlines() or [""])[0]
        return None, None, (f"transformers' assisted generation failed for {type(model).__name__}: "
                            f"{type(error).__name__}: {first}")
    return assistant, assistant_counter, ""


def bench_vision_batches(
    pipe: Any,
    videos: list[Any],
    batch_sizes: tuple[int, ...],
    *,
    max_new_tokens: int = 48,
    num_draft_tokens: int = 5,
    repeats: int = 3,
    progress: bool = True,
    title: str = "bench vision (batches)",
) -> Any:
    """Plain batched `generate` vs each of the caption pipeline's methods that decode batches (`ar`, `text`, and any
    other whose drafter batches), per batch size: the videos are cut into left-padded batches of each size, prepared
    by the pipeline's processor. Returns a `BatchSizeReport`."""
    from ..bench.batches import mmspec_batched, plain_batched, run_batch_sizes

    model = pipe.model
    target = pipe.target

    def batches_of(size: int) -> list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]:
        batches = []
        for start in range(0, len(videos), size):
            group = videos[start:start + size]
            inputs = pipe.prepare_batch_inputs("video", group, [None] * len(group))
            batches.append((inputs.pop("input_ids"), inputs.pop("attention_mask"), inputs))
        return batches

    counter = ForwardCounter(model)
    methods: dict[str, MethodFn] = {"plain-batched": plain_batched(model, max_new_tokens, counter)}
    for method in pipe.batching_methods():
        name = f"mmspec-{method}"
        decoder = SpeculativeDecoder(target, pipe.make_drafter(method), policy=FixedDraftLength(num_draft_tokens), method=name)
        methods[name] = mmspec_batched(decoder, max_new_tokens)
    try:
        return run_batch_sizes(title, methods, batches_of, batch_sizes, repeats=repeats, progress=progress,
                               settings={"videos": len(videos), "max_new_tokens": max_new_tokens, "k": num_draft_tokens})
    finally:
        counter.close()
