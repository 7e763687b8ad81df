"""Train the drafter of the zoo model ``shapes-image-ar`` (its ``drafter/`` folder): a tiny AR model
with the target's vocabulary, for plain speculative decoding and LANTERN's relaxed acceptance.

    python -m mmspec.image_ar.recipes.train_shapes_drafter                   # full run, ~5 min of training
    python -m mmspec.image_ar.recipes.train_shapes_drafter --steps 3 --train-n 256 --heldout-n 48 --out /tmp/x   # smoke

Model: a 1-layer :class:`mmspec.image_ar.LlamaGenForClassConditional` (dim 256, 8 heads), the
same 512-code vocabulary, 24 classes + the null class (so it can be guided like the target). It
drafts the next tokens the way LANTERN's drafters do (Jang et al. 2024 use EAGLE heads; here a
tiny AR model stands in); a drafter is worth what it agrees with the target, so it is
distilled: loss = 0.5 cross-entropy on the real codes + 0.5 KL(target || drafter) on the target's
logits for the same (teacher-forced) sequences and the same (possibly dropped) labels.

Data: the VQ codes the target was trained on (the same cache). Quality, on held-out sequences
teacher-forced through both models, unguided and at the card's guidance scale (both models
guided, as the pipeline guides them): top-1 agreement (drafter argmax == target argmax) and the
mean of sum_x min(p(x), q(x)) = 1 - TV(p, q), which is the acceptance rate of one draft under
lossless speculative sampling at temperature 1 (Leviathan et al. 2023).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from mmspec.image_ar import LlamaGenForClassConditional
from mmspec.image_ar.target import guided_logits
from mmspec.training import TrainingLoop, adamw, optimizer_step, seed_everything

from . import image_ar_data as data
from .train_shapes_image_ar import add_gpt_arguments, build_model, code_batches, heldout_loss, load_codes


def distil_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Forward KL(teacher || student), averaged over positions."""
    t = F.log_softmax(teacher_logits.float(), -1)
    s = F.log_softmax(student_logits.float(), -1)
    return (t.exp() * (t - s)).sum(-1).mean()


def guided(model: LlamaGenForClassConditional, labels: torch.Tensor, codes: torch.Tensor, scale: float) -> torch.Tensor:
    """Teacher-forced logits for all 256 positions, classifier-free guided when scale != 1."""
    if scale == 1.0:
        return model(class_labels=labels, input_ids=codes[:, :-1]).logits
    both = model(class_labels=torch.cat([labels, torch.full_like(labels, model.config.null_class)]),
                 input_ids=torch.cat([codes, codes])[:, :-1]).logits
    cond, uncond = both.chunk(2)
    return guided_logits(cond, uncond, scale)


@torch.no_grad()
def agreement(drafter: LlamaGenForClassConditional, target: LlamaGenForClassConditional, codes: torch.Tensor,
              labels: torch.Tensor, scale: float, batch_size: int = 32) -> dict:
    """Top-1 agreement and mean 1 - TV (one-draft acceptance rate at temperature 1) on teacher-forced codes."""
    agree, overlap, count = 0, 0.0, 0
    for i in range(0, codes.shape[0], batch_size):
        x, y = codes[i : i + batch_size].long(), labels[i : i + batch_size]
        p = guided(target, y, x, scale).float()
        q = guided(drafter, y, x, scale).float()
        agree += (p.argmax(-1) == q.argmax(-1)).sum().item()
        overlap += torch.minimum(p.softmax(-1), q.softmax(-1)).sum(-1).sum().item()
        count += x.numel()
    return {"top1_agreement": round(agree / count, 4), "acceptance_rate_t1": round(overlap / count, 4)}


