"""Train the zoo's toy MAR pair ``shapes-mar`` (the draft and target of continuous speculative decoding).

    python -m mmspec.image_ar.recipes.train_toy_mar --stage all --vae-minutes 12 --max-minutes 55 --draft-minutes 15 \\
        --lr 5e-4 --warmup 100                                                   # shapes_mar_card.REBUILD_COMMAND
    python -m mmspec.image_ar.recipes.train_toy_mar --stage all --steps 3 --batch-size 4 --train-n 16 --out /tmp/x  # smoke
    cp -r shapes-mar/model first && python -m mmspec.image_ar.recipes.train_toy_mar --stage target \\
        --init-from first --max-minutes 60 && python -m mmspec.image_ar.recipes.train_toy_mar --stage card  # continue

Data: the class-conditional 64 x 64 renders of `image_ar_data` (24 classes = kind x colour). Stages, each
its own folder under --out (diffusers `save_pretrained`, fp16):

- vae/: a small diffusers `AutoencoderKL` (3 levels, downsample 4, 4 latent channels): 64 x 64 image
  <-> 4 x 16 x 16 latents; loss = L1 + L2 with the shape's pixels weighted 9x (as the zoo's VQs) +
  kl_weight x KL, on a fresh seeded stream; its `scaling_factor`
  is set to 1 / the std of the latents after training, as Stable Diffusion's and MAR's KL-16 are;
- model/ (the target), draft/: `mmspec.image_ar.mar.MAR` on the scaled latents with patch size 4 (16 tokens of
  64 channels; --patch-size 2 gives 64 tokens of 16 channels at 3x the cost of a step), the official training
  loss (random order, masking ratio from the truncated normal, diffusion loss on the masked tokens, 10% label
  dropout for CFG); the draft is narrower and shallower.
  The VAE posteriors of --train-n examples are encoded once; each step draws latents from them;
- card: the judge's verdict on each part (`shapes_mar_card`), then --out is saved as a `MARPipeline`
  (model_index.json over vae/, model/, draft/; default cfg = the target's best of --eval-cfgs) with its
  zoo_card.json.

Each training stage writes training.json (steps, seconds per step, wall time, last smoothed loss, and
`continued_from` and `earlier_training` when --init-from started it from a saved part).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import time
from pathlib import Path

import torch
from diffusers import AutoencoderKL
from tqdm import tqdm

from mmspec.image_ar.mar import MAR
from mmspec.training import (
    TrainingLoop,
    adamw,
    add_output_arguments,
    optimizer_step,
    parse_output_folder,
    seed_everything,
    set_lr,
    warmup_cosine,
)

from . import image_ar_data as data
from .train_shapes_vq import foreground_weights

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
    return MAR(img_size=data.IMAGE_SIZE, vae_stride=4, patch_size=args.patch_size, vae_embed_dim=4, class_num=data.NUM_CLASSES,
               encoder_embed_dim=width, encoder_depth=size["depth"], encoder_num_heads=heads,
               decoder_embed_dim=width, decoder_depth=size["depth"], decoder_num_heads=heads, buffer_size=8,
               diffloss_d=size["head_depth"], diffloss_w=int(size["head_width"] * args.width_mult),
               num_sampling_steps=args.sampling_steps, diffusion_batch_mul=args.diffusion_batch_mul,
               attn_dropout=args.dropout, proj_dropout=args.dropout, timestep_spacing="leading")


def train_vae(args: argparse.Namespace, out: Path) -> dict:
    vae = (load_part(AutoencoderKL, args.init_from) if args.init_from else build_vae(args.vae_ch)).train()
    stream = data.Stream(args.seed, "train")
    opt = adamw(vae, args.vae_lr, weight_decay=0.0)
    loop = TrainingLoop(args.vae_minutes or args.max_minutes, args.steps, desc="vae")
    for step in loop:
        x = data.to_model_range(stream.take(args.batch_size).images)
        set_lr(opt, warmup_cosine(step, loop.planned(), args.warmup, floor=0.1, peak=args.vae_lr))
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample()).sample
        weights = foreground_weights(x, args.fg_weight)
        weights = weights / weights.mean()
        l1, mse = (weights * (recon - x).abs()).mean(), (weights * (recon - x).pow(2)).mean()
        kl = posterior.kl().mean() / x[0].numel()
        loss = l1 + mse + args.kl_weight * kl
        optimizer_step(opt, loss, vae.parameters())
        loop.log(step, loss.item(), every=50, mse=mse.item(), kl=kl.item())
    vae.eval()
    with torch.no_grad():
        latents = vae.encode(data.to_model_range(data.images(64, args.seed, "heldout").images)).latent_dist.mean
    vae.register_to_config(scaling_factor=float(1 / latents.std().clamp_min(1e-6)))
    extra = {"parameters": sum(p.numel() for p in vae.parameters()), "scaling_factor": vae.config.scaling_factor,
             "loss": f"L1 + L2 (shape pixels weighted "
             f"{1 + args.fg_weight:g}x) + {args.kl_weight:g} x KL"}
    return save(vae, out / "vae", loop, extra | continued(args))


@torch.no_grad()
def encode_posteriors(vae: AutoencoderKL, n: int, seed: int, batch_size: int = 128) -> tuple:
    """(mean, std) fp16 [n, 4, 16, 16] and labels [n] of the first n training examples: the VAE's
    posterior, encoded once so each step only draws mean + std * noise (encoding was ~20% of a step)."""
    means, stds, labels = [], [], []
    for start in tqdm(range(0, n, batch_size), desc="encode latents", mininterval=5):
        batch = data.images(min(batch_size, n - start), seed, "train", start)
        posterior = vae.encode(data.to_model_range(batch.images)).latent_dist
        means.append(posterior.mean.half()), stds.append(posterior.std.half()), labels.append(batch.labels)
    return torch.cat(means), torch.cat(stds), torch.cat(labels)


def train_mar(role: str, args: argparse.Namespace, out: Path) -> dict:
    vae = AutoencoderKL.from_pretrained(out / "vae", torch_dtype=torch.float32).eval()
    model = (load_part(MAR, args.init_from) if args.init_from else build_mar(role, args)).train()
    t0 = time.perf_counter()
    means, stds, labels = encode_posteriors(vae, args.train_n, args.seed + (1 if role == "draft" else 0))
    encode_s = time.perf_counter() - t0
    opt = adamw(model, args.lr, betas=(0.9, 0.95), weight_decay=0.02)
    generator = torch.Generator().manual_seed(args.seed)
    minutes = args.draft_minutes if role == "draft" and args.draft_minutes is not None else args.max_minutes
    loop = TrainingLoop(minutes, args.steps, desc=role)
    for step in loop:
        pick = torch.randint(len(labels), (args.batch_size,), generator=generator)
        noise = torch.randn(means[pick].shape, generator=generator)
        latents = (means[pick].float() + stds[pick].float() * noise) * vae.config.scaling_factor
        set_lr(opt, warmup_cosine(step, loop.planned(), args.warmup, floor=0.1, peak=args.lr))
        loss = model(latents, labels[pick], generator=generator)
        optimizer_step(opt, loss, model.parameters())
        loop.log(step, loss.item(), every=50)
    extra = {"parameters": sum(p.numel() for p in model.parameters()), "train_examples": args.train_n,
             "encode_wall_time_s": round(encode_s, 1), **continued(args)}
    return save(model.eval(), out / FOLDERS[role], loop, extra)


def continued(args: argparse.Namespace) -> dict:
    """With --init-from: where training started and that folder's own training record (the card sums both)."""
    if not args.init_from:
        return {}
    record = Path(args.init_from) / "training.json"
    earlier = json.loads(record.read_text()) if record.is_file() else None
    return {"continued_from": str(args.init_from), "earlier_training": earlier}


