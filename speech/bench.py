"""`mmspec bench speech`: transcription methods side by side on the same held-out clips, in one process.

Hybrid Decoding (Lim et al., "Hybrid Decoding: Rapid Pass and Selective Detailed Correction for
Sequence Models", arXiv 2508.19671) claims speed at equal WER and fewer repetition errors; this
bench measures both against plain greedy decoding and transformers' assisted generation:

  plain-greedy       the model's own `generate` (greedy; the reference for "identical")
  greedy-loop        mmspec's loop with no drafter (plain greedy through WhisperTarget: loop overhead, and the
                     certified head: each step's argmax from a bfloat16 head product, `mmspec.kernels.certified_head`)
  hybrid-strict      CTC fast decoder draft + verification, exact greedy match (lossless)
  hybrid-relaxed     the same with `relaxed_top_r_rule` (top-3, 2-nat margin; not lossless)
  hybrid-strict-ar   the AR fast decoder as the pipeline uses it: its whole hypothesis as the draft, or
                     re-drafting as its config says (`draft_redraft`, `draft_redraft_tokens`) (lossless)
  hybrid-strict-ar-f32head   hybrid-strict-ar with the model's own float32 head in every verification
  hybrid-strict-ar-whole     when the config re-drafts: the whole hypothesis, once per utterance
  hybrid-strict-ar-redraft   the same, but after a rejection the fast decoder drafts the rest
                     again from the corrected transcript (`ARHybridDrafter(redraft=True)`)
  hybrid-strict-ar-chainK    with `--chain K`: re-drafting capped at K tokens, every round (a chain
                     drafter over one cache per utterance, `ARHybridDrafter(redraft=True, redraft_tokens=K)`)
  feature-chainK     the feature drafter (EAGLE-style, `feature_drafter.py`): K drafts a round from the
                     model's own top-layer features (K: `--chain`, else the drafter's `draft_tokens`)
  hf-assisted-ar     transformers' assisted generation, the same AR fast decoder as assistant
                     (its defaults: 20 draft tokens, constant schedule, confidence cut-off 0.4)
  faster-whisper-float32, faster-whisper-int8
                     faster-whisper (CTranslate2) on the same folder, greedy, the bench's threads
                     (`speech/peers.py`; when faster_whisper imports and the model is a CTranslate2 folder)

Two other measurements share the command: `--long-audio-minutes N` / `--long-audio FILE` (one long recording through
mmspec's long-audio path vs faster-whisper's long-form paths, `speech/long_bench.py`) and `--startup` (a one-off
transcription as a whole process vs a faster-whisper script, `speech/startup_bench.py`).

`compute_type` (float32, bfloat16, int8; `speech/precision.py`) sets the precision of every mmspec row and
of the reference: "identical" then means the same tokens as that precision's own greedy `generate`.

Every method transcribes each clip from its file: audio decoding, features, the encoder (once),
decoding, detokenising; that whole call is the "transcription" time. The "decoder" time is the
decoding alone (drafter included), from the encoder output to the tokens; the "encoder" time is the
encoder's forward; "CPU" is the process's CPU time over the call (`time.process_time`, every thread). All are
medians over interleaved repetitions of the total over all clips (mmspec/bench/harness.py).

Quality, per method:
  - WER with jiwer over the whole set, after normalising both sides: lowercase, punctuation
    (Unicode category P) removed, whitespace collapsed (`normalise`);
  - repetitions: immediately repeated word n-grams (n = 1..4, "the the", "a b a b") in the
    output, beyond those the reference itself has (`repetition_count`).
Decoder passes count forwards of the big decoder, Whisper's one-step language detection included;
tau is new tokens (end-of-text included) per big-decoder pass, detection excluded.

Every method decodes at most one token fewer than the decoder's positions allow after the prompt:
at exactly the limit transformers' Whisper `generate` runs a second decoding pass when no
end-of-text came, which would make the reference differ from plain greedy decoding.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from ..bench.harness import BenchReport, ForwardCounter, TableReport, quiet_transformers, run_benchmark, span
from ..decoding import SpeculativeDecoder
from ..drafters import Drafter, NoDrafter
from ..errors import MMSpecError
from ..stats import SpecStats
from .ar_fast_decoder import AR_FAST_DECODER_FOLDER, ARFastDecoder, attach_ar_fast_decoder
from .fast_decoder import CTCFastDecoder
from .feature_drafter import (
    FEATURE_DRAFTER_FOLDER,
    WhisperFeatureDrafter,
    WhisperFeatureDrafterModel,
    load_feature_drafter,
)
from .features import DEFAULT_FEATURE_PADDING, check_feature_padding
from .hybrid import hybrid_drafter_for, hybrid_policy, hybrid_rule
from .pipeline import FAST_DECODER_FOLDER, check_fast_decoder, load_fast_decoder, load_whisper
from .precision import apply_compute_type, check_compute_type, compute_type_of
from .target import WhisperTarget, whisper_prompt_ids
from .train_fast import Clip, clip_features, read_clip_folder
from .wer import NORMALISATION, corpus_wer, normalise

REPETITION_MAX_N = 4
REFERENCE = "plain-greedy"
HF_ASSISTANT_DEFAULTS = {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant",
                         "assistant_confidence_threshold": 0.4}


# --- quality measures -------------------------------------------------------------------------------

def repeated_ngrams(words: list[str], max_n: int = REPETITION_MAX_N) -> Counter:
    """Immediately repeated word n-grams (n = 1..max_n): "go go" counts ("go",) once, "a b a b" counts ("a", "b") once."""
    found: Counter = Counter()
    for n in range(1, max_n + 1):
        for i in range(len(words) - 2 * n + 1):
            if words[i : i + n] == words[i + n : i + 2 * n]:
                found[tuple(words[i : i + n])] += 1
    return found


def repetition_count(reference: str, hypothesis: str, max_n: int = REPETITION_MAX_N) -> int:
    """Repeated n-grams in the hypothesis beyond those in the reference (both normalised)."""
    ref = repeated_ngrams(normalise(reference).split(), max_n)
    hyp = repeated_ngrams(normalise(hypothesis).split(), max_n)
    return sum(max(0, count - ref[gram]) for gram, count in hyp.items())


# --- the methods ------------------------------------------------------------------------------------

@dataclass
class SpeechItem:
    """One held-out clip, with what every method needs to agree on."""

    index: int
    clip: Clip
    prompt_length: int
    detect_passes: int  # big-decoder passes Whisper's language detection takes on this clip (0 or 1)
    max_new_tokens: int


@dataclass
class _Call:
    tokens: list[int]
    decoder_time: float
    passes: int
    cpu_time: float = 0.0
    encoder_time: float = 0.0
    text: str | None = None  # the method's own text (a peer's); else the tokens decoded by the bench's tokenizer


Decode = Callable[[BaseModelOutput, SpeechItem], tuple[list[int], SpecStats]]


class _Method:
    """Runs one method on a clip from its file and records tokens, decoder time and big-decoder passes.

    `counts_own_forwards`: the method's stats already count target forwards (mmspec's loop); else
    they are the measured passes less language detection (transformers' `generate`).
    """

    def __init__(self, name: str, model: PreTrainedModel, processor: Any, counter: ForwardCounter, decode: Decode,
                 counts_own_forwards: bool, feature_padding: str = DEFAULT_FEATURE_PADDING) -> None:
        self.name, self.model, self.processor, self.counter, self.decode = name, model, processor, counter, decode
        self.feature_padding = feature_padding
        self.counts_own_forwards = counts_own_forwards
        # An assistant that IS the model's decoder (a self-drafter) runs through the counted module too.
        self.assistant_on_counted_decoder = False
        self.calls: list[_Call] = []

    def __call__(self, item: SpeechItem) -> tuple[list[int], SpecStats]:
        cpu = time.process_time()
        features = clip_features(self.processor, item.clip.path, self.feature_padding).to(device=self.model.device,
                                                                                          dtype=self.model.dtype)
        start = time.perf_counter()
        states = self.model.get_encoder()(features, return_dict=True).last_hidden_state
        encoder_time = time.perf_counter() - start
        encoder_outputs = BaseModelOutput(last_hidden_state=states)
        self.counter.take()
        start = time.perf_counter()
        tokens, stats = self.decode(encoder_outputs, item)
        elapsed = time.perf_counter() - start
        passes = self.counter.take()
        if self.assistant_on_counted_decoder:
            passes -= stats.drafter_forwards
        self.processor.tokenizer.decode(tokens, skip_special_tokens=True)  # part of a transcription's cost
        self.calls.append(_Call(tokens, elapsed, passes, time.process_time() - cpu, encoder_time))
        stats.method = self.name
        if not self.counts_own_forwards:
            stats.target_forwards = passes - item.detect_passes
        return tokens, stats


class _PeerMethod:
    """A faster-whisper row (`peers.FasterWhisperPeer`) in the harness: same clips, same interface as `_Method`.
    Its decoder passes are not counted by faster-whisper: greedy decoding takes one per token (end-of-text included)."""

    counts_own_forwards = False

    def __init__(self, peer: Any, processor: Any) -> None:
        self.name, self.peer, self.processor = peer.name, peer, processor
        self.calls: list[_Call] = []

    def __call__(self, item: SpeechItem) -> tuple[list[int], SpecStats]:
        call = self.peer.transcribe(item.clip.path)
        self.calls.append(_Call(call.tokens, call.decoder_time, len(call.tokens), call.cpu_time, call.encoder_time,
                                call.text))
        stats = SpecStats(method=self.name, new_tokens=len(call.tokens), target_forwards=len(call.tokens),
                          total_time=call.wall_time)
        return call.tokens, stats


def hf_generate(model: PreTrainedModel, assistant: ARFastDecoder | None = None,
                assistant_counter: ForwardCounter | None = None) -> Decode:
    """transformers' Whisper `generate`, greedy, optionally with `assistant` (assisted generation)."""

    def decode(encoder_outputs: BaseModelOutput, item: SpeechItem) -> tuple[list[int], SpecStats]:
        kwargs: dict[str, Any] = {}
        if assistant is not None:
            # Set on every call: transformers keeps (and may adapt) these on the assistant between calls.
            for key, value in HF_ASSISTANT_DEFAULTS.items():
                setattr(assistant.generation_config, key, value)
            kwargs["assistant_model"] = assistant
            if assistant_counter is not None:
                assistant_counter.take()
        start = time.perf_counter()
        sequences = model.generate(encoder_outputs=encoder_outputs, do_sample=False, max_new_tokens=item.max_new_tokens,
                                   return_dict_in_generate=True, **kwargs).sequences
        stats = SpecStats(total_time=time.perf_counter() - start)
        tokens = sequences[0, item.prompt_length:].tolist()
        stats.new_tokens = len(tokens)
        if assistant_counter is not None:
            stats.drafter_forwards = assistant_counter.take()
        return tokens, stats

    return decode


def mmspec_loop(model: PreTrainedModel, make_drafter: Callable[[], Drafter], mode: str = "strict",
                draft_tokens: int | None = None, certified_head: bool = True, compile: bool = False,
                counter: ForwardCounter | None = None) -> Decode:
    """mmspec's loop on a `WhisperTarget` (the forced prompt, language detection included, built inside);
    `draft_tokens` caps the drafts a round (None: the hybrid default); `certified_head=False` keeps the
    model's float32 head in greedy verification; `compile`: the static-shape path (`speech/static_target.py`), whose
    compiled decoder steps `counter` (the decoder's pass counter) is told of: they run without the decoder's hooks."""
    policy = hybrid_policy() if draft_tokens is None else hybrid_policy(draft_tokens)

    def decode(encoder_outputs: BaseModelOutput, item: SpeechItem) -> tuple[list[int], SpecStats]:
        target = WhisperTarget(model)
        target.use_certified_head = certified_head
        decoder = SpeculativeDecoder(target, make_drafter(), policy=policy, rule=hybrid_rule(mode), compile=compile)
        out = decoder.generate(None, max_new_tokens=item.max_new_tokens, encoder_outputs=encoder_outputs)
        if counter is not None:
            counter.count += getattr(out.target, "compiled_forwards", 0)
        return out.sequences[0, item.prompt_length:].tolist(), out.stats

    return decode


# --- the report -------------------------------------------------------------------------------------

@dataclass
class SpeechMethodRow:
    method: str
    wer: float
    repetitions: int
    decoder_passes_per_utterance: float
    tau: float
    alpha: float | None
    drafter_forwards: int
    new_tokens: int
    decoder_time_s: float
    transcription_time_s: float
    cpu_time_s: float
    encoder_time_s: float
    decoder_speed_up: float
    transcription_speed_up: float
    identical_to_greedy: bool
    mismatched_outputs: int
    transcription_times_s: list[float] = field(default_factory=list)  # per repetition, for the min-max column


@dataclass
class SpeechBenchReport(TableReport):
    title: str
    rows: list[SpeechMethodRow]
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    transcripts: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # the harness's spread warning, when repetitions disagree

    def row(self, method: str) -> SpeechMethodRow:
        return next(r for r in self.rows if r.method == method)

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "reference": REFERENCE, "settings": self.settings, "notes": self.notes,
                "methods": [asdict(r) for r in self.rows]}

    def to_table(self) -> str:
        header = (f"{'method':<24} {'WER':>6} {'reps':>5} {'passes/utt':>10} {'tau':>5} {'alpha':>5} {'drf fwd':>7} {'encoder s':>9} "
                  f"{'decoder s':>9} {'speed-up':>8} {'total s':>8} {'min-max s':>15} {'speed-up':>8} {'CPU s':>7}  identical")
        lines = self.table_head(header)
        for r in self.rows:
            alpha = f"{r.alpha:.2f}" if r.alpha is not None else "-"
            same = "yes" if r.identical_to_greedy else f"NO ({r.mismatched_outputs})"
            lines.append(f"{r.method:<24} {r.wer:>6.1%} {r.repetitions:>5} {r.decoder_passes_per_utterance:>10.1f} {r.tau:>5.2f} "
                         f"{alpha:>5} {r.drafter_forwards:>7} {r.encoder_time_s:>9.3f} {r.decoder_time_s:>9.3f} "
                         f"{r.decoder_speed_up:>7.2f}x "
                         f"{r.transcription_time_s:>8.3f} {span(r.transcription_times_s):>15} {r.transcription_speed_up:>7.2f}x "
                         f"{r.cpu_time_s:>7.3f}  {same}")
        lines.append(f"(WER after normalising: {NORMALISATION}; reps = immediately repeated word 1..{REPETITION_MAX_N}-grams "
                     "beyond the reference's; passes include language detection; times are medians over repetitions of "
                     "the total over all clips, CPU s beside them; identical = same tokens as plain-greedy)")
        lines.append(", ".join(f"{k}={v}" for k, v in self.settings.items() if k not in ("normalisation", "hf_assistant")))
        lines.extend(f"note: {note}" for note in self.notes)
        lines.extend(f"warning: {line}" for line in self.warnings)
        return "\n".join(lines)


