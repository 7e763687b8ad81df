"""Train a VAR of the zoo model ``shapes-var``: the large one (``model/``) or the small one (``refiner/``).

    python -m mmspec.image_ar.recipes.train_shapes_var --role large --threads 1     # ~20 min
    python -m mmspec.image_ar.recipes.train_shapes_var --role small --threads 1     # ~10 min
    python -m mmspec.image_ar.recipes.train_shapes_var --role large --init-from saved/model --max-minutes 60  # continue
    python -m mmspec.image_ar.recipes.train_shapes_var --role large --steps 3 --train-n 96 --heldout-n 48 \\
        --sample-n 24 --out /tmp/x                                                   # smoke (needs OUT/vq)

Model: :class:`mmspec.image_ar.VAR` (next-scale prediction, Tian et al. 2024, official parameter
names and init), class-conditional over the 24 classes of the shapes world plus the unconditional
class of classifier-free guidance (labels dropped with probability 0.1, as the official training).
Large: 4 blocks of width 192 (4 heads, 2.9M parameters); small: 2 blocks of width 96 (2 heads, 0.46M: 6.4x fewer,
the ratio of the paper's VAR-d30 drafter to its VAR-d16 refiner). Both predict the
512 codes of the VQ-VAE in ``OUT/vq`` (trained first) over its scales 1, 2, 3, 4, 6, 8, 11, 16 (507
tokens), teacher-forced: the input of scale s + 1 is the area-downsampled running sum f_hat of the
ground-truth codes of scales <= s, and the loss the cross-entropy of every token of every scale.

Data: the first ``--train-n`` train examples of :mod:`image_ar_data`, encoded once by the frozen
VQ-VAE and cached (keyed by its weights). Quality: held-out token loss and greedy token accuracy,
and the class accuracy of the zoo judge (``shapes-image-ar/judge``) on ``--sample-n`` images
sampled scale by scale (temperature 1, no top-k) at each guidance scale of ``--eval-cfgs``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mmspec.image_ar.code_training import drop_labels
from mmspec.image_ar.judge import load_judge
from mmspec.image_ar.var import VAR
from mmspec.image_ar.var_vq import VQVAE
from mmspec.training import IndexBatches, TrainingLoop, adamw, optimizer_step, seed_everything, set_lr, warmup_cosine

from . import image_ar_data as data
from . import shapes_var

ROLES = {  # role -> (subfolder, depth, width, heads)
    "large": ("model", 4, 192, 4),
    "small": ("refiner", 2, 96, 2),
}


@torch.no_grad()
def cached_scale_codes(vq_dir: Path, vq: VQVAE, n: int, seed: int, split: str, cache_dir: Path
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int16 [n, L], labels [n]): the token maps of every scale, concatenated, encoded once and cached."""
    key = data.file_sha(vq_dir / "diffusion_pytorch_model.safetensors")
    path = cache_dir / f"var-codes-{split}-s{seed}-n{n}-vq{key}.pt"
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        return saved["codes"], saved["labels"]
    t0 = time.time()
    images = data.images(n, seed, split)
    codes = []
    for i in range(0, n, 128):
        maps = vq.img_to_idxBl(data.to_model_range(images.images[i : i + 128]))
        codes.append(torch.cat(maps, dim=1).to(torch.int16))
    codes = torch.cat(codes)
    print(f"encoded {n} {split} images in {time.time() - t0:.0f}s -> {path}", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"codes": codes, "labels": images.labels}, path)
    return codes, images.labels


def split_scales(model: VAR, codes: torch.Tensor) -> list[torch.Tensor]:
    return [codes[:, begin:end].long() for begin, end in model.begin_ends]


def teacher_forced_loss(model: VAR, vq: VQVAE, codes: torch.Tensor, labels: torch.Tensor, bf16: bool) -> tuple:
    """(mean cross-entropy over all tokens, logits) of a batch of concatenated code maps [B, L]."""
    with torch.no_grad():
        inputs = vq.quantize.idxBl_to_var_input(split_scales(model, codes))
    with data.autocast(bf16):
        logits = model(labels, inputs)
    return F.cross_entropy(logits.float().reshape(-1, model.V), codes.long().reshape(-1)), logits


