"""Train the zoo's toy ASR model ``shapes-whisper-asr``: a small ``WhisperForConditionalGeneration``
on speech synthesised with espeak-ng (:mod:`mmspec.speech.recipes.speech_data`).

    python -m mmspec.speech.recipes.speech_data --out ~/.cache/mmspec/asr/heldout --n 300 --split heldout
    python -m mmspec.speech.recipes.speech_data --out ~/.cache/mmspec/asr/train --n 8000 --split train
    python -m mmspec.speech.recipes.train_whisper_asr --train ~/.cache/mmspec/asr/train \
        --heldout ~/.cache/mmspec/asr/heldout --max-minutes 30

The shipped model came from two runs, the second continuing the first with ``--init-from``
(2341 s and 2642 s on 2 CPU cores, as its card records): the card's ``rebuild_command`` gives both.

Model: Whisper architecture, English-only, transcribe-only, no timestamps, with a shortened
input window: 8 s chunks, 80 mel bins at a 20 ms hop (Whisper uses 10 ms: halving the frame rate
halves the encoder's cost and still leaves 25 encoder frames per second for ~4 tokens per second
of speech), so the encoder reads 400 frames -> 200 positions. d_model 256, 4 encoder and
4 decoder layers. Clips longer than the window are left out of training and evaluation.
Tokenizer: a byte-level BPE (Whisper's scheme) trained on the sentence generators, with Whisper's
special tokens after the ordinary vocabulary; prompt
``<|startoftranscript|><|notimestamps|>`` like Whisper's English-only checkpoints.

Training: teacher-forced cross-entropy on the transcript, plus an auxiliary CTC loss on the
encoder output through a throw-away linear head (weight ``--ctc-weight``): joint CTC/attention
training makes the encoder-decoder alignment converge in a fraction of the steps on CPU. The
aux head is not saved; the shipped model is a plain Whisper checkpoint. With ``--steps 0`` the run lasts
``--max-minutes`` (minus the evaluation reserve) and the learning-rate schedule follows elapsed time; evaluation: greedy ``generate`` on
held-out clips, WER after `mmspec.speech.wer.normalise`.

It writes to ``--out`` (default ``./shapes-whisper-asr``); ``--into-zoo`` replaces the shipped model.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import ByteLevelBPETokenizer
from tqdm import tqdm
from transformers import (
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperProcessor,
    WhisperTokenizer,
)

from mmspec.compat import mark_generation_config_explicit
from mmspec.speech.audio import load_audio
from mmspec.speech.wer import word_errors
from mmspec.training import adamw, add_output_arguments, optimizer_step, parse_output_folder, set_lr, warmup_cosine
from mmspec.zoo import MODELS_DIR

from . import speech_data

OUT_DIR = MODELS_DIR / "shapes-whisper-asr"
SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
CHUNK_SECONDS = 8
HOP = 320
MEL_BINS = 80
MAX_TARGET_POSITIONS = 128
ARCH = dict(d_model=256, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=1024, decoder_ffn_dim=1024)


def build_tokenizer(vocab_size: int, seed: int) -> WhisperTokenizer:
    """Byte-level BPE on the sentence generators, Whisper's specials appended after the ordinary ids."""
    corpus = [" " + s for s in speech_data.sentences(40_000, "train", seed + 1)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=vocab_size - len(SPECIALS), min_frequency=2, show_progress=False)
    vocab = bpe.get_vocab()
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split()) for m in json.loads(bpe.to_str())["model"]["merges"]]
    base = len(vocab)
    vocab.update({token: base + i for i, token in enumerate(SPECIALS)})
    return WhisperTokenizer(vocab=vocab, merges=merges, extra_special_tokens=SPECIALS[1:], unk_token=SPECIALS[0],
                            bos_token=SPECIALS[0], eos_token=SPECIALS[0], pad_token=SPECIALS[0],
                            model_max_length=MAX_TARGET_POSITIONS)