# --- running ----------------------------------------------------------------------------------------

@torch.inference_mode()
def prepare_items(model: PreTrainedModel, processor: Any, clips: list[Clip],
                  feature_padding: str = DEFAULT_FEATURE_PADDING) -> list[SpeechItem]:
    """Prompt length, language-detection cost and decoding limit per clip (one encoder pass each)."""
    counter = ForwardCounter(model.get_decoder())
    items = []
    try:
        for index, clip in enumerate(clips):
            features = clip_features(processor, clip.path, feature_padding).to(device=model.device, dtype=model.dtype)
            states = model.get_encoder()(features, return_dict=True).last_hidden_state
            counter.take()
            prompt = whisper_prompt_ids(model, {"encoder_outputs": BaseModelOutput(last_hidden_state=states)})
            limit = max(1, model.config.max_target_positions - prompt.shape[1] - 1)  # see the module docstring
            items.append(SpeechItem(index, clip, prompt.shape[1], counter.take(), limit))
    finally:
        counter.close()
    return items


def bench_speech(
    model: PreTrainedModel,
    processor: Any,
    clips: list[Clip],
    *,
    ctc_fast_decoder: CTCFastDecoder | None = None,
    ar_fast_decoder: ARFastDecoder | None = None,
    chain_tokens: tuple[int, ...] = (),
    feature_drafter: WhisperFeatureDrafterModel | None = None,
    repeats: int = 3,
    progress: bool = True,
    title: str = "bench speech",
    peers: Sequence[Any] = (),
    notes: list[str] | None = None,
    only: Sequence[str] | None = None,
    feature_padding: str = DEFAULT_FEATURE_PADDING,
    compile: bool = False,
) -> SpeechBenchReport:
    """Run every available method over `clips` (see the module docstring) and report them side by side;
    `peers` (loaded `peers.FasterWhisperPeer`s) run as rows of their own, interleaved with mmspec's; `only`: the
    rows to run (the reference always runs), None for all; `feature_padding`: how mmspec's rows pad a clip's
    log-mel features (`speech/features.py`; the peers compute their own). `compile`: a " compiled" twin of the
    greedy loop and the strict hybrid rows (`speech/bench_compiled.py`), compiled before the timed passes."""
    if not clips:
        raise MMSpecError("no clips to benchmark")
    if repeats < 1:
        raise MMSpecError(f"repeats must be >= 1, got {repeats}")
    if any(k < 1 for k in chain_tokens):
        raise MMSpecError(f"chain lengths must be >= 1, got {','.join(map(str, chain_tokens))}")
    if chain_tokens and ar_fast_decoder is None and feature_drafter is None:
        raise MMSpecError("--chain drafts with an AR fast decoder or a feature drafter: pass --ar-fast-decoder or "
                          "--feature-drafter (or use a model that ships one)")
    model.eval()
    given_notes, notes = list(notes or []), []
    if ctc_fast_decoder is not None:
        check_fast_decoder(ctc_fast_decoder, model)
    if ar_fast_decoder is not None:
        attach_ar_fast_decoder(ar_fast_decoder, model)
    with quiet_transformers():
        items = prepare_items(model, processor, clips, feature_padding)
        decoder_counter = ForwardCounter(model.get_decoder())
        counters = [decoder_counter]
        decoders: dict[str, tuple[Decode, bool]] = {  # name -> (decode, counts its own target forwards)
            REFERENCE: (hf_generate(model), False),
            "greedy-loop": (mmspec_loop(model, NoDrafter), True),
        }
        if ctc_fast_decoder is not None:
            decoders["hybrid-strict"] = (mmspec_loop(model, lambda: hybrid_drafter_for(ctc_fast_decoder), "strict"), True)
            decoders["hybrid-relaxed"] = (mmspec_loop(model, lambda: hybrid_drafter_for(ctc_fast_decoder), "relaxed"), True)
        else:
            notes.append("no CTC fast decoder (fast_decoder/): hybrid-strict and hybrid-relaxed not run")
        if ar_fast_decoder is not None:
            # As the transcription pipeline drafts with it (its config's re-drafting), and whole hypotheses
            # when that differs.
            decoders["hybrid-strict-ar"] = (mmspec_loop(model, lambda: hybrid_drafter_for(ar_fast_decoder), "strict"), True)
            decoders["hybrid-strict-ar-f32head"] = (mmspec_loop(
                model, lambda: hybrid_drafter_for(ar_fast_decoder), "strict", certified_head=False), True)
            if getattr(ar_fast_decoder.config, "draft_redraft", False):
                decoders["hybrid-strict-ar-whole"] = (
                    mmspec_loop(model, lambda: hybrid_drafter_for(ar_fast_decoder, redraft=False), "strict"), True)
            decoders["hybrid-strict-ar-redraft"] = (mmspec_loop(
                model, lambda: hybrid_drafter_for(ar_fast_decoder, redraft=True, redraft_tokens=None), "strict"), True)
            for k in chain_tokens:
                decoders[f"hybrid-strict-ar-chain{k}"] = (mmspec_loop(
                    model, lambda k=k: hybrid_drafter_for(ar_fast_decoder, redraft=True, redraft_tokens=k), "strict"), True)
            assistant_counter = ForwardCounter(ar_fast_decoder)
            counters.append(assistant_counter)
            decoders["hf-assisted-ar"] = (hf_generate(model, ar_fast_decoder, assistant_counter), False)
        else:
            notes.append(f"no AR fast decoder ({AR_FAST_DECODER_FOLDER}/): hybrid-strict-ar and hf-assisted-ar not run")
        if feature_drafter is not None:
            feature_drafter.bind_target(model)
            for k in chain_tokens or (feature_drafter.config.draft_tokens,):
                decoders[f"feature-chain{k}"] = (mmspec_loop(
                    model, lambda: WhisperFeatureDrafter(feature_drafter), "strict", draft_tokens=k), True)
        if compile:
            from .bench_compiled import compile_decoder, compiled_twins

            drafters: dict[str, Callable[[], Drafter]] = {"greedy-loop": NoDrafter}
            if ctc_fast_decoder is not None:
                drafters["hybrid-strict"] = lambda: hybrid_drafter_for(ctc_fast_decoder)
            if ar_fast_decoder is not None:
                drafters["hybrid-strict-ar"] = lambda: hybrid_drafter_for(ar_fast_decoder)
            if only is not None:
                drafters = {name: make for name, make in drafters.items() if f"{name} compiled" in only}
            twins = compiled_twins(drafters, lambda make: mmspec_loop(model, make, compile=True, counter=decoder_counter))
            decoders.update({name: (decode, True) for name, decode in twins.items()})
            if twins:
                seconds = compile_decoder(model, greedy_only=list(drafters) == ["greedy-loop"])
                notes.append(f"compiled rows: the decoder's graphs were compiled before timing, in {seconds:.0f} s")
        methods: dict[str, _Method | _PeerMethod] = {
            name: _Method(name, model, processor, decoder_counter, decode, own, feature_padding)
            for name, (decode, own) in decoders.items()}
        for peer in peers:
            methods[peer.name] = _PeerMethod(peer, processor)
        if only is not None:
            unknown = sorted(set(only) - set(methods))
            if unknown:
                raise MMSpecError(f"no row {', '.join(map(repr, unknown))} in this bench; its rows: {', '.join(methods)}")
            methods = {name: m for name, m in methods.items() if name in only or name == REFERENCE}
        if "hf-assisted-ar" in methods and ar_fast_decoder is not None:
            methods["hf-assisted-ar"].assistant_on_counted_decoder = ar_fast_decoder.shares_target_decoder
        try:
            with torch.inference_mode():
                harness = run_benchmark(title, dict(methods), items, reference=REFERENCE, repeats=repeats, progress=progress)
        finally:
            for counter in counters:
                counter.close()
    return _report(title, harness, methods, items, repeats, notes + given_notes, model, feature_padding)