@torch.no_grad()
def heldout_loss(model: VAR, vq: VQVAE, codes: torch.Tensor, labels: torch.Tensor, batch_size: int = 128) -> dict:
    model.eval()
    nll, correct, count = 0.0, 0, 0
    for i in range(0, codes.shape[0], batch_size):
        x, y = codes[i : i + batch_size], labels[i : i + batch_size]
        loss, logits = teacher_forced_loss(model, vq, x, y, bf16=False)
        nll += loss.item() * x.numel()
        correct += (logits.argmax(-1) == x.long()).sum().item()
        count += x.numel()
    model.train()
    return {"heldout_token_loss": round(nll / count, 4), "heldout_token_ppl": round(math.exp(nll / count), 3),
            "heldout_greedy_token_acc": round(correct / count, 4), "heldout_sequences": int(codes.shape[0])}


@torch.no_grad()
def sample_quality(model: VAR, vq: VQVAE, judge_name: str, n: int, cfgs: list[float], seed: int) -> dict:
    """Class accuracy of the judge on n images sampled scale by scale (classes i mod 24) per guidance scale."""
    judge = load_judge(judge_name)
    labels = torch.arange(n) % data.NUM_CLASSES
    model.eval()
    results = {}
    for cfg in cfgs:
        generator = torch.Generator().manual_seed(seed)
        t0 = time.time()
        images = model.autoregressive_infer_cfg(vq, n, labels, generator, cfg=cfg)
        results[f"cfg_{cfg:g}"] = {"class_accuracy": round(judge.class_accuracy(images * 2 - 1, labels), 4),
                                   "sampling_seconds": round(time.time() - t0, 1)}
    model.train()
    results["images_per_cfg"] = n
    return results


def saved_var_facts(model: VAR, folder: Path) -> dict:
    """The card fields that describe a VAR saved in fp16 to `folder`."""
    return {"architecture": "mmspec.image_ar.VAR (FoundationVision/VAR parameter names)",
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in model.config.items() if not k.startswith("_")},
            "params": sum(p.numel() for p in model.parameters()),
            "file_size_bytes": (folder / "diffusion_pytorch_model.safetensors").stat().st_size,
            "dtype": "float16"}