def build_processor(tokenizer: WhisperTokenizer) -> WhisperProcessor:
    extractor = WhisperFeatureExtractor(feature_size=MEL_BINS, sampling_rate=speech_data.RATE, hop_length=HOP,
                                        chunk_length=CHUNK_SECONDS, n_fft=400)
    return WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer)


def build_model(tokenizer: WhisperTokenizer, seed: int) -> WhisperForConditionalGeneration:
    ids = tokenizer.convert_tokens_to_ids(SPECIALS)
    eot, sot, _, _, no_timestamps = ids
    torch.manual_seed(seed)
    config = WhisperConfig(vocab_size=len(tokenizer), num_mel_bins=MEL_BINS,
                           max_source_positions=CHUNK_SECONDS * speech_data.RATE // HOP // 2,
                           max_target_positions=MAX_TARGET_POSITIONS, decoder_start_token_id=sot, pad_token_id=eot,
                           bos_token_id=eot, eos_token_id=eot, suppress_tokens=[], begin_suppress_tokens=[eot],
                           dropout=0.0, **ARCH)
    model = WhisperForConditionalGeneration(config)
    gen = model.generation_config
    mark_generation_config_explicit(gen)  # keep Whisper's generation fields when reloaded
    gen.decoder_start_token_id, gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = sot, eot, eot, eot
    gen.no_timestamps_token_id = no_timestamps
    gen.is_multilingual = False
    gen.forced_decoder_ids = None
    gen.suppress_tokens = []
    gen.begin_suppress_tokens = [eot]
    gen.return_timestamps = False
    gen.max_length = MAX_TARGET_POSITIONS
    return model


def prompt_ids(tokenizer: WhisperTokenizer) -> list[int]:
    return tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|notimestamps|>"])


def label_ids(tokenizer: WhisperTokenizer, text: str) -> list[int]:
    """The decoder sequence: prompt, transcript (with Whisper's leading space), end-of-text."""
    return prompt_ids(tokenizer) + tokenizer.encode(" " + text, add_special_tokens=False) + [tokenizer.eos_token_id]


# ---------------------------------------------------------------- data

def load_features(folder: str | Path, processor: WhisperProcessor, limit: int | None = None,
                  desc: str = "features") -> tuple[torch.Tensor, list[str]]:
    """Log-mel features [N, mel, frames] (fp16) and transcripts of a dataset folder."""
    rows = [r for r in speech_data.read_metadata(folder) if r.get("seconds", 0) <= CHUNK_SECONDS][:limit]
    extractor = processor.feature_extractor
    chunks, texts = [], []
    for start in tqdm(range(0, len(rows), 64), desc=desc, mininterval=5):
        batch = rows[start : start + 64]
        audio = [load_audio(r["path"], sampling_rate=speech_data.RATE) for r in batch]
        feats = extractor(audio, sampling_rate=speech_data.RATE, return_tensors="pt").input_features
        chunks.append(feats.to(torch.float16))
        texts += [r["text"] for r in batch]
    return torch.cat(chunks), texts