def train(args: argparse.Namespace) -> dict:
    data.set_threads(args.threads)
    seed_everything(args.seed)
    out = Path(args.out)
    target_dir = Path(args.target) if args.target else out
    vq_dir = Path(args.vq) if args.vq else out / "vq"
    if not (target_dir / "model.safetensors").is_file():
        raise SystemExit(f"no target in {target_dir}: run python -m mmspec.image_ar.recipes.train_shapes_image_ar first")
    target = LlamaGenForClassConditional.from_pretrained(target_dir, dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    codes, labels, held_codes, held_labels, prep = load_codes(args, vq_dir)
    drafter = build_model(target.config.vocab_size, args.dim, args.layers, args.heads, args.class_dropout).train()
    n_params = sum(p.numel() for p in drafter.parameters())
    print(f"drafter: {n_params / 1e6:.2f}M parameters ({args.layers} layer(s), dim {args.dim}); distillation weight "
          f"{args.distil_weight}", flush=True)
    opt = adamw(drafter, args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    generator = torch.Generator().manual_seed(args.seed + 1)
    loop = TrainingLoop(args.max_minutes, args.steps, desc="drafter")
    for step, x, y in code_batches(loop, opt, codes, labels, args, drafter.config.null_class, generator):
        with data.autocast(args.bf16):
            out_d = drafter(class_labels=y, input_ids=x[:, :-1], labels=x)
            loss = out_d.loss
            if args.distil_weight > 0:
                with torch.no_grad():
                    teacher = target(class_labels=y, input_ids=x[:, :-1]).logits
                loss = (1 - args.distil_weight) * loss + args.distil_weight * distil_loss(out_d.logits, teacher)
        optimizer_step(opt, loss, drafter.parameters())
        loop.log(step, loss.item(), every=25)
    wall = loop.wall
    drafter.half().float()  # evaluate what ships
    drafter.eval()
    card_file = out / "zoo_card.json"
    scale = float(json.loads(card_file.read_text()).get("guidance_scale", 1.0)) if card_file.is_file() else 1.0
    agree_codes, agree_labels = held_codes[: args.agree_n], held_labels[: args.agree_n]
    quality = {**heldout_loss(drafter, held_codes, held_labels),
               "unguided": agreement(drafter, target, agree_codes, agree_labels, 1.0)}
    if scale != 1.0:
        quality[f"guided_cfg_{scale:g}"] = agreement(drafter, target, agree_codes, agree_labels, scale)
    quality["agreement_sequences"] = int(agree_codes.shape[0])
    print(json.dumps(quality), flush=True)
    folder = data.save_fp16(drafter, out / "drafter")
    info = {
        "architecture": "LlamaGenForClassConditional",
        "role": "drafter (plain speculative decoding, LANTERN)",
        "params": n_params,
        "file_size_bytes": (folder / "model.safetensors").stat().st_size,
        "dtype": "float16",
        "architecture_config": {"dim": args.dim, "n_layer": args.layers, "n_head": args.heads,
                                "class_dropout_prob": args.class_dropout},
        "trained_on": (f"the target's training codes (first {args.train_n} train examples); {loop.done} steps x "
                       f"{args.batch_size}; loss {1 - args.distil_weight:g} x cross-entropy + {args.distil_weight:g} x "
                       "KL(target || drafter), same dropped labels for both"),
        "optimiser": (f"AdamW lr {args.lr}, betas (0.9, 0.95), warm-up {args.warmup}, cosine to 10%, "
                      f"bf16 autocast {data.autocast_state(args.bf16)}"),
        **data.timing_facts(loop, wall, args.threads, prep),
        "quality": {**quality, "measured_on": (f"held-out sequences (loss: {args.heldout_n}, agreement: "
                                               f"{int(agree_codes.shape[0])}) teacher-forced through drafter and target, "
                                               "fp16 weights upcast to fp32; acceptance_rate_t1 = mean sum_x "
                                               "min(p, q)")},
        "rebuild_command": f"python -m mmspec.image_ar.recipes.train_shapes_drafter --steps {loop.done} --max-minutes 60",
    }
    return data.finish(out, "drafter", info, folder, wall)


def main(argv: list[str] | None = None) -> dict:
    parser = data.recipe_parser(__doc__, "the model folder (the drafter goes to OUT/drafter)", max_minutes=5.0,
                                batch_size=32, lr=0.002, warmup=50)
    parser.add_argument("--target", default=None, help="target folder (default OUT)")
    add_gpt_arguments(parser, layers=1, train_n_help="must match the target's to reuse its cached codes")
    parser.add_argument("--distil-weight", type=float, default=0.5, help="weight of the KL to the target (0 = codes only)")
    parser.add_argument("--agree-n", type=int, default=256, help="held-out sequences for the agreement numbers")
    return train(data.parse_recipe_args(parser, argv))


if __name__ == "__main__":
    main()