def training_parts(model: VAR, args: argparse.Namespace, n: int, desc: str) -> tuple:
    """(optimiser, seeded generator, batches over n sequences, budget loop) of a VAR training run."""
    opt = adamw(model, args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    generator = torch.Generator().manual_seed(args.seed)
    return opt, generator, IndexBatches(n, generator), TrainingLoop(args.max_minutes, args.steps, desc=desc)


def optimiser_text(args: argparse.Namespace) -> str:
    return (f"AdamW lr {args.lr}, betas (0.9, 0.95), weight decay 0.05, warm-up {args.warmup}, cosine to 10%, "
            f"bf16 autocast {data.autocast_state(args.bf16)}")


def train(args: argparse.Namespace) -> dict:
    data.set_threads(args.threads)
    seed_everything(args.seed)
    out = Path(args.out)
    subfolder, depth, width, heads = ROLES[args.role]
    depth, width, heads = args.depth or depth, args.width or width, args.heads or heads
    vq_dir = Path(args.vq) if args.vq else out / "vq"
    if not (vq_dir / "config.json").is_file():
        raise SystemExit(f"no VQ-VAE in {vq_dir}: run python -m mmspec.image_ar.recipes.train_shapes_var_vq first")
    vq = VQVAE.from_pretrained(vq_dir, torch_dtype=torch.float32).eval()
    t0 = time.time()
    cache = Path(args.cache_dir)
    codes, labels = cached_scale_codes(vq_dir, vq, args.train_n, args.seed, "train", cache)
    held_codes, held_labels = cached_scale_codes(vq_dir, vq, args.heldout_n, args.seed, "heldout", cache)
    prep = time.time() - t0
    if args.init_from:  # continue a saved VAR: its own size; it must read this VQ-VAE's codes
        try:
            model = VAR.from_pretrained(args.init_from, torch_dtype=torch.float32).train()
        except (OSError, ValueError) as error:
            raise SystemExit(f"cannot load the VAR in {args.init_from}: {str(error).splitlines()[0]}") from None
        expected = (vq.vocab_size, vq.Cvae, tuple(vq.v_patch_nums), data.NUM_CLASSES)
        if (model.V, model.Cvae, tuple(model.patch_nums), model.num_classes) != expected:
            raise SystemExit(f"{args.init_from} is not a VAR over this VQ-VAE's codes (vocabulary, code width, scales "
                             f"and classes must be {expected})")
    else:
        model = VAR(vocab_size=vq.vocab_size, Cvae=vq.Cvae, num_classes=data.NUM_CLASSES, depth=depth, embed_dim=width,
                    num_heads=heads, patch_nums=vq.v_patch_nums).init_weights().train()
    depth, width = model.depth, model.C
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.role} VAR: {n_params / 1e6:.2f}M parameters (depth {depth}, width {width}), {codes.shape[0]} train "
          f"sequences of {codes.shape[1]} tokens; bf16 autocast {data.autocast_state(args.bf16)}", flush=True)
    opt, generator, batches, loop = training_parts(model, args, codes.shape[0], f"VAR {args.role}")
    for step in loop:
        idx = batches.take(args.batch_size)
        y = drop_labels(model, labels[idx], args.class_dropout, generator)
        set_lr(opt, warmup_cosine(step, loop.planned(), args.warmup, floor=0.1, peak=args.lr))
        loss, _ = teacher_forced_loss(model, vq, codes[idx], y, args.bf16)
        optimizer_step(opt, loss, model.parameters())
        loop.log(step, loss.item(), every=50, lr=opt.param_groups[0]["lr"])
    wall = loop.wall
    model.half().float()  # evaluate what ships (fp16 weights)
    quality = heldout_loss(model, vq, held_codes, held_labels)
    print(json.dumps(quality), flush=True)
    if args.sample_n and args.judge:
        cfgs = [float(c) for c in args.eval_cfgs.split(",") if c]
        quality["samples"] = sample_quality(model, vq, args.judge, args.sample_n, cfgs, args.seed)
        print(json.dumps(quality["samples"]), flush=True)
    folder = data.save_fp16(model, out / subfolder)
    info = {
        "role": args.role,
        **saved_var_facts(model, folder),
        "trained_on": (f"VQ-VAE codes of image_ar_data.images({args.train_n}, seed={args.seed}, split='train'); "
                       f"{loop.done} steps x {args.batch_size} ({loop.done * args.batch_size / codes.shape[0]:.2f} "
                       f"epochs); class dropout {args.class_dropout}"
                       + (f"; continued from {args.init_from}" if args.init_from else "")),
        "optimiser": optimiser_text(args),
        **data.timing_facts(loop, wall, args.threads, prep),
        "quality": {**quality, "measured_on": (f"{args.heldout_n} held-out sequences; samples: temperature 1, no "
                                               f"top-k, judged by {args.judge}/judge; fp16 weights upcast")},
        "rebuild_command": (f"python -m mmspec.image_ar.recipes.train_shapes_var --role {args.role} --steps {loop.done} "
                            f"--threads {args.threads}" + (f" --init-from {args.init_from}" if args.init_from else "")),
    }
    shapes_var.update_card(out, subfolder, info)
    print(f"saved {folder} after {wall:.0f}s of training", flush=True)
    return info


def main(argv: list[str] | None = None) -> dict:
    parser = shapes_var.recipe_parser(__doc__, "the model folder (OUT/model or OUT/refiner)", max_minutes=20.0,
                                      batch_size=32, lr=0.001, warmup=100)
    parser.add_argument("--role", choices=sorted(ROLES), required=True, help="large (model/) or small (refiner/)")
    parser.add_argument("--depth", type=int, default=0, help="blocks (0 = the role's)")
    parser.add_argument("--width", type=int, default=0, help="embed_dim (0 = the role's)")
    parser.add_argument("--heads", type=int, default=0, help="attention heads (0 = the role's)")
    parser.add_argument("--vq", default=None, help="VQ-VAE folder (default OUT/vq)")
    parser.add_argument("--init-from", default=None, help="a saved VAR folder to continue training (keeps its size; "
                        "copy it first when it is the --out folder's own)")
    parser.add_argument("--cache-dir", default=str(shapes_var.CACHE_DIR), help="where the encoded codes are cached")
    parser.add_argument("--class-dropout", type=float, default=0.1)
    parser.add_argument("--train-n", type=int, default=24000)
    parser.add_argument("--heldout-n", type=int, default=480)
    parser.add_argument("--sample-n", type=int, default=96, help="images sampled per guidance scale (0 = skip)")
    parser.add_argument("--eval-cfgs", default="0,1.5,3", help="guidance scales of the sample evaluation")
    parser.add_argument("--judge", default="shapes-image-ar", help="zoo model or folder whose judge scores samples")
    return train(shapes_var.parse_recipe_args(parser, argv))


if __name__ == "__main__":
    main()
