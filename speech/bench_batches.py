"""`mmspec bench speech --batch-size`: plain batched Whisper `generate` vs mmspec's methods that decode batches.

Clips are cut into batches of each size (their log-mel features stacked, their decoder prompts too); every
method runs every batch through `mmspec.bench.batches.run_batch_sizes`, so the report is the one `bench text
--batch-size` prints. A method runs only when its target and drafter decode batches (`WhisperTarget.
decodes_batches`, the drafter's `drafts_batches`); while none does, the bench says so in one line.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from transformers import PreTrainedModel

from ..bench.batches import BatchSizeReport, new_token_count, run_batch_sizes
from ..bench.harness import ForwardCounter, MethodFn, quiet_transformers
from ..decoding import SpeculativeDecoder, eos_ids
from ..drafters import Drafter, NoDrafter
from ..errors import MMSpecError
from ..pipeline_batches import batching_refusal
from ..stats import SpecStats
from .ar_fast_decoder import ARFastDecoder, attach_ar_fast_decoder
from .fast_decoder import CTCFastDecoder
from .features import DEFAULT_FEATURE_PADDING
from .hybrid import hybrid_drafter_for, hybrid_policy, hybrid_rule
from .target import WhisperTarget, whisper_prompt_ids
from .train_fast import Clip, clip_features

SpeechBatch = tuple[torch.Tensor, torch.LongTensor]  # input_features [B, mel, frames], decoder prompts [B, P]


def speech_batches(model: PreTrainedModel, processor: Any, clips: list[Clip], size: int,
                   feature_padding: str = DEFAULT_FEATURE_PADDING) -> list[SpeechBatch]:
    features = [clip_features(processor, clip.path, feature_padding).to(device=model.device, dtype=model.dtype) for clip in clips]
    prompts = [whisper_prompt_ids(model, {"input_features": f}) for f in features]
    batches = []
    for start in range(0, len(clips), size):
        group = prompts[start:start + size]
        if len({tuple(p[0].tolist()) for p in group}) > 1:
            raise MMSpecError("the clips of a batch get different decoder prompts (languages): pass clips of one language")
        batches.append((torch.cat(features[start:start + size]), torch.cat(group)))
    return batches


def plain_batched(model: PreTrainedModel, max_new_tokens: int, counter: ForwardCounter) -> MethodFn:
    stops = eos_ids(model, None)

    def run(batch: SpeechBatch) -> tuple[list[int], SpecStats]:
        features, prompts = batch
        counter.take()
        start = time.perf_counter()
        out = model.generate(input_features=features, decoder_input_ids=prompts, do_sample=False,
                             max_new_tokens=max_new_tokens, return_dict_in_generate=True).sequences
        stats = SpecStats(method="plain-batched", total_time=time.perf_counter() - start)
        new = out[:, prompts.shape[1]:]
        stats.new_tokens = new_token_count(new, stops)
        stats.target_forwards = counter.take() * prompts.shape[0]  # per row, as mmspec's batch stats count them
        return new.flatten().tolist(), stats

    return run


def mmspec_batched(model: PreTrainedModel, make_drafter: Callable[[], Drafter], name: str, max_new_tokens: int,
                   mode: str = "strict") -> MethodFn:
    def run(batch: SpeechBatch) -> tuple[list[int], SpecStats]:
        features, prompts = batch
        decoder = SpeculativeDecoder(WhisperTarget(model), make_drafter(), policy=hybrid_policy(), rule=hybrid_rule(mode),
                                     method=name)
        out = decoder.generate(None, max_new_tokens=max_new_tokens, decoder_input_ids=prompts, input_features=features)
        return out.sequences[:, prompts.shape[1]:].flatten().tolist(), out.stats

    return run


def batching_speech_methods(model: PreTrainedModel, ctc_fast_decoder: CTCFastDecoder | None,
                            ar_fast_decoder: ARFastDecoder | None) -> tuple[dict[str, Callable[[], Drafter]], list[str]]:
    """mmspec's speech methods that decode batches (name -> drafter factory), and why each other one does not."""
    candidates: dict[str, Callable[[], Drafter]] = {"greedy-loop": NoDrafter}
    if ctc_fast_decoder is not None:
        candidates["hybrid-strict"] = lambda: hybrid_drafter_for(ctc_fast_decoder)
    if ar_fast_decoder is not None:
        attach_ar_fast_decoder(ar_fast_decoder, model)
        candidates["hybrid-strict-ar"] = lambda: hybrid_drafter_for(ar_fast_decoder, redraft=False)
    target = WhisperTarget(model)
    kept, refused = {}, []
    for name, make in candidates.items():
        reason = batching_refusal(target, make(), name)
        if reason is None:
            kept[name] = make
        else:
            refused.append(f"{name}: {reason}")
    return kept, refused


def bench_speech_batches(
    model: PreTrainedModel,
    processor: Any,
    clips: list[Clip],
    batch_sizes: tuple[int, ...],
    *,
    ctc_fast_decoder: CTCFastDecoder | None = None,
    ar_fast_decoder: ARFastDecoder | None = None,
    repeats: int = 3,
    progress: bool = True,
    title: str = "bench speech (batches)",
    feature_padding: str = DEFAULT_FEATURE_PADDING,
) -> BatchSizeReport:
    if not clips:
        raise MMSpecError("no clips to benchmark")
    model.eval()
    makers, refused = batching_speech_methods(model, ctc_fast_decoder, ar_fast_decoder)
    if not makers:
        raise MMSpecError(f"--batch-size: no speech method decodes batches yet ({'; '.join(refused)}); "
                          "run bench speech without --batch-size")
    with quiet_transformers():
        features = clip_features(processor, clips[0].path, feature_padding).to(device=model.device, dtype=model.dtype)
        prompt_length = whisper_prompt_ids(model, {"input_features": features}).shape[1]
        max_new_tokens = max(1, model.config.max_target_positions - prompt_length - 1)
        counter = ForwardCounter(model.get_decoder())
        methods: dict[str, MethodFn] = {"plain-batched": plain_batched(model, max_new_tokens, counter)}
        for name, make in makers.items():
            methods[name] = mmspec_batched(model, make, name, max_new_tokens)
        try:
            return run_batch_sizes(title, methods, lambda size: speech_batches(model, processor, clips, size, feature_padding), batch_sizes,
                                   repeats=repeats, progress=progress,
                                   settings={"clips": len(clips), "max_new_tokens": max_new_tokens,
                                             "not_batching": refused})
        finally:
            counter.close()