def load_part(cls: type, folder: str) -> torch.nn.Module:
    """A saved MAR or autoencoder to continue training, in float32."""
    try:
        return cls.from_pretrained(folder, torch_dtype=torch.float32)
    except (OSError, ValueError) as error:
        raise SystemExit(f"cannot load the {cls.__name__} in {folder}: {str(error).splitlines()[0]}") from None


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
    parser.add_argument("--stage", choices=("vae", "target", "draft", "card", "all"), default="all",
                        help="all = vae, target, draft, then card (judge the parts, save the pipeline and its card)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-minutes", type=float, default=10.0, help="wall-clock budget of EACH training stage")
    parser.add_argument("--draft-minutes", type=float, default=None, help="the draft's budget (default --max-minutes)")
    parser.add_argument("--vae-minutes", type=float, default=None, help="the VAE's budget (default --max-minutes)")
    parser.add_argument("--steps", type=int, default=0, help="steps per stage; 0 = as many as fit the budget")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=4e-4)
    parser.add_argument("--vae-lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--kl-weight", type=float, default=1e-4)
    parser.add_argument("--vae-ch", type=int, default=32)
    parser.add_argument("--fg-weight", type=float, default=8.0, help="the VAE's reconstruction loss weighs the shape's "
                        "pixels 1 + this (a shape is 1-9%% of the image; unweighted, the VAE blurs it away)")
    parser.add_argument("--width-mult", type=float, default=1.0, help="scales the MAR and head widths (tests use 0.25)")
    parser.add_argument("--patch-size", type=int, default=4, choices=(1, 2, 4, 8),
                        help="latent patch per MAR token: 4 = 16 tokens of 64 channels, 2 = 64 tokens of 16 channels "
                        "(a training step costs 3x more at 2)")
    parser.add_argument("--sampling-steps", type=int, default=50, help="DDPM steps of the diffusion head at sampling")
    parser.add_argument("--diffusion-batch-mul", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.0, help="attention and projection dropout of the MARs "
                        "(official 0.1, for long runs; a short toy run learns faster without)")
    parser.add_argument("--train-n", type=int, default=24000, help="training examples, encoded once per MAR stage")
    parser.add_argument("--sample-n", type=int, default=96, help="card: ar samples judged per model and cfg (0 = none)")
    parser.add_argument("--eval-cfgs", type=float, nargs="+", default=[1.0, 3.0],
                        help="card: guidance scales the target is judged at; the best becomes the pipeline's default")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--init-from", default=None, help="a saved part to continue (with --stage vae, target or "
                        "draft; copy it first when it is the output's own)")
    args = parser.parse_args(argv)
    out = parse_output_folder(parser, args, ZOO_DIR)
    data.set_threads(args.threads)
    seed_everything(args.seed)
    stages = ("vae", "target", "draft", "card") if args.stage == "all" else (args.stage,)
    if args.init_from and args.stage not in ("vae", "target", "draft"):
        parser.error("--init-from continues one part: pass --stage vae, target or draft")
    if stages[0] != "vae" and not (out / "vae" / "config.json").is_file():
        parser.error(f"no trained VAE in {out / 'vae'}: run --stage vae first")
    if stages[0] == "card" and not all((out / folder / "config.json").is_file() for folder in FOLDERS.values()):
        parser.error(f"--stage card needs vae/, model/ and draft/ in {out}")
    info = {}
    for stage in stages:
        if stage == "vae":
            info[stage] = train_vae(args, out)
        elif stage == "card":
            info[stage] = judge_and_assemble(out, args)
        else:
            info[stage] = train_mar(stage, args, out)
    return info


