"""Train the VQ image tokenizer of the zoo model ``shapes-image-ar`` (its ``vq/`` folder).

    python -m mmspec.image_ar.recipes.train_shapes_vq                       # full run, ~8 min of training
    python -m mmspec.image_ar.recipes.train_shapes_vq --steps 3 --eval-n 32 --out /tmp/x   # smoke

Model: :class:`mmspec.image_ar.VQModel` in LlamaGen's VQ layout, scaled down: three levels (channel
multipliers 1, 2, 2 of 32 channels) give a downsample factor of 4, so a 64 x 64 image is a 16 x 16
grid of codes; one residual block per level; a codebook of 512 codes of dimension 8, l2-normalised
as in LlamaGen (Sun et al. 2024, "Autoregressive Model Beats Diffusion"), which makes codes
compare by cosine and helps keep them in use. LANTERN (Jang et al. 2024) takes each code's nearest
neighbours in this latent space as the tokens it may swap, so the codebook must be trained, not
random: dead codes are re-seeded from live encoder outputs during the first part of training.

Loss (VQ-VAE, van den Oord et al. 2017, with LlamaGen's weights, no perceptual or GAN term):
    |x - x_hat|_1 + |x - x_hat|_2^2 + |sg(f) - e|^2 + 0.25 |f - sg(e)|^2
with f the l2-normalised encoder output, e its nearest code, and a straight-through gradient from
the decoder to the encoder. The reconstruction terms weight the shape's pixels 9x (``--fg-weight 8``):
a shape covers 1-9% of the image, and without the weight the VQ learned the background well but
rendered every shape in one muddy colour in a short trial. Images are fresh shapes-world renders
every step (never repeated).

Quality on held-out images: reconstruction PSNR and codebook usage (share of codes used, and the
perplexity of their histogram).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from mmspec.image_ar import VQConfig, VQModel
from mmspec.training import TrainingLoop, adamw, optimizer_step, seed_everything, set_lr, warmup_cosine

from . import image_ar_data as data


def build_vq(args: argparse.Namespace) -> VQModel:
    mult = [1, 2, 2]  # 3 levels -> downsample 4
    config = VQConfig(
        codebook_size=args.codebook_size,
        codebook_embed_dim=args.embed_dim,
        codebook_l2_norm=True,
        encoder_ch_mult=mult,
        decoder_ch_mult=mult,
        z_channels=64,
        ch=args.ch,
        num_res_blocks=1,
        norm_groups=8,
    )
    if config.downsample_factor != data.DOWNSAMPLE:
        raise AssertionError("the zoo contract is a 16 x 16 grid for 64 x 64 images")
    return VQModel(config)


def foreground_weights(x: torch.Tensor, fg_weight: float) -> torch.Tensor:
    """Per-pixel loss weights [B, 1, H, W]: 1 on the background, 1 + fg_weight on the shape.

    A shape covers 1.5-8% of the image, so an unweighted pixel loss is almost all background and
    the VQ learns the shapes' colours last. The background is each image's per-channel median over
    its border (shapes rarely reach the border); the shape is every pixel that differs from it.
    """
    border = torch.cat([x[..., 0, :], x[..., -1, :], x[..., :, 0], x[..., :, -1]], dim=-1)  # [B, 3, 4W]
    background = border.median(dim=-1).values[..., None, None]
    shape = ((x - background).abs() > 0.05).any(dim=1, keepdim=True)
    return 1.0 + fg_weight * shape.float()


def vq_losses(vq: VQModel, x: torch.Tensor, bf16: bool, fg_weight: float = 0.0
              ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor, torch.Tensor]:
    """One training forward: (loss, parts, codes [B, h, w], normalised latents [B, h, w, D]).

    Encoder and decoder may run in bf16; the nearest-code search always runs in fp32 so code
    assignments are exact. Reconstruction terms are weighted means (`foreground_weights`).
    """
    with data.autocast(bf16):
        z = vq.quant_conv(vq.encoder(x))
    quant, codes = vq.quantize.lookup(z.float())
    with data.autocast(bf16):
        recon = vq.decode_latents(quant).float()
    f = F.normalize(z.float().permute(0, 2, 3, 1), dim=-1)
    e = vq.quantize.codebook()[codes]
    w = foreground_weights(x, fg_weight)
    w = w / w.mean()
    rec_l1, rec_l2 = (w * (recon - x).abs()).mean(), (w * (recon - x).pow(2)).mean()
    codebook, commit = F.mse_loss(e, f.detach()), F.mse_loss(f, e.detach())
    loss = rec_l1 + rec_l2 + codebook + 0.25 * commit
    parts = {"l1": rec_l1.item(), "l2": rec_l2.item(), "codebook": codebook.item(), "commit": commit.item()}
    return loss, parts, codes, f.detach()


@torch.no_grad()
def restart_dead_codes(vq: VQModel, opt: torch.optim.Optimizer, counts: torch.Tensor, latents: torch.Tensor,
                       generator: torch.Generator) -> int:
    """Re-seed codes unused since the last restart with random live latents (plus a little noise),
    and clear their optimiser moments, so the whole codebook ends up trained."""
    dead = (counts == 0).nonzero().flatten()
    if dead.numel() == 0:
        return 0
    pool = latents.reshape(-1, latents.shape[-1])
    pick = torch.randint(0, pool.shape[0], (dead.numel(),), generator=generator)
    noise = 0.02 * torch.randn(dead.numel(), pool.shape[1], generator=generator)
    weight = vq.quantize.embedding.weight
    weight[dead] = F.normalize(pool[pick] + noise, dim=-1)
    state = opt.state.get(weight, {})
    for key in ("exp_avg", "exp_avg_sq"):
        if key in state:
            state[key][dead] = 0
    return int(dead.numel())


def fit_codebook_model(args: argparse.Namespace, build: Callable[[argparse.Namespace], torch.nn.Module],
                       codebook_size: int, desc: str, losses: Callable[..., tuple],
                       restart: Callable[..., int] | None = None,
                       restart_pool: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] = lambda vq, latents: latents,
                       ) -> tuple[torch.nn.Module, TrainingLoop, int]:
    """Build and train a VQ the way both VQ recipes do: AdamW, warm-up + cosine, dead-code restarts.

    `losses(vq, x, bf16, fg_weight)` returns the loss, its parts for the log, the codes drawn (one map or
    a list of maps) and the latents; `restart_pool(vq, latents)` gives the vectors a restart draws from and
    `restart` re-seeds dead codes (default: this VQ's). Returns the VQ, the finished loop and the number
    of codes restarted.
    """
    data.set_threads(args.threads)
    seed_everything(args.seed)
    vq = build(args).train()
    print(f"{desc}: {sum(p.numel() for p in vq.parameters()) / 1e6:.2f}M parameters, codebook {codebook_size}, "
          f"bf16 autocast {data.autocast_state(args.bf16)}", flush=True)
    restart = restart or restart_dead_codes
    stream = data.Stream(args.seed, "train")
    opt = adamw(vq, args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(args.seed)
    counts = torch.zeros(codebook_size, dtype=torch.long)
    restarted = 0
    loop = TrainingLoop(args.max_minutes, args.steps, desc=desc)
    for step in loop:
        x = data.to_model_range(stream.take(args.batch_size).images)
        set_lr(opt, warmup_cosine(step, loop.planned(), args.warmup, floor=0.1, peak=args.lr))
        loss, parts, codes, latents = losses(vq, x, args.bf16, args.fg_weight)
        optimizer_step(opt, loss, vq.parameters())
        for code_map in codes if isinstance(codes, (list, tuple)) else [codes]:
            counts += torch.bincount(code_map.flatten(), minlength=codebook_size)
        # Restarts stop after 60% of the run so the final codebook settles.
        if args.restart_every and (step + 1) % args.restart_every == 0 and step < 0.6 * loop.planned():
            restarted += restart(vq, opt, counts, restart_pool(vq, latents), generator)
            counts.zero_()
        loop.log(step, loss.item(), every=50, **parts)
    return vq, loop, restarted


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `fit_codebook_model` reads besides the common recipe ones."""
    parser.add_argument("--fg-weight", type=float, default=8.0, help="extra reconstruction weight on shape pixels")
    parser.add_argument("--restart-every", type=int, default=100, help="dead-code restart period in steps (0 = never)")


@torch.no_grad()
def evaluate(vq: VQModel, heldout: data.ImageSet, batch_size: int = 128) -> dict:
    """Held-out PSNR (images in [0, 1], per image, averaged) and codebook usage."""
    vq.eval()
    psnrs, all_codes = [], []
    for i in range(0, len(heldout), batch_size):
        x = data.to_model_range(heldout.images[i : i + batch_size])
        codes = vq.encode(x)
        recon = vq.decode(codes).clamp(-1, 1)
        mse = ((recon - x) / 2).pow(2).flatten(1).mean(1).clamp(min=1e-10)
        psnrs.append(10 * torch.log10(1 / mse))
        all_codes.append(codes.flatten())
    codes = torch.cat(all_codes)
    hist = torch.bincount(codes, minlength=vq.config.codebook_size).double()
    p = hist[hist > 0] / hist.sum()
    vq.train()
    return {
        "heldout_psnr_db": round(float(torch.cat(psnrs).mean()), 2),
        "heldout_psnr_min_db": round(float(torch.cat(psnrs).min()), 2),
        "codebook_usage": round(float((hist > 0).float().mean()), 4),
        "codes_used": int((hist > 0).sum()),
        "code_perplexity": round(float(torch.exp(-(p * p.log()).sum())), 1),
        "heldout_images": len(heldout),
    }


def train(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    vq, loop, restarted = fit_codebook_model(args, build_vq, args.codebook_size, "VQ", vq_losses)
    n_params = sum(p.numel() for p in vq.parameters())
    heldout = data.images(args.eval_n, args.seed, "heldout")
    wall = loop.wall
    vq.half().float()  # evaluate what ships (fp16 weights)
    quality = evaluate(vq, heldout)
    print(json.dumps(quality), flush=True)
    folder = data.save_fp16(vq, out / "vq")
    info = {
        "architecture": "mmspec.image_ar.VQModel (LlamaGen VQ parameter names)",
        "config": {"codebook_size": args.codebook_size, "codebook_embed_dim": args.embed_dim, "codebook_l2_norm": True,
                   "ch": args.ch, "ch_mult": [1, 2, 2], "z_channels": 64, "num_res_blocks": 1, "norm_groups": 8,
                   "downsample_factor": data.DOWNSAMPLE},
        "params": n_params,
        "file_size_bytes": (folder / "model.safetensors").stat().st_size,
        "dtype": "float16",
        "trained_on": (f"{loop.done * args.batch_size} fresh train renders (image_ar_data.Stream(seed={args.seed})), "
                       f"{loop.done} steps x {args.batch_size}"),
        "loss": (f"L1 + L2 reconstruction (shape pixels weighted {1 + args.fg_weight:g}x) + codebook + 0.25 commitment "
                 "(l2-normalised codes, straight-through)"),
        "dead_code_restarts": restarted,
        "optimiser": (f"AdamW lr {args.lr}, betas (0.9, 0.95), warm-up {args.warmup}, cosine to 10%, "
                      f"bf16 autocast {data.autocast_state(args.bf16)}"),
        **data.timing_facts(loop, wall, args.threads),
        "quality": {**quality, "measured_on": f"image_ar_data.images({args.eval_n}, seed={args.seed}, split='heldout'), fp16 weights"},
        "rebuild_command": f"python -m mmspec.image_ar.recipes.train_shapes_vq --steps {loop.done} --max-minutes 60",
    }
    return data.finish(out, "vq", info, folder, wall)


def main(argv: list[str] | None = None) -> dict:
    parser = data.recipe_parser(__doc__, "the model folder (the VQ goes to OUT/vq)", max_minutes=8.0, batch_size=16,
                                lr=0.002, warmup=50)
    parser.add_argument("--codebook-size", type=int, default=512)
    parser.add_argument("--embed-dim", type=int, default=8)
    parser.add_argument("--ch", type=int, default=32)
    add_fit_arguments(parser)
    parser.add_argument("--eval-n", type=int, default=1024)
    return train(data.parse_recipe_args(parser, argv))


if __name__ == "__main__":
    main()
