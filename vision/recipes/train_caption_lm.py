"""Train the shapes-world caption LMs of the embedded zoo: a ~28M-parameter Llama
target and a ~2M-parameter Llama drafter sharing one tokenizer.

    python -m mmspec.vision.recipes.train_caption_lm --which tokenizer
    python -m mmspec.vision.recipes.train_caption_lm --which target
    python -m mmspec.vision.recipes.train_caption_lm --which drafter [--distil]
    python -m mmspec.vision.recipes.train_caption_lm --which drafter --scenes detailed   # for the detailed captioner
    python -m mmspec.vision.recipes.train_caption_lm --which target --time-steps 5   # measure only

Each writes to ``--out`` (default ``./shapes-caption-lm`` or ``./shapes-caption-drafter``);
``--into-zoo`` replaces the shipped model (the tokenizer goes into both zoo folders).

Sequences are ``<bos> caption <eos>`` over captions generated on the fly by
:mod:`mmspec.world`: one-shape-grammar captions (``caption_corpus``), or with ``--scenes detailed``
the detailed captions of 1-4-shape scenes (``detailed_examples``, 60-150 tokens) that the detailed
captioner writes, so a text drafter for that captioner knows its grammar. Weights are saved in fp16
safetensors beside a ``zoo_card.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from mmspec.training import (
    adamw,
    add_output_arguments,
    optimizer_step,
    parse_output_folder,
    seed_everything,
    warmup_cosine,
)
from mmspec.world import caption_corpus, detailed_examples
from mmspec.zoo import MODELS_DIR

from .tokenizer import build_tokenizer

TARGET_DIR = MODELS_DIR / "shapes-caption-lm"
DRAFTER_DIR = MODELS_DIR / "shapes-caption-drafter"
HELDOUT_N = 2000  # held-out captions for the quality numbers in the card
SCENES = ("one-shape", "detailed")
# Detailed captions are ~6x longer: fewer distinct captions and steps cover the grammar in similar time.
DETAILED = {"data_size": 20_000, "steps": 2000}


def corpus(scenes: str, n: int, seed: int, split: str) -> list[str]:
    """``n`` captions of ``split`` in the grammar of ``scenes``."""
    if scenes == "detailed":
        return [caption for _, caption in detailed_examples(n, seed, split)]
    return caption_corpus(n, seed, split)


def corpus_call(scenes: str, n: int, seed: int, split: str) -> str:
    """How `corpus` made its captions, as the card states it."""
    if scenes == "detailed":
        return f"mmspec.world.detailed_examples(n={n}, seed={seed}, split='{split}')"
    return f"mmspec.world.caption_corpus(n={n}, seed={seed}, split='{split}')"


@dataclass(frozen=True)
class Recipe:
    """Architecture and optimisation settings of one zoo model."""

    role: str
    folder: Path
    hidden: int
    layers: int
    heads: int
    intermediate: int
    steps: int
    batch_size: int
    lr: float
    warmup: int
    data_size: int  # distinct training captions


RECIPES: dict[str, Recipe] = {
    "target": Recipe("target", TARGET_DIR, hidden=512, layers=8, heads=8, intermediate=1536,
                     steps=550, batch_size=32, lr=8e-4, warmup=50, data_size=20_000),
    # Few layers on purpose: per-layer Python overhead dominates tiny models on CPU.
    "drafter": Recipe("drafter", DRAFTER_DIR, hidden=256, layers=2, heads=4, intermediate=768,
                      steps=3000, batch_size=32, lr=2e-3, warmup=100, data_size=100_000),
}


def make_model(recipe: Recipe, tok: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=recipe.hidden,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.heads,
        intermediate_size=recipe.intermediate,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    return model


def encode(tok: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """``<bos> caption <eos>`` token ids (the post-processor adds ``<bos>``)."""
    return [ids + [tok.eos_token_id] for ids in tok(texts)["input_ids"]]


def collate(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad to the longest sequence; padded label positions are -100."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def lr_at(step: int, recipe: Recipe) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    return warmup_cosine(step, recipe.steps, recipe.warmup, floor=0.1, peak=recipe.lr)


@torch.inference_mode()
def evaluate(model: LlamaForCausalLM, tok: PreTrainedTokenizerBase, seqs: list[list[int]],
             batch_size: int = 100) -> dict:
    """Held-out loss, perplexity and teacher-forced greedy next-token accuracy.

    Every grammar word is a single token, so token accuracy is word (and
    punctuation) accuracy; ``<bos>`` is never predicted, ``<eos>`` is.
    """
    model.eval()
    nll, correct, count = 0.0, 0, 0
    for i in range(0, len(seqs), batch_size):
        ids, mask, labels = collate(seqs[i : i + batch_size], tok.pad_token_id)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target = labels[:, 1:]
        valid = target != -100
        nll += F.cross_entropy(logits[valid], target[valid], reduction="sum").item()
        correct += (logits.argmax(-1)[valid] == target[valid]).sum().item()
        count += valid.sum().item()
    model.train()
    loss = nll / count
    return {"heldout_loss": round(loss, 4), "heldout_ppl": round(math.exp(loss), 4),
            "greedy_next_word_acc": round(correct / count, 4), "heldout_captions": len(seqs),
            "heldout_tokens": count}


def distil_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Forward KL(teacher || student) per position, averaged over real tokens."""
    t = F.log_softmax(teacher_logits.float(), -1)
    s = F.log_softmax(student_logits.float(), -1)
    kl = (t.exp() * (t - s)).sum(-1)
    return (kl * mask).sum() / mask.sum()


