"""Train the AR target of the zoo model ``shapes-image-ar`` (the top of its folder).

    python -m mmspec.image_ar.recipes.train_shapes_image_ar                  # full run, ~20 min of training
    python -m mmspec.image_ar.recipes.train_shapes_image_ar --steps 3 --train-n 256 --heldout-n 48 \\
        --sample-n 24 --out /tmp/x                                       # smoke (needs OUT/vq)

Model: :class:`mmspec.image_ar.LlamaGenForClassConditional` (LlamaGen's class-conditional GPT,
Sun et al. 2024, official parameter names), small: 6 layers, dim 256, 8 heads, SwiGLU 704, over the
512 codes of the zoo VQ (``OUT/vq``, trained first) on a 16 x 16 grid with 2-D rotary positions;
24 classes plus the null class of classifier-free guidance (Ho & Salimans 2022): labels are
replaced by the null class with probability 0.1 during training, as in LlamaGen.

Data: the first ``--train-n`` train examples of :mod:`image_ar_data`, encoded ONCE by the frozen VQ
and cached under ~/.cache/mmspec/shapes-image-ar (keyed by the VQ weights), then plain next-token
cross-entropy over the 256 tokens. bf16 autocast (where the CPU has it) halves the step time.

Quality: held-out token loss / perplexity / greedy next-token accuracy (teacher-forced, real
held-out codes), and, when the judge exists (``OUT/judge``), the judge's class accuracy and Fréchet
distance to real held-out images of ``--sample-n`` images sampled by plain AR decoding
(temperature 1, no top-k) at each guidance scale of ``--eval-scales``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import math
import time
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F

from mmspec.image_ar import LlamaGenConfig, LlamaGenForClassConditional, VQModel, ar_generate
from mmspec.image_ar.judge import load_judge
from mmspec.sampling import SamplingConfig
from mmspec.training import IndexBatches, TrainingLoop, adamw, optimizer_step, seed_everything, set_lr, warmup_cosine

from . import image_ar_data as data


def build_model(vocab_size: int, dim: int, layers: int, heads: int, class_dropout: float) -> LlamaGenForClassConditional:
    config = LlamaGenConfig(
        vocab_size=vocab_size,
        dim=dim,
        n_layer=layers,
        n_head=heads,
        multiple_of=64,
        num_classes=data.NUM_CLASSES,
        class_dropout_prob=class_dropout,
        block_size=data.GRID * data.GRID,
    )
    return LlamaGenForClassConditional(config)


def drop_labels(labels: torch.Tensor, p: float, null_class: int, generator: torch.Generator) -> torch.Tensor:
    """Classifier-free guidance training: each label becomes the null class with probability p."""
    drop = torch.rand(labels.shape, generator=generator) < p
    return torch.where(drop, torch.full_like(labels, null_class), labels)


def add_gpt_arguments(parser: argparse.ArgumentParser, layers: int, train_n_help: str) -> None:
    """The architecture and code-data options of the class-conditional GPTs (the target and its drafter)."""
    parser.add_argument("--vq", default=None, help="VQ folder (default OUT/vq), for the cached codes")
    parser.add_argument("--cache-dir", default=str(data.CACHE_DIR), help="where encoded codes and sample grids go")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--class-dropout", type=float, default=0.1)
    parser.add_argument("--train-n", type=int, default=32000, help=train_n_help)
    parser.add_argument("--heldout-n", type=int, default=1000)


def load_codes(args: argparse.Namespace, vq_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """(train codes, train labels, held-out codes, held-out labels, seconds spent): encoded once, then cached."""
    t0 = time.time()
    codes, labels = data.cached_codes(vq_dir, args.train_n, args.seed, "train", Path(args.cache_dir))
    held_codes, held_labels = data.cached_codes(vq_dir, args.heldout_n, args.seed, "heldout", Path(args.cache_dir))
    return codes, labels, held_codes, held_labels, time.time() - t0


def code_batches(loop: TrainingLoop, opt: torch.optim.Optimizer, codes: torch.Tensor, labels: torch.Tensor,
                 args: argparse.Namespace, null_class: int, generator: torch.Generator
                 ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """(step, codes [B, 256], class labels [B]) for each step of `loop`, the learning rate set for it:
    shuffled code sequences, each label dropped to the null class with probability `args.class_dropout`."""
    batches = IndexBatches(codes.shape[0], generator)
    for step in loop:
        idx = batches.take(args.batch_size)
        x = codes[idx].long()
        y = drop_labels(labels[idx], args.class_dropout, null_class, generator)
        set_lr(opt, warmup_cosine(step, loop.planned(), args.warmup, floor=0.1, peak=args.lr))
        yield step, x, y


@torch.no_grad()
def heldout_loss(model: LlamaGenForClassConditional, codes: torch.Tensor, labels: torch.Tensor, batch_size: int = 64) -> dict:
    """Teacher-forced held-out cross-entropy (nats / token), perplexity and greedy next-token accuracy."""
    model.eval()
    nll, correct, count = 0.0, 0, 0
    for i in range(0, codes.shape[0], batch_size):
        x = codes[i : i + batch_size].long()
        logits = model(class_labels=labels[i : i + batch_size], input_ids=x[:, :-1]).logits
        nll += F.cross_entropy(logits.flatten(0, 1), x.flatten(), reduction="sum").item()
        correct += (logits.argmax(-1) == x).sum().item()
        count += x.numel()
    model.train()
    loss = nll / count
    return {"heldout_token_loss": round(loss, 4), "heldout_token_ppl": round(math.exp(loss), 3),
            "heldout_greedy_token_acc": round(correct / count, 4), "heldout_sequences": int(codes.shape[0])}


@torch.no_grad()
def sample_quality(model: LlamaGenForClassConditional, vq: VQModel, judge_dir: Path, reference: data.ImageSet,
                   n: int, scales: list[float], seed: int, png_dir: Path | None = None) -> dict:
    """Plain AR samples (n images, classes i mod 24) per guidance scale, scored by the judge."""
    judge = load_judge(judge_dir)
    labels = torch.arange(n) % data.NUM_CLASSES
    real = reference.images[:n]
    results = {"fd_real_vs_real": round(judge.frechet_distance(real, reference.images[n : 2 * n]), 3)
               if len(reference) >= 2 * n else None}
    model.eval()
    for scale in scales:
        generator = torch.Generator().manual_seed(seed)
        out = ar_generate(model, labels, SamplingConfig(do_sample=True), generator, guidance_scale=scale)
        images = vq.decode(out.tokens)
        results[f"cfg_{scale:g}"] = {
            "class_accuracy": round(judge.class_accuracy(images, labels), 4),
            "fd_vs_real": round(judge.frechet_distance(images, real), 3),
            "sampling_seconds": round(out.stats.total_time, 1),
        }
        if png_dir is not None:
            save_grid(data.to_uint8(images), png_dir / f"samples-cfg{scale:g}.png")
    model.train()
    results["images_per_scale"] = n
    return results


def save_grid(images_uint8: torch.Tensor, path: Path, columns: int = 24) -> None:
    """A PNG grid of uint8 images [N, 3, H, W] (for eyeballing; not part of the zoo folder)."""
    from PIL import Image

    n, _, h, w = images_uint8.shape
    rows = (n + columns - 1) // columns
    canvas = torch.zeros(3, rows * h, columns * w, dtype=torch.uint8)
    for i in range(n):
        r, c = divmod(i, columns)
        canvas[:, r * h : (r + 1) * h, c * w : (c + 1) * w] = images_uint8[i]
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(canvas.permute(1, 2, 0).numpy()).save(path)
    print(f"samples: {path}", flush=True)


def train(args: argparse.Namespace) -> dict:
    data.set_threads(args.threads)
    seed_everything(args.seed)
    out = Path(args.out)
    vq_dir = Path(args.vq) if args.vq else out / "vq"
    if not (vq_dir / "model.safetensors").is_file():
        raise SystemExit(f"no VQ in {vq_dir}: run python -m mmspec.image_ar.recipes.train_shapes_vq first")
    vq = VQModel.from_pretrained(vq_dir, dtype=torch.float32).eval()
    codes, labels, held_codes, held_labels, prep = load_codes(args, vq_dir)
    model = build_model(vq.config.codebook_size, args.dim, args.layers, args.heads, args.class_dropout).train()
    if args.init_from:  # continue a earlier run (same architecture)
        model.load_state_dict(LlamaGenForClassConditional.from_pretrained(args.init_from, dtype=torch.float32).state_dict())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"target: {n_params / 1e6:.2f}M parameters, vocab {vq.config.codebook_size}, {codes.shape[0]} train sequences; "
          f"bf16 autocast {data.autocast_state(args.bf16)}", flush=True)
    opt = adamw(model, args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    generator = torch.Generator().manual_seed(args.seed)
    loop = TrainingLoop(args.max_minutes, args.steps, desc="target")
    for step, x, y in code_batches(loop, opt, codes, labels, args, model.config.null_class, generator):
        with data.autocast(args.bf16):
            loss = model(class_labels=y, input_ids=x[:, :-1], labels=x).loss
        optimizer_step(opt, loss, model.parameters())
        loop.log(step, loss.item(), every=25, lr=opt.param_groups[0]["lr"])
    wall = loop.wall
    model.half().float()  # evaluate what ships (fp16 weights)
    quality = heldout_loss(model, held_codes, held_labels)
    print(json.dumps(quality), flush=True)
    judge_dir = Path(args.judge) if args.judge else out / "judge"
    if args.sample_n and (judge_dir / "config.json").is_file():
        reference = data.images(2 * args.sample_n, args.seed, "heldout")
        scales = [float(s) for s in args.eval_scales.split(",") if s]
        quality["samples"] = sample_quality(model, vq, judge_dir, reference, args.sample_n, scales, args.seed,
                                            Path(args.cache_dir) / "samples-target")
        print(json.dumps(quality["samples"]), flush=True)
    data.save_fp16(model, out)
    info = {
        "params": n_params,
        "dtype": "float16",
        "load_dtype": "float32",
        "vocab_size": vq.config.codebook_size,
        "guidance_scale": args.guidance_scale,
        "architecture_config": {"dim": args.dim, "n_layer": args.layers, "n_head": args.heads,
                                "ffn_hidden": model.layers[0].feed_forward.w1.out_features,
                                "block_size": data.GRID * data.GRID, "num_classes": data.NUM_CLASSES,
                                "class_dropout_prob": args.class_dropout},
        "trained_on": (f"VQ codes of image_ar_data.images({args.train_n}, seed={args.seed}, split='train') "
                       f"(encoded once by vq/); {loop.done} steps x {args.batch_size} sequences "
                       f"({loop.done * args.batch_size / codes.shape[0]:.2f} epochs); class dropout {args.class_dropout}"
                       + (f"; continued from a run of {args.prior_steps} steps x {args.batch_size} ({args.init_from})"
                          if args.init_from else "")),
        "seed": args.seed,
        "steps": loop.done,
        "batch_size": args.batch_size,
        "optimiser": (f"AdamW lr {args.lr}, betas (0.9, 0.95), weight decay 0.05, warm-up {args.warmup}, cosine to 10%, "
                      f"bf16 autocast {data.autocast_state(args.bf16)}"),
        **data.timing_facts(loop, wall, args.threads, prep),
        "quality": {**quality, "measured_on": (f"{args.heldout_n} held-out sequences (image_ar_data split 'heldout', "
                                               f"seed {args.seed}), fp16 weights upcast to fp32; samples: plain AR, "
                                               "temperature 1, judged by judge/")},
        "target_rebuild_command": (
            f"python -m mmspec.image_ar.recipes.train_shapes_image_ar --steps {loop.done} --max-minutes 120"
            + (f" --init-from FOLDER_OF_THE_{args.prior_steps}_STEP_RUN --prior-steps {args.prior_steps} --lr {args.lr} "
               f"--warmup {args.warmup}" if args.init_from else "")),
    }
    return data.finish(out, "target", info, out, wall)


def main(argv: list[str] | None = None) -> dict:
    parser = data.recipe_parser(__doc__, "the model folder (target at its top)", max_minutes=20.0, batch_size=32,
                                lr=0.001, warmup=100)
    parser.add_argument("--judge", default=None, help="judge folder for sample quality (default OUT/judge; skipped if absent)")
    add_gpt_arguments(parser, layers=6, train_n_help="distinct training images (encoded once)")
    parser.add_argument("--init-from", default=None, help="continue from this target folder (same architecture)")
    parser.add_argument("--prior-steps", type=int, default=0, help="steps the --init-from run had done (for the card)")
    parser.add_argument("--sample-n", type=int, default=96, help="images sampled per guidance scale for the judge (0 = skip)")
    parser.add_argument("--eval-scales", default="1,2,4", help="guidance scales of the sample evaluation")
    parser.add_argument("--guidance-scale", type=float, default=2.0, help="the default scale written to the card")
    return train(data.parse_recipe_args(parser, argv))


if __name__ == "__main__":
    main()