def _report(title: str, harness: BenchReport, methods: dict[str, _Method | _PeerMethod], items: list[SpeechItem], repeats: int,
            notes: list[str], model: PreTrainedModel, feature_padding: str = DEFAULT_FEATURE_PADDING) -> SpeechBenchReport:
    warm = min(len(items), 2)  # the harness warms up on the first two inputs, once per method
    references = [item.clip.text for item in items]
    decoder_times: dict[str, float] = {}
    cpu_times: dict[str, float] = {}
    encoder_times: dict[str, float] = {}
    transcripts: dict[str, list[str]] = {}
    passes: dict[str, int] = {}
    for name, method in methods.items():
        timed = method.calls[warm:]
        if len(timed) != repeats * len(items):
            raise RuntimeError(f"{name}: expected {repeats * len(items)} timed calls, got {len(timed)}")
        reps = [timed[r * len(items):(r + 1) * len(items)] for r in range(repeats)]
        decoder_times[name] = statistics.median(sum(c.decoder_time for c in rep) for rep in reps)
        cpu_times[name] = statistics.median(sum(c.cpu_time for c in rep) for rep in reps)
        encoder_times[name] = statistics.median(sum(c.encoder_time for c in rep) for rep in reps)
        first = timed[: len(items)]
        passes[name] = sum(c.passes for c in first)
        tokenizer = method.processor.tokenizer
        transcripts[name] = [c.text if c.text is not None else tokenizer.decode(c.tokens, skip_special_tokens=True).strip()
                             for c in first]
    base = next(r for r in harness.results if r.name == REFERENCE)
    rows = []
    for result in harness.results:
        name, stats = result.name, result.stats
        rows.append(SpeechMethodRow(
            method=name,
            wer=corpus_wer(references, transcripts[name]),
            repetitions=sum(repetition_count(r, h) for r, h in zip(references, transcripts[name])),
            decoder_passes_per_utterance=passes[name] / len(items),
            tau=stats.tau,
            alpha=stats.alpha if stats.drafted else None,
            drafter_forwards=stats.drafter_forwards,
            new_tokens=stats.new_tokens,
            decoder_time_s=decoder_times[name],
            transcription_time_s=result.median_wall_time,
            cpu_time_s=cpu_times[name],
            encoder_time_s=encoder_times[name],
            decoder_speed_up=decoder_times[REFERENCE] / decoder_times[name] if decoder_times[name] else 0.0,
            transcription_speed_up=base.median_wall_time / result.median_wall_time if result.median_wall_time else 0.0,
            identical_to_greedy=result.identical,
            mismatched_outputs=result.mismatches,
            transcription_times_s=list(result.wall_times),
        ))
    settings = {"clips": len(items), "repeats": repeats, "threads": torch.get_num_threads(),
                "max_new_tokens": max(i.max_new_tokens for i in items), "relaxed_rule": "top-3, margin 2 nats",
                "compute_type": compute_type_of(model), "feature_padding": feature_padding, "normalisation": NORMALISATION,
                "hf_assistant": dict(HF_ASSISTANT_DEFAULTS)}
    if any(isinstance(m, _PeerMethod) for m in methods.values()):
        notes.append("faster-whisper rows: their decoder passes are not counted by faster-whisper (greedy: one per token); "
                     "decoder s = the call after its features, less its encoder")
    if "hf-assisted-ar" in methods and model.generation_config.begin_suppress_tokens:
        notes.append("transformers' assisted generation for Whisper drops begin_suppress_tokens (the first generated token "
                     "is not suppressed), so hf-assisted-ar may differ from plain greedy at the first token")
    return SpeechBenchReport(title=title, rows=rows, settings=settings, notes=notes, transcripts=transcripts,
                             warnings=harness.warnings())