def judge_and_assemble(out: Path, args: argparse.Namespace) -> dict:
    """Judge the three parts (`shapes_mar_card`), then save OUT as a `MARPipeline` with its card."""
    from mmspec.image_ar.mar_pipeline import MARPipeline

    from . import shapes_mar_card as card

    parts = {name: cls.from_pretrained(out / name, torch_dtype=torch.float32).eval()
             for name, cls in (("model", MAR), ("vae", AutoencoderKL), ("draft", MAR))}
    components = {name: card.part_facts(out / name) for name in parts}
    components["vae"]["quality"] = card.vae_quality(parts["vae"], 480, args.seed)
    defaults = {"default_method": "cspd", "num_iter": min(64, parts["model"].seq_len), "num_draft": 8, "prefill_ratio": 0.15, "cfg": 1.0,
                "judge": card.JUDGE, "class_synonyms": data.CLASS_SYNONYMS}
    if args.sample_n > 0:
        pipe = MARPipeline(**parts, class_names=data.label_names(), model_name=NAME, card=defaults)
        components["model"]["quality"] = card.sample_quality(pipe, args.sample_n, args.eval_cfgs, args.seed)
        defaults["cfg"] = card.best_cfg(components["model"]["quality"])
        alone = MARPipeline(parts["draft"], parts["vae"], class_names=data.label_names(), model_name=NAME, card=defaults)
        components["draft"]["quality"] = card.sample_quality(alone, args.sample_n, [defaults["cfg"]], args.seed)
    assemble(out, defaults)
    return card.write_card(out, components, defaults)


def assemble(out: Path, defaults: dict) -> None:
    """Make OUT a saved `MARPipeline` (model_index.json over model/, vae/, draft/, with the class names and the
    card's defaults), so `MARPipeline.from_pretrained(OUT)` and `mmspec generate-image --model OUT` load it."""
    from mmspec.image_ar.mar_pipeline import MARPipeline

    parts = {"model": MAR, "vae": AutoencoderKL, "draft": MAR}
    loaded = {name: cls.from_pretrained(out / name, torch_dtype=torch.float16) for name, cls in parts.items()}
    MARPipeline(**loaded, class_names=data.label_names(), model_name=NAME, card=defaults).save_pretrained(out)
    print(f"saved the MARPipeline folder {out}", flush=True)


if __name__ == "__main__":
    main()
