"""Train the quality judge of the zoo model ``shapes-image-ar`` (its ``judge/`` folder).

    python -m mmspec.image_ar.recipes.train_shapes_judge                    # full run, ~3 min of training
    python -m mmspec.image_ar.recipes.train_shapes_judge --steps 3 --eval-n 48 --recon-pool 32 --out /tmp/x   # smoke

Model: timm's ResNet-10-T layout (``timm.create_model("resnet10t", pretrained=False, num_classes=24,
channels=(16, 32, 64, 128))``: a deep tiered stem and one basic block per stage; a ResNet-18 of the
same width learned several times slower here) that tells the 24 classes (shape kind x colour)
apart on 64 x 64 images. It is what `mmspec.image_ar.judge` loads to score generated images: class
accuracy, and a Fréchet distance on its 128 penultimate features (FID-style, Heusel et al. 2017).

Generated images come out of the VQ decoder, so the judge must not be thrown by VQ artefacts:
when the VQ exists (``OUT/vq``, trained first), a share of every batch is drawn from a pool of
training images passed through it (encode + decode). Every other image is a fresh render; a little
pixel noise is added to all. Quality: held-out accuracy on real images and on their VQ
reconstructions, and the Fréchet distances real-vs-real (the noise floor at that sample size) and
real-vs-reconstruction.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from timm.models import save_for_hf

from mmspec.image_ar import VQModel
from mmspec.image_ar.judge import ImageJudge, frechet_distance_of_features, load_judge
from mmspec.training import TrainingLoop, adamw, optimizer_step, seed_everything, set_lr, warmup_cosine

from . import image_ar_data as data

POOL_START = 10_000_000  # train examples for the reconstruction pool, far from the stream's indices


@torch.no_grad()
def reconstruct(vq: VQModel, images_uint8: torch.Tensor, batch_size: int = 128) -> torch.Tensor:
    """uint8 images -> their VQ reconstructions, uint8 (what generated images look like)."""
    out = []
    for i in range(0, images_uint8.shape[0], batch_size):
        x = data.to_model_range(images_uint8[i : i + batch_size])
        out.append(data.to_uint8(vq.decode(vq.encode(x))))
    return torch.cat(out)


def build_judge(args: argparse.Namespace) -> torch.nn.Module:
    channels = tuple(int(c) for c in args.channels.split(","))
    return timm.create_model(args.arch, pretrained=False, num_classes=data.NUM_CLASSES, channels=channels)


def evaluate(judge: ImageJudge, heldout: data.ImageSet, recon: torch.Tensor | None) -> dict:
    labels = heldout.labels
    predicted = judge.predict(heldout.images)
    per_class = [float((predicted[labels == c] == c).float().mean()) for c in range(data.NUM_CLASSES)]
    half = len(heldout) // 2
    feats = judge.features(heldout.images)
    quality = {
        "heldout_accuracy_real": round(float((predicted == labels).float().mean()), 4),
        "heldout_accuracy_real_worst_class": round(min(per_class), 4),
        "fd_real_vs_real": round(frechet_distance_of_features(feats[:half], feats[half:]), 4),
        "fd_sample_size": half,
    }
    if recon is not None:
        quality["heldout_accuracy_vq_reconstruction"] = round(judge.class_accuracy(recon, labels), 4)
        quality["fd_real_vs_vq_reconstruction"] = round(frechet_distance_of_features(feats[:half], judge.features(recon[half:])), 4)
    quality["heldout_images"] = len(heldout)
    return quality


def train(args: argparse.Namespace) -> dict:
    data.set_threads(args.threads)
    seed_everything(args.seed)
    out = Path(args.out)
    vq_dir = Path(args.vq) if args.vq else out / "vq"
    vq = VQModel.from_pretrained(vq_dir, dtype=torch.float32).eval() if (vq_dir / "config.json").is_file() else None
    print(f"VQ reconstructions in training: {'yes, from ' + str(vq_dir) if vq is not None else 'no (no VQ found)'}", flush=True)
    heldout = data.images(args.eval_n, args.seed, "heldout")
    recon_heldout = reconstruct(vq, heldout.images) if vq is not None else None
    pool = None
    if vq is not None and args.recon_pool > 0 and args.recon_share > 0:
        pool = data.images(args.recon_pool, args.seed, "train", start=POOL_START)
        pool = data.ImageSet(reconstruct(vq, pool.images), pool.labels)
    model = build_judge(args).train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"judge {args.arch} channels {args.channels}: {n_params / 1e6:.2f}M parameters", flush=True)
    opt = adamw(model, args.lr, weight_decay=0.05)
    stream = data.Stream(args.seed, "train")
    generator = torch.Generator().manual_seed(args.seed)
    n_recon = int(round(args.batch_size * args.recon_share)) if pool is not None else 0
    loop = TrainingLoop(args.max_minutes, args.steps, desc="judge")
    for step in loop:
        fresh = stream.take(args.batch_size - n_recon)
        x, y = fresh.images, fresh.labels
        if n_recon:
            pick = torch.randint(0, len(pool), (n_recon,), generator=generator)
            x, y = torch.cat([x, pool.images[pick]]), torch.cat([y, pool.labels[pick]])
        x = data.to_model_range(x)
        x = x + torch.rand(x.shape[0], 1, 1, 1, generator=generator) * 0.06 * torch.randn(x.shape, generator=generator)
        set_lr(opt, warmup_cosine(step, loop.planned(), args.warmup, floor=0.1, peak=args.lr))
        loss = F.cross_entropy(model(x), y, label_smoothing=0.05)
        optimizer_step(opt, loss)  # no clipping: the judge trains stably without
        loop.log(step, loss.item(), every=50)
    wall = loop.wall
    folder = out / "judge"
    model.eval().half()
    save_for_hf(
        model,
        str(folder),
        model_config={"label_names": data.label_names(), "pretrained_cfg": {"tag": "mmspec_shapes"},
                      "mmspec_note": "shapes-world kind x colour judge; images 64x64 RGB in [0, 1] normalised by mean/std 0.5"},
        data_config={"input_size": (3, data.IMAGE_SIZE, data.IMAGE_SIZE), "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
                     "crop_pct": 1.0, "interpolation": "bilinear"},
        safe_serialization=True,
    )
    judge = load_judge(folder)  # evaluate what ships, through the loader the pipeline uses
    quality = evaluate(judge, heldout, recon_heldout)
    print(json.dumps(quality), flush=True)
    info = {
        "architecture": f"timm {args.arch}, channels ({args.channels}), num_classes {data.NUM_CLASSES}",
        "load": "mmspec.image_ar.judge.load_judge(folder) (timm.create_model('local-dir:<folder>', pretrained=True))",
        "params": n_params,
        "file_size_bytes": (folder / "model.safetensors").stat().st_size,
        "dtype": "float16",
        "feature_dim": int(judge.model.num_features),
        "trained_on": (f"{loop.done} steps x {args.batch_size} images: fresh train renders"
                       + (f" + {n_recon} per batch from {args.recon_pool} VQ reconstructions of train images" if n_recon else "")
                       + "; pixel noise up to 0.06, label smoothing 0.05"),
        "optimiser": f"AdamW lr {args.lr}, weight decay 0.05, warm-up {args.warmup}, cosine to 10%",
        **data.timing_facts(loop, wall, args.threads),
        "quality": {**quality, "measured_on": f"image_ar_data.images({args.eval_n}, seed={args.seed}, split='heldout'), "
                                              "fd_* between the first and the second half"},
        "rebuild_command": f"python -m mmspec.image_ar.recipes.train_shapes_judge --steps {loop.done} --max-minutes 60",
    }
    return data.finish(out, "judge", info, folder, wall)


def main(argv: list[str] | None = None) -> dict:
    parser = data.recipe_parser(__doc__, "the model folder (the judge goes to OUT/judge)", max_minutes=3.0,
                                batch_size=64, lr=0.002, warmup=30, bf16=False)
    parser.add_argument("--vq", default=None, help="VQ folder for reconstructions (default OUT/vq; skipped if absent)")
    parser.add_argument("--arch", default="resnet10t", help="a timm architecture that takes `channels`")
    parser.add_argument("--channels", default="16,32,64,128")
    parser.add_argument("--recon-pool", type=int, default=2048, help="train images passed through the VQ once")
    parser.add_argument("--recon-share", type=float, default=0.5, help="share of each batch from the reconstruction pool")
    parser.add_argument("--eval-n", type=int, default=1200)
    return train(data.parse_recipe_args(parser, argv))


if __name__ == "__main__":
    main()