def train(which: str, seed: int, steps: int | None, time_steps: int | None, distil: bool,
          threads: int = 2, out: Path | None = None, scenes: str = "one-shape") -> None:
    torch.set_num_threads(threads)
    seed_everything(seed)
    recipe = RECIPES[which]
    if scenes == "detailed":
        recipe = Recipe(**{**recipe.__dict__, **DETAILED})
    if steps is not None:
        recipe = Recipe(**{**recipe.__dict__, "steps": steps})
    tok = build_tokenizer(seed)
    model = make_model(recipe, tok)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{which}: {n_params / 1e6:.2f}M parameters, vocab {len(tok)}", flush=True)

    teacher = None
    if distil:
        teacher = LlamaForCausalLM.from_pretrained(TARGET_DIR, dtype=torch.float32).eval()

    t0 = time.time()
    train_seqs = encode(tok, corpus(scenes, recipe.data_size, seed, "train"))
    held_seqs = encode(tok, corpus(scenes, HELDOUT_N, seed, "heldout"))
    print(f"data ready in {time.time() - t0:.1f}s", flush=True)

    opt = adamw(model, recipe.lr, betas=(0.9, 0.95), weight_decay=0.05)
    order = list(range(len(train_seqs)))
    rng = random.Random(seed)
    rng.shuffle(order)
    total = time_steps or recipe.steps
    model.train()
    start = time.time()
    bar = tqdm(range(total), mininterval=10, desc=which)
    for step in bar:
        lo = (step * recipe.batch_size) % len(order)
        batch = [train_seqs[j] for j in order[lo : lo + recipe.batch_size]]
        ids, mask, labels = collate(batch, tok.pad_token_id)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe)
        result = model(input_ids=ids, attention_mask=mask, labels=labels)
        loss = result.loss
        if teacher is not None:
            with torch.inference_mode():
                t_logits = teacher(input_ids=ids, attention_mask=mask).logits
            # Half hard labels, half the target's full distribution.
            loss = 0.5 * loss + 0.5 * distil_loss(result.logits, t_logits.clone(), mask.float())
        optimizer_step(opt, loss, model.parameters())
        if step % 50 == 0 or step == total - 1:
            bar.set_postfix(loss=f"{loss.item():.4f}")
            print(f"step {step} loss {loss.item():.4f} lr {lr_at(step, recipe):.2e} "
                  f"elapsed {time.time() - start:.0f}s", flush=True)
    wall = time.time() - start
    if time_steps:
        print(f"{time_steps} steps in {wall:.2f}s: {wall / time_steps:.3f}s/step at batch "
              f"{recipe.batch_size}", flush=True)
        return

    model.half()  # ship fp16; evaluate what ships (upcast back to fp32 for CPU math)
    model.float()
    quality = evaluate(model, tok, held_seqs)
    print(json.dumps(quality), flush=True)
    save(model, tok, recipe, seed, n_params, wall, quality, distil, threads, out or recipe.folder, scenes)


