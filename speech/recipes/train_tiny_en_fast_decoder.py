"""Fast decoders for `whisper-tiny.en` (AR: one Whisper decoder layer; CTC: a light head), on its frozen encoder.

Data: a clip folder from `varied_speech` (standard-library docstrings, Markov text and the toy's
sentences, spoken by espeak-ng and hibari-tts) or `speech_data`. Labels: tiny.en's OWN greedy
transcripts of those clips (distillation: the draft should predict what the target will say, not
the reference text). Each clip goes through the encoder once; the states, prompts and labels are
cached (`--cache`, float16; a folder/ is written in shards and resumes) so a second run, or the
other kind, trains without the encoder.

Both kinds predict a reduced vocabulary of `--vocab-size` ids (the labels' most frequent tokens,
then the lowest byte-pair ids); the target verifies over its whole vocabulary. The AR decoder
shares tiny.en's token embedding and output head (never saved) and starts from whichever tiny.en
decoder layer (first or last) gives the lower loss on two batches; the CTC decoder is trained from
scratch. The step count is `--steps`, or a wall-time budget over the measured time of one step.
Saved in float16 with training.json.

    python -m mmspec.speech.recipes.varied_speech --out /tmp/varied-train --n 5000 --split train
    python -m mmspec.speech.recipes.train_tiny_en_fast_decoder --data /tmp/varied-train \\
        --cache /tmp/varied-train-cache/ --out /tmp/tiny-en-ar --kind ar --minutes 25 --threads 2
    python -m mmspec.speech.recipes.train_tiny_en_fast_decoder --data /tmp/varied-train \\
        --cache /tmp/varied-train-cache/ --out /tmp/tiny-en-ctc --kind ctc --minutes 15 --threads 2

`--kind feature` trains an EAGLE-style feature drafter (`mmspec.speech.feature_drafter`: one layer over
tiny.en's own top-layer features, `--chain` drafts a round; measured slower than greedy on held-out
clips after 15 minutes on 3000 clips, see BENCHMARKS.md):

    python -m mmspec.speech.recipes.train_tiny_en_fast_decoder --data /tmp/varied-train \\
        --cache /tmp/varied-train-cache/ --out /tmp/tiny-en-feature --kind feature --vocab-size 8192 --minutes 10

`--kind self` trains nothing: it writes a self-drafter (tiny.en's own decoder drafting over the
labels' `--vocab-size` most frequent tokens; a config and no weights) that re-drafts `--chain` tokens
every round, its steps through int8 copies of the decoder's weights (`--draft-weights`, made at load time).
The shipped `whisper-tiny.en/ar_fast_decoder/` is one:

    python -m mmspec.speech.recipes.train_tiny_en_fast_decoder --data /tmp/varied-train \\
        --cache /tmp/varied-train-cache/ --out /tmp/tiny-en-self --kind self --vocab-size 8192 --chain 10
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from mmspec.cached_model import model_vocab_size
from mmspec.errors import MMSpecError
from mmspec.speech.ar_fast_decoder import ARFastDecoder
from mmspec.speech.models import speech_model_path
from mmspec.speech.pipeline import load_whisper
from mmspec.speech.train_fast import (
    DEFAULT_LEARNING_RATE,
    Example,
    _eos_ids,
    draft_vocabulary,
    prepare_examples,
    read_clip_folder,
    train_ar_fast_decoder,
    train_ctc_fast_decoder,
)
from mmspec.speech.train_feature import DEFAULT_FEATURE_LEARNING_RATE, target_features, train_feature_drafter

MODEL = "whisper-tiny.en"


SHARD = 64  # clips per cache shard: an interrupted run keeps every finished shard


def cached_examples(model, processor, data: str, cache: str | None) -> list[Example]:
    """Encoder states + tiny.en's greedy labels for every clip, read from `cache` where it has them.

    `cache` is a file (written whole at the end) or, ending in "/", a folder of shards of
    :data:`SHARD` clips written as they are done, so a long run that is stopped resumes.
    """
    if cache and Path(cache).is_file():
        return [Example(states=s, prompt=p, labels=y) for s, p, y in torch.load(cache)]
    clips = read_clip_folder(data)
    if not (cache and (cache.endswith("/") or Path(cache).is_dir())):
        examples = prepare_examples(model, processor, clips, "target")
        if cache:
            torch.save([(e.states.half(), e.prompt, e.labels) for e in examples], cache)
        return examples
    folder = Path(cache)
    folder.mkdir(parents=True, exist_ok=True)
    examples: list[Example] = []
    for start in tqdm(range(0, len(clips), SHARD), desc="encode + label shards", unit="shard"):
        shard = folder / f"shard_{start // SHARD:05d}.pt"
        if not shard.is_file():
            done = prepare_examples(model, processor, clips[start : start + SHARD], "target", progress_bar=False)
            partial = shard.with_suffix(".part")
            torch.save([(e.states.half(), e.prompt, e.labels) for e in done], partial)
            partial.replace(shard)
        examples += [Example(states=s, prompt=p, labels=y) for s, p, y in torch.load(shard)]
    return examples


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"layers are integers separated by commas, got {text!r}") from None


def seconds_per_step(train, examples: list[Example], batch_size: int) -> tuple[float, float]:
    """(first loss, seconds per step) of two steps at a learning rate too small to move anything."""
    started = time.perf_counter()
    _, losses = train(examples[: 2 * batch_size], 2, learning_rate=1e-12, warmup_steps=0, progress_bar=False)
    return losses[0], (time.perf_counter() - started) / 2


def write_self_drafter(model, examples: list[Example], args: argparse.Namespace) -> None:
    """tiny.en's own decoder as its drafter, over the labels' most frequent tokens: a config, no weights."""
    vocab = draft_vocabulary(examples, args.vocab_size, model_vocab_size(model), _eos_ids(model))
    fast = ARFastDecoder.for_target(model, share_decoder=True, prompt_ids=examples[0].prompt, draft_vocab=vocab)
    fast.config.draft_redraft, fast.config.draft_redraft_tokens = True, args.chain
    fast.config.draft_weights = None if args.draft_weights == "float" else args.draft_weights
    out = Path(args.out)
    fast.save_pretrained(out)
    report = {"kind": "self", "target": MODEL, "labels": "target (tiny.en greedy)", "data": Path(args.data).name,
              "clips": len(examples), "label_tokens": sum(len(e.labels) for e in examples),
              "draft_vocab_size": len(vocab), "redraft_tokens": args.chain, "draft_weights": args.draft_weights}
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="clip folder (metadata.jsonl) from speech_data or varied_speech")
    parser.add_argument("--cache", help="file (or folder/, written in shards, resumable) for the encoder states and "
                        "labels; read where it exists")
    parser.add_argument("--out", required=True)
    parser.add_argument("--kind", choices=("ar", "ctc", "self", "feature"), default="ar")
    parser.add_argument("--chain", type=int, default=None, metavar="K",
                        help="the fast decoder re-drafts K tokens every round by default (its config's draft_redraft); "
                             "feature: K drafts a round (default 3)")
    parser.add_argument("--minutes", type=float, default=14.0, help="training wall-time budget (sets the step count)")
    parser.add_argument("--steps", type=int, help="a fixed step count instead of --minutes")
    parser.add_argument("--layers", type=_layer_list, default=None, metavar="I[,I...]",
                        help="AR: start from these tiny.en decoder layers, one fast-decoder layer each (e.g. 0,3); "
                             "default: one layer, the first or the last, whichever starts with the lower loss")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--draft-weights", choices=("int8", "float"), default="int8",
                        help="self: draft steps through int8 copies of the decoder's weights (on a CPU) or the weights "
                             "as they are")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, help="default: 5e-4 (ar), 1e-3 (ctc)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, processor = load_whisper(MODEL, speech_model_path(MODEL))
    for p in model.parameters():
        p.requires_grad_(False)
    examples = cached_examples(model, processor, args.data, args.cache)
    if not examples:
        raise MMSpecError("no training clips")
    if args.chain is not None and args.chain < 1:
        parser.error(f"--chain must be >= 1, got {args.chain}")
    if args.kind == "self":
        write_self_drafter(model, examples, args)
        return
    learning_rate = args.learning_rate or {**DEFAULT_LEARNING_RATE, "feature": DEFAULT_FEATURE_LEARNING_RATE}[args.kind]
    report: dict = {"kind": args.kind}
    if args.kind == "ar":
        vocab = draft_vocabulary(examples, args.vocab_size, model_vocab_size(model), _eos_ids(model))

        def train_from(layers: tuple[int, ...]):
            fresh = ARFastDecoder.for_target(model, init_layers=layers, prompt_ids=examples[0].prompt,
                                             share_embeddings=True, draft_vocab=vocab)
            return lambda data, steps, **kw: train_ar_fast_decoder(model, data, steps, fresh, batch_size=args.batch_size, **kw)

        candidates = [tuple(args.layers)] if args.layers else [(0,), (-1,)]
        trials = {layers: seconds_per_step(train_from(layers), examples, args.batch_size) for layers in candidates}
        for layers, (loss, step) in trials.items():
            print(f"init from decoder layers {layers}: loss {loss:.3f}, {step:.2f} s/step", flush=True)
        layers = min(trials, key=lambda k: trials[k][0])
        train, step_seconds = train_from(layers), trials[layers][1]
        report["init_layers"] = list(layers)
    elif args.kind == "feature":
        features = target_features(model, examples)  # once: the step timing below must not include it

        def train(data, steps, **kw):
            return train_feature_drafter(model, data, steps, batch_size=args.batch_size, draft_vocab_size=args.vocab_size,
                                         draft_tokens=args.chain or 3, features=features[: len(data)], **kw)

        step_seconds = seconds_per_step(train, examples, args.batch_size)[1]
    else:
        def train(data, steps, **kw):
            return train_ctc_fast_decoder(model, data, steps, batch_size=args.batch_size,
                                          draft_vocab_size=args.vocab_size, **kw)

        step_seconds = seconds_per_step(train, examples, args.batch_size)[1]
    steps = args.steps or max(20, int(args.minutes * 60 / step_seconds))
    print(f"training {steps} steps ({step_seconds:.2f} s/step measured)", flush=True)
    started = time.perf_counter()
    fast, losses = train(examples, steps, learning_rate=learning_rate, seed=0)
    seconds = time.perf_counter() - started
    out = Path(args.out)
    if args.chain is not None and args.kind == "ar":
        fast.config.draft_redraft, fast.config.draft_redraft_tokens = True, args.chain
    fast.half().save_pretrained(out)
    tail = losses[-20:]
    report.update({"target": MODEL, "labels": "target (tiny.en greedy)", "data": Path(args.data).name,
                   "clips": len(examples), "label_tokens": sum(len(e.labels) for e in examples), "steps": steps,
                   "batch_size": args.batch_size, "learning_rate": learning_rate,
                   "draft_vocab_size": len(fast.config.draft_vocab or ()), "first_loss": round(losses[0], 4),
                   "final_loss": round(sum(tail) / len(tail), 4), "train_seconds": round(seconds, 1),
                   "threads": args.threads})
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
