"""Train a toy MAR pair on the shapes world (the draft and target of continuous speculative decoding).

    python -m mmspec.image_ar.recipes.train_toy_mar --stage all --out shapes-mar                    # vae, target, draft
    python -m mmspec.image_ar.recipes.train_toy_mar --stage all --steps 3 --batch-size 4 --out /tmp/x   # smoke
    cp -r shapes-mar/model first && python -m mmspec.image_ar.recipes.train_toy_mar --stage target \\
        --init-from first --out shapes-mar --max-minutes 60                                          # continue

Data: the class-conditional 64 x 64 renders of `image_ar_data` (24 classes = kind x colour), a fresh
seeded stream. Three stages, each its own folder under --out (diffusers `save_pretrained`, fp16); once
all three exist, --out is also a saved `MARPipeline` (model_index.json over vae/, model/, draft/):

- vae/: a small diffusers `AutoencoderKL` (3 levels, downsample 4, 4 latent channels): 64 x 64 image
  <-> 4 x 16 x 16 latents; loss = MSE + kl_weight x KL; its `scaling_factor` is set to 1 / the std of
  the latents after training, as Stable Diffusion's and MAR's KL-16 are;
- model/ (the target), draft/: `mmspec.image_ar.mar.MAR` on the scaled latents with patch size 2 (64 tokens of
  16 channels), the official training loss (random order, masking ratio from the truncated normal,
  diffusion loss on the masked tokens, 10% label dropout for CFG); the draft is narrower and shallower.

Each stage writes training.json (steps, seconds per step, wall time, last smoothed loss, and
`continued_from` when --init-from started it from a saved MAR). Not yet
run to a trained toy: no judge accuracy or speed-up is claimed for it.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
from pathlib import Path

import torch
from diffusers import AutoencoderKL

from mmspec.image_ar.mar import MAR
from mmspec.training import (TrainingLoop, add_output_arguments, adamw, optimizer_step, parse_output_folder,
                             seed_everything, set_lr, warmup_cosine)

from . import image_ar_data as data

NAME = "shapes-mar"
ZOO_DIR = data.ZOO_DIR.parent / NAME
FOLDERS = {"vae": "vae", "target": "model", "draft": "draft"}  # MARPipeline's component folders
SIZES = {"target": dict(width=192, depth=4, heads=6, head_width=256, head_depth=3),
         "draft": dict(width=96, depth=1, heads=4, head_width=128, head_depth=2)}


def build_vae(ch: int) -> AutoencoderKL:
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
                         up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(ch, 2 * ch, 2 * ch),
                         layers_per_block=1, latent_channels=4, norm_num_groups=min(32, ch), sample_size=data.IMAGE_SIZE)


def build_mar(role: str, args: argparse.Namespace) -> MAR:
    size = SIZES[role]
    width, heads = int(size["width"] * args.width_mult) // size["heads"] * size["heads"], size["heads"]
    return MAR(img_size=data.IMAGE_SIZE, vae_stride=4, patch_size=2, vae_embed_dim=4, class_num=data.NUM_CLASSES,
               encoder_embed_dim=width, encoder_depth=size["depth"], encoder_num_heads=heads,
               decoder_embed_dim=width, decoder_depth=size["depth"], decoder_num_heads=heads, buffer_size=8,
               diffloss_d=size["head_depth"], diffloss_w=int(size["head_width"] * args.width_mult),
               num_sampling_steps=args.sampling_steps, diffusion_batch_mul=args.diffusion_batch_mul)


def train_vae(args: argparse.Namespace, out: Path) -> dict:
    vae = build_vae(args.vae_ch).train()
    stream = data.Stream(args.seed, "train")
    opt = adamw(vae, args.vae_lr, weight_decay=0.0)
    loop = TrainingLoop(args.max_minutes, args.steps, desc="vae")
    for step in loop:
        x = data.to_model_range(stream.take(args.batch_size).images)
        set_lr(opt, warmup_cosine(step, loop.planned(), args.warmup, floor=0.1, peak=args.vae_lr))
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample()).sample
        mse, kl = (recon - x).pow(2).mean(), posterior.kl().mean() / x[0].numel()
        loss = mse + args.kl_weight * kl
        optimizer_step(opt, loss, vae.parameters())
        loop.log(step, loss.item(), every=50, mse=mse.item(), kl=kl.item())
    vae.eval()
    with torch.no_grad():
        latents = vae.encode(data.to_model_range(data.images(64, args.seed, "heldout").images)).latent_dist.mean
    vae.register_to_config(scaling_factor=float(1 / latents.std().clamp_min(1e-6)))
    return save(vae, out / "vae", loop, {"scaling_factor": vae.config.scaling_factor})


def train_mar(role: str, args: argparse.Namespace, out: Path) -> dict:
    vae = AutoencoderKL.from_pretrained(out / "vae", torch_dtype=torch.float32).eval()
    model = (load_mar(args.init_from) if args.init_from else build_mar(role, args)).train()
    stream = data.Stream(args.seed + (1 if role == "draft" else 0), "train")
    opt = adamw(model, args.lr, betas=(0.9, 0.95), weight_decay=0.02)
    generator = torch.Generator().manual_seed(args.seed)
    loop = TrainingLoop(args.max_minutes, args.steps, desc=role)
    for step in loop:
        batch = stream.take(args.batch_size)
        with torch.no_grad():
            latents = vae.encode(data.to_model_range(batch.images)).latent_dist.sample(generator) * vae.config.scaling_factor
        set_lr(opt, warmup_cosine(step, loop.planned(), args.warmup, floor=0.1, peak=args.lr))
        loss = model(latents, batch.labels, generator=generator)
        optimizer_step(opt, loss, model.parameters())
        loop.log(step, loss.item(), every=50)
    extra = {"parameters": sum(p.numel() for p in model.parameters())}
    if args.init_from:
        extra["continued_from"] = str(args.init_from)
    return save(model.eval(), out / FOLDERS[role], loop, extra)


def load_mar(folder: str) -> MAR:
    """A saved MAR to continue training, in float32."""
    try:
        return MAR.from_pretrained(folder, torch_dtype=torch.float32)
    except (OSError, ValueError) as error:
        raise SystemExit(f"cannot load the MAR in {folder}: {str(error).splitlines()[0]}") from None


def save(model: torch.nn.Module, folder: Path, loop: TrainingLoop, extra: dict) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    model.half().save_pretrained(folder, safe_serialization=True)
    info = {"steps": loop.done, "seconds_per_step": loop.seconds_per_step, "train_wall_time_s": round(loop.wall, 1),
            "last_smoothed_loss": loop.smoothed, **extra}
    (folder / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"saved {folder} after {loop.wall:.0f}s ({loop.done} steps)", flush=True)
    return info


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_output_arguments(parser, NAME, "the pipeline folder (vae/, model/, draft/)")
    parser.add_argument("--stage", choices=("vae", "target", "draft", "all"), default="all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-minutes", type=float, default=10.0, help="wall-clock budget of EACH stage")
    parser.add_argument("--steps", type=int, default=0, help="steps per stage; 0 = as many as fit the budget")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=4e-4)
    parser.add_argument("--vae-lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--kl-weight", type=float, default=1e-4)
    parser.add_argument("--vae-ch", type=int, default=32)
    parser.add_argument("--width-mult", type=float, default=1.0, help="scales the MAR and head widths (tests use 0.25)")
    parser.add_argument("--sampling-steps", type=int, default=50, help="DDPM steps of the diffusion head at sampling")
    parser.add_argument("--diffusion-batch-mul", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--init-from", default=None, help="a saved MAR folder to continue (with --stage target or "
                        "draft; copy it first when it is the output's own)")
    args = parser.parse_args(argv)
    out = parse_output_folder(parser, args, ZOO_DIR)
    data.set_threads(args.threads)
    seed_everything(args.seed)
    stages = ("vae", "target", "draft") if args.stage == "all" else (args.stage,)
    if args.init_from and args.stage not in ("target", "draft"):
        parser.error("--init-from continues one MAR: pass --stage target or --stage draft")
    if stages[0] != "vae" and not (out / "vae" / "config.json").is_file():
        parser.error(f"no trained VAE in {out / 'vae'}: run --stage vae first")
    info = {stage: train_vae(args, out) if stage == "vae" else train_mar(stage, args, out) for stage in stages}
    if all((out / folder / "config.json").is_file() for folder in FOLDERS.values()):
        assemble(out)
    return info


def assemble(out: Path) -> None:
    """Make OUT a saved `MARPipeline` (model_index.json over model/, vae/, draft/, with the class names),
    so `MARPipeline.from_pretrained(OUT)` and `mmspec generate-image --model OUT` load it."""
    from mmspec.image_ar.mar_pipeline import MARPipeline

    parts = {"model": MAR, "vae": AutoencoderKL, "draft": MAR}
    loaded = {name: cls.from_pretrained(out / name, torch_dtype=torch.float16) for name, cls in parts.items()}
    MARPipeline(**loaded, class_names=data.label_names(), model_name=NAME).save_pretrained(out)
    print(f"saved the MARPipeline folder {out}", flush=True)


if __name__ == "__main__":
    main()