def save(model: LlamaForCausalLM, tok: PreTrainedTokenizerBase, recipe: Recipe, seed: int,
         n_params: int, wall: float, quality: dict, distil: bool, threads: int, folder: Path,
         scenes: str = "one-shape") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.half().save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    other = DRAFTER_DIR if recipe.role == "target" else TARGET_DIR
    card = {
        "name": folder.name,
        "task": "text-generation",
        "architecture": "LlamaForCausalLM",
        "role": recipe.role,
        "pairs_with": other.name,
        "params": n_params,
        "file_size_bytes": (folder / "model.safetensors").stat().st_size,
        "dtype": "float16",
        "trained_on": (f"{recipe.data_size} captions of the shapes world ({corpus_call(scenes, recipe.data_size, seed, 'train')})"
                       + ("; loss = 0.5 cross-entropy + 0.5 KL to the target's logits" if distil else "")),
        **({"scenes": "detailed"} if scenes == "detailed" else {}),
        "seed": seed,
        "data_size": recipe.data_size,
        "steps": recipe.steps,
        "batch_size": recipe.batch_size,
        "architecture_config": {"hidden_size": recipe.hidden, "num_hidden_layers": recipe.layers,
                                "num_attention_heads": recipe.heads,
                                "intermediate_size": recipe.intermediate},
        "optimiser": f"AdamW lr {recipe.lr}, warm-up {recipe.warmup}, cosine to 10%",
        "train_wall_time_s": round(wall, 1),
        "train_machine": f"2 CPU cores (shared with other jobs), torch.set_num_threads({threads})",
        "quality": {**quality, "measured_on": corpus_call(scenes, HELDOUT_N, seed, "heldout")},
        "rebuild_command": f"python -m mmspec.vision.recipes.train_caption_lm --which {recipe.role}"
                           + (" --distil" if distil else "") + (" --scenes detailed" if scenes == "detailed" else ""),
    }
    (folder / "zoo_card.json").write_text(json.dumps(card, indent=2) + "\n")
    print(f"saved {folder}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--which", choices=["tokenizer", "target", "drafter"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="override the recipe's steps")
    parser.add_argument("--time-steps", type=int, default=None,
                        help="only time this many training steps; save nothing")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads; 1 is faster for the drafter on a busy machine")
    parser.add_argument("--distil", action="store_true",
                        help="drafter only: add a KL term to the saved target's logits")
    parser.add_argument("--scenes", choices=SCENES, default="one-shape",
                        help="caption grammar: one-shape (the shipped caption LMs) or detailed (a text drafter for the "
                             "detailed captioner; drafter only)")
    add_output_arguments(parser, "shapes-caption-lm or shapes-caption-drafter (by --which)")
    args = parser.parse_args(argv)
    zoo_folder = RECIPES["drafter"].folder if args.which == "drafter" else RECIPES["target"].folder
    out = parse_output_folder(parser, args, zoo_folder)
    if args.which == "tokenizer":
        tok = build_tokenizer(args.seed)
        folders = (TARGET_DIR, DRAFTER_DIR) if args.into_zoo else (out,)
        for folder in folders:
            tok.save_pretrained(folder)
        print(f"vocab {len(tok)}; saved to {' and '.join(map(str, folders))}")
        return
    if args.distil and args.which != "drafter":
        parser.error("--distil only applies to --which drafter")
    if args.scenes == "detailed" and (args.which != "drafter" or args.distil):
        parser.error("--scenes detailed trains a text drafter (--which drafter) on the captions alone; the caption LM "
                     "that --distil reads knows only one-shape captions")
    train(args.which, args.seed, args.steps, args.time_steps, args.distil, args.threads, out, scenes=args.scenes)


if __name__ == "__main__":
    main()