def default_heldout(model_path: str) -> Path:
    """The held-out clips shipped with a (zoo) model folder: `MODEL/heldout/metadata.jsonl`."""
    return Path(model_path) / "heldout"


def run_speech_bench(
    model_name: str,
    *,
    data: str | Path | None = None,
    n: int = 20,
    repeats: int = 3,
    fast_decoder: str | Path | None = None,
    ar_fast_decoder: str | Path | None = None,
    progress: bool = True,
    batch_sizes: tuple[int, ...] | None = None,
    chain_tokens: tuple[int, ...] = (),
    feature_drafter: str | Path | None = None,
    compute_type: str | None = None,
    peers: bool = True,
    only: Sequence[str] | None = None,
    feature_padding: str | None = None,
    compile: bool = False,
) -> Any:
    """Load a Whisper model (zoo name, folder, offline Hub id) and its fast decoders, read the clips, bench
    (with `batch_sizes`: plain batched `generate` vs the methods that batch, `speech/bench_batches.py`).

    `compute_type`: the precision of mmspec's rows (`speech/precision.py`; default float32). `peers`: add the
    faster-whisper rows when faster_whisper imports and the model is a CTranslate2 folder (`speech/peers.py`).
    `only`: the rows to run (plus the reference), e.g. ("hybrid-strict-ar", "faster-whisper-int8"). `compile`: the
    compiled twins of the greedy and strict hybrid rows (`speech/bench_compiled.py`)."""
    from .models import fast_decoder_root, speech_model_path

    if n < 1:
        raise MMSpecError(f"--n must be >= 1, got {n}")
    if batch_sizes and (chain_tokens or feature_drafter is not None):
        raise MMSpecError("the --chain and --feature-drafter rows decode one recording at a time: they do not combine "
                          "with --batch-size")
    if batch_sizes and compile:
        raise MMSpecError("--compile decodes one recording at a time: it does not combine with --batch-size")
    compute_type = check_compute_type(compute_type)
    feature_padding = check_feature_padding(feature_padding)
    path = speech_model_path(model_name)
    model, processor = load_whisper(model_name, path)
    model = apply_compute_type(model, compute_type)  # before a self-drafter binds the decoder's layers
    root = fast_decoder_root(model_name, path)  # a zoo entry's own folder when its weights come from a package
    if data is None:
        data = default_heldout(root)
        if not (data / "metadata.jsonl").is_file():
            raise MMSpecError(f"no --data given and {model_name!r} ships no held-out clips ({data}/metadata.jsonl is missing); "
                              "pass --data DIR, a folder with metadata.jsonl and its clips")
    clips = read_clip_folder(data)[:n]
    ctc = _optional(fast_decoder, root / FAST_DECODER_FOLDER, load_fast_decoder)
    ar = _optional(ar_fast_decoder, root / AR_FAST_DECODER_FOLDER, load_fast_decoder)
    if ctc is not None and not isinstance(ctc, CTCFastDecoder):
        raise MMSpecError("--fast-decoder holds an AR fast decoder; pass it as --ar-fast-decoder")
    if ar is not None and not isinstance(ar, ARFastDecoder):
        raise MMSpecError("--ar-fast-decoder holds a CTC fast decoder; pass it as --fast-decoder")
    feature = _optional(feature_drafter, root / FEATURE_DRAFTER_FOLDER, load_feature_drafter)
    if ctc is not None:
        ctc = ctc.to(dtype=model.dtype)
    if feature is not None and compute_type == "bfloat16":
        feature = feature.to(dtype=model.dtype)
    title = f"bench speech: {model_name} ({compute_type}) on {len(clips)} clips from {data}"
    if batch_sizes:
        from .bench_batches import bench_speech_batches

        return bench_speech_batches(model, processor, clips, batch_sizes, ctc_fast_decoder=ctc, ar_fast_decoder=ar,
                                    repeats=repeats, progress=progress, title=title, feature_padding=feature_padding)
    peer_rows, notes = peer_models(path, model, peers)
    return bench_speech(model, processor, clips, ctc_fast_decoder=ctc, ar_fast_decoder=ar, chain_tokens=chain_tokens,
                        feature_drafter=feature, repeats=repeats, progress=progress, title=title, peers=peer_rows, notes=notes,
                        only=only, feature_padding=feature_padding, compile=compile)


def peer_models(path: str, model: PreTrainedModel, wanted: bool) -> tuple[list[Any], list[str]]:
    """The faster-whisper rows for the model folder `path` (float32 and int8, the bench's threads), or a note why none."""
    from .ctranslate2 import is_ct2_whisper_folder
    from .peers import MISSING, PEER_COMPUTE_TYPES, FasterWhisperPeer, faster_whisper_available

    if not wanted:
        return [], []
    if not faster_whisper_available():
        return [], [MISSING]
    if not is_ct2_whisper_folder(path):
        return [], [f"{path} is not a CTranslate2 folder, which faster-whisper reads: the faster-whisper rows were not run"]
    eot = int(model.generation_config.eos_token_id)
    return [FasterWhisperPeer(path, ct, torch.get_num_threads(), eot) for ct in PEER_COMPUTE_TYPES], []


def _optional(given: str | Path | None, default: Path, load: Callable[[Any], Any]) -> Any:
    if given is not None:
        return load(given)
    return load(default) if default.is_dir() else None