def pad_labels(sequences: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = True
    return ids, mask


def spec_augment(features: torch.Tensor, rng: random.Random) -> torch.Tensor:
    """One frequency mask and two time masks per clip (light SpecAugment) against overfitting the voices."""
    features = features.clone()
    floor = features.amin(dim=(1, 2), keepdim=True)
    for i in range(features.shape[0]):
        f0, fw = rng.randrange(features.shape[1]), rng.randint(0, 8)
        features[i, f0 : f0 + fw] = floor[i]
        for _ in range(2):
            t0, tw = rng.randrange(features.shape[2]), rng.randint(0, 12)
            features[i, :, t0 : t0 + tw] = floor[i]
    return features


# ---------------------------------------------------------------- evaluation

@torch.inference_mode()
def evaluate(model, tokenizer, features: torch.Tensor, texts: list[str], batch_size: int = 25) -> dict:
    model.eval()
    errors = words = exact = 0
    samples = []
    for start in range(0, len(texts), batch_size):
        out = model.generate(features[start : start + batch_size].float(), max_length=MAX_TARGET_POSITIONS)
        for text, seq in zip(texts[start : start + batch_size], out):
            hyp = tokenizer.decode(seq, skip_special_tokens=True).strip()
            e, w = word_errors(text, hyp)
            errors, words, exact = errors + e, words + w, exact + (e == 0)
            if len(samples) < 5:
                samples.append({"truth": text, "hypothesis": hyp})
    model.train()
    return {"wer": round(errors / max(words, 1), 4), "exact": round(exact / len(texts), 4), "clips": len(texts),
            "samples": samples}


# ---------------------------------------------------------------- training

def lr_factor(step: int, progress: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine to 5% over ``progress`` (0..1) of the run.

    Progress is measured in wall-clock time when the run is sized by a time budget, so the
    schedule still anneals when the machine is slower than at the start (shared CPUs).
    """
    return warmup_cosine(step, 0, warmup, floor=0.05, progress=progress)


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    start = time.time()
    if args.init_from:  # continue a saved run (same tokenizer and processor)
        processor = WhisperProcessor.from_pretrained(args.init_from)
        tokenizer = processor.tokenizer
        model = WhisperForConditionalGeneration.from_pretrained(args.init_from, dtype=torch.float32)
    else:
        tokenizer = build_tokenizer(args.vocab_size, args.seed)
        processor = build_processor(tokenizer)
        model = build_model(tokenizer, args.seed)
    print(f"whisper: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocab {len(tokenizer)}",
          flush=True)
    train_x, train_texts = load_features(args.train, processor, args.limit, "train features")
    eval_x, eval_texts = load_features(args.heldout, processor, args.eval_n, "held-out features")
    labels = [label_ids(tokenizer, t) for t in train_texts]
    print(f"{len(labels)} train clips, {len(eval_texts)} held-out; longest label {max(map(len, labels))} tokens; "
          f"data ready in {time.time() - start:.0f} s", flush=True)

    blank = len(tokenizer)
    ctc_head = torch.nn.Linear(model.config.d_model, blank + 1)
    params = list(model.parameters()) + list(ctc_head.parameters())
    opt = adamw(params, args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    model.train()
    deadline = start + args.max_minutes * 60
    train_end = deadline - args.eval_reserve_s
    step, t_train = 0, time.time()
    order: list[int] = []
    bar = tqdm(total=args.steps or None, desc="train", mininterval=10)
    history = []
    while (step < args.steps) if args.steps else (time.time() < train_end):
        if len(order) < args.batch_size:
            order += rng.sample(range(len(labels)), len(labels))
        batch, order = order[: args.batch_size], order[args.batch_size :]
        x = spec_augment(train_x[batch].float(), rng)
        ids, mask = pad_labels([labels[i] for i in batch], tokenizer.eos_token_id)
        progress = step / args.steps if args.steps else (time.time() - t_train) / max(1.0, train_end - t_train)
        set_lr(opt, args.lr * lr_factor(step, progress, args.warmup))
        encoder = model.model.encoder(x).last_hidden_state
        logits = model(encoder_outputs=(encoder,), decoder_input_ids=ids[:, :-1]).logits
        target = ids[:, 1:].masked_fill(~mask[:, 1:], -100)
        ce = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        text = [labels[i][2:-1] for i in batch]  # the transcript tokens only, for CTC
        flat = torch.tensor([t for seq in text for t in seq])
        log_probs = ctc_head(encoder).log_softmax(-1).transpose(0, 1)
        ctc = F.ctc_loss(log_probs, flat, torch.full((len(batch),), encoder.shape[1], dtype=torch.long),
                         torch.tensor([len(s) for s in text]), blank=blank, zero_infinity=True)
        loss = ce + args.ctc_weight * ctc
        optimizer_step(opt, loss, params)
        step += 1
        bar.update(1)
        if step % 50 == 0:
            bar.set_postfix(ce=f"{ce.item():.3f}", ctc=f"{ctc.item():.3f}", lr=f"{opt.param_groups[0]['lr']:.1e}")
        if args.eval_every and step % args.eval_every == 0:
            quick = evaluate(model, tokenizer, eval_x[:50], eval_texts[:50])
            history.append({"step": step, "minutes": round((time.time() - t_train) / 60, 1), "ce": round(ce.item(), 4),
                            "wer_50": quick["wer"]})
            print(f"\nstep {step}: ce {ce.item():.3f} ctc {ctc.item():.3f} held-out WER(50) {quick['wer']:.3f} "
                  f"| {quick['samples'][0]['hypothesis']!r}", flush=True)
    bar.close()
    train_time = time.time() - start
    t_eval = time.time()
    quality = evaluate(model, tokenizer, eval_x, eval_texts)
    quality["eval_wall_time_s"] = round(time.time() - t_eval, 1)
    print(f"held-out WER {quality['wer']:.4f}, exact {quality['exact']:.3f} on {quality['clips']} clips", flush=True)
    save(model, processor, args, quality, step, train_time, len(labels), history)


def save(model, processor, args, quality: dict, steps: int, train_time: float, clips: int, history: list) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(out)
    processor.save_pretrained(out)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    card = {
        "name": out.name,
        "task": "speech-recognition",
        "architecture": "WhisperForConditionalGeneration",
        "role": "target",
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": "float16",
        "file_size_bytes": size,
        "window": f"{CHUNK_SECONDS} s chunks, {MEL_BINS} mel bins, hop {HOP} samples (20 ms) -> "
                  f"{model.config.max_source_positions} encoder positions",
        "prompt": "<|startoftranscript|><|notimestamps|> (English-only, transcribe, no timestamps)",
        "trained_on": f"{clips} espeak-ng clips (mmspec.speech.recipes.speech_data, split 'train', seed {args.seed}): "
                      "half shapes-world captions, half everyday template sentences; 48 voices (6 accents x 8 "
                      "variants), 140-210 wpm, pitch 25-75, white noise at 30-45 dB SNR",
        "training": f"{steps} steps x {args.batch_size} clips, AdamW lr {args.lr}, warm-up {args.warmup}, cosine; "
                    f"cross-entropy + {args.ctc_weight} x CTC on the encoder (throw-away head); light SpecAugment",
        "train_wall_time_s": round(train_time, 1),
        "train_machine": f"2 CPU cores, torch.set_num_threads({args.threads})",
        "quality": {**quality, "measured_on": "held-out espeak-ng clips (split 'heldout', disjoint sentences and "
                    "seeds, same voice pool), greedy generate", "wer_normalisation":
                    "lower case, characters other than a-z 0-9 ' and space dropped, spaces collapsed"},
        "history": history,
        "rebuild_command": "python -m mmspec.speech.recipes.train_whisper_asr " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in sorted(vars(args).items()) if v is not None and k not in ("out", "into_zoo")),
        "limitations": "Synthetic espeak-ng speech only: it will not transcribe natural human speech well.",
    }
    (out / "zoo_card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"saved to {out} ({size / 1e6:.1f} MB)", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True)
    parser.add_argument("--heldout", required=True)
    add_output_arguments(parser, OUT_DIR.name)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=0, help="0: size to --max-minutes")
    parser.add_argument("--max-minutes", type=float, default=30)
    parser.add_argument("--eval-reserve-s", type=float, default=60)
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--ctc-weight", type=float, default=0.3)
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--eval-n", type=int, default=200)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-from", default=None, help="continue from a saved model folder")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    args.out = str(parse_output_folder(parser, args, OUT_DIR))
    train(args)


if __name__ == "__main__":
    main()
