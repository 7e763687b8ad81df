"""CoDe's specialised fine-tune for the zoo model ``shapes-var``: a refiner (or a drafter) for one draft_scales N.

    python -m mmspec.image_ar.recipes.train_shapes_var_code --stage refiner --draft-scales 6 --threads 2   # OUT/refiner-6
    python -m mmspec.image_ar.recipes.train_shapes_var_code --stage drafter --draft-scales 6 --threads 2   # OUT/drafter-6
    python -m mmspec.image_ar.recipes.train_shapes_var_code --stage refiner --draft-scales 6 --steps 3 --train-n 96 \\
        --heldout-n 48 --sample-n 24 --out /tmp/x                                      # smoke (needs OUT/vq, model, refiner)

The paper (Chen et al. 2024) fine-tunes each model for its part of the scales (the official repository
has no training code; the authors describe it in answers on their repository):

refiner  starts from ``OUT/refiner`` (the independently trained small VAR; ``--init-from`` another) and
         distils the large VAR ``OUT/model`` (frozen): KL(large || refiner) of the next-scale
         distributions, teacher-forced on ground-truth code maps, first over every scale (the first
         ``--all-scales-share`` of the steps), then only over scales N..end, the ones it generates in CoDe.
drafter  starts from ``OUT/model`` and trains with cross-entropy on the ground-truth codes of scales
         0..N-1 only. It is no longer a whole model: use it only as CoDe's drafter at this N.

``--large-samples M`` (refiner only) adds M sequences sampled from the large VAR itself with the card's
sampler (guidance ``--cfg``, top-k 75, top-p 0.95) and takes ``--sample-share`` of every batch from them:
at inference the refiner continues the large model's samples, not real images, so it also learns the
teacher there (sequence-level distillation; the paper's recipe is ``M = 0``, real images only).

Losses: :mod:`mmspec.image_ar.code_training`. Data: the cached VQ codes of ``train_shapes_var``. Quality,
before and after, on held-out sequences: the refiner's KL to the large VAR on scales N..end (refiner) or
the token loss on scales 0..N-1 (drafter), and the judge's class accuracy of CoDe samples at N (the large
VAR, or the new drafter, with the refiner) at guidance ``--cfg``. A refiner written into a saved pipeline
folder (OUT/model_index.json) is listed in its card, so ``VARPipeline.from_pretrained(OUT)`` runs it at
draft_scales N (and the card's default becomes N = scales - 2 once refiner-(scales-2) exists); elsewhere use
``VARPipeline.from_pretrained("shapes-var", refiner=".../refiner-6")`` or
``mmspec bench image --model shapes-var --drafter .../refiner-6 --draft-scales 6``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from mmspec.image_ar.code import check_draft_steps, code_generate
from mmspec.image_ar.code_training import drafter_loss, refiner_loss, scale_positions, teacher_forced_logits
from mmspec.image_ar.judge import load_judge
from mmspec.image_ar.var import VAR, VARSampling
from mmspec.image_ar.var_vq import VQVAE
from mmspec.training import IndexBatches, optimizer_step, seed_everything, set_lr, warmup_cosine

from . import build_shapes_var, shapes_var
from . import image_ar_data as data
from .train_shapes_var import cached_scale_codes, optimiser_text, saved_var_facts, split_scales, training_parts

STAGES = {"refiner": "refiner", "drafter": "model"}  # stage -> the folder it starts from


def load_var(folder: Path, what: str) -> VAR:
    try:
        return VAR.from_pretrained(folder, torch_dtype=torch.float32)
    except (OSError, ValueError) as error:
        raise SystemExit(f"cannot load the {what} in {folder}: {str(error).splitlines()[0]}") from None


@torch.no_grad()
def heldout_metric(stage: str, model: VAR, teacher: VAR, vq: VQVAE, codes: torch.Tensor, labels: torch.Tensor,
                   n: int, batch_size: int = 96) -> dict:
    """refiner: mean KL(teacher || model) per token on scales n..end; drafter: token loss on scales 0..n-1."""
    model.eval()
    where = scale_positions(model, range(n, len(model.patch_nums)) if stage == "refiner" else range(0, n))
    total, count = 0.0, 0
    for i in range(0, codes.shape[0], batch_size):
        maps, y = split_scales(model, codes[i : i + batch_size]), labels[i : i + batch_size]
        logp = teacher_forced_logits(model, vq, y, maps)[:, where].float().log_softmax(-1)
        if stage == "refiner":
            teacher_logp = teacher_forced_logits(teacher, vq, y, maps)[:, where].float().log_softmax(-1)
            total += (teacher_logp.exp() * (teacher_logp - logp)).sum().item()
        else:
            total += F.nll_loss(logp.reshape(-1, model.V), codes[i : i + batch_size, where].long().reshape(-1),
                                reduction="sum").item()
        count += logp.shape[0] * logp.shape[1]
    model.train()
    name = "heldout_kl_to_large_on_refined_scales" if stage == "refiner" else "heldout_token_loss_on_drafted_scales"
    return {name: round(total / count, 4)}


@torch.no_grad()
def code_accuracy(drafter: VAR, refiner: VAR, vq: VQVAE, judge, n_images: int, draft_scales: int, cfg: float,
                  seed: int) -> float:
    """The judge's class accuracy on CoDe samples (classes i mod 24; temperature 1, no top-k)."""
    labels = torch.arange(n_images) % data.NUM_CLASSES
    modes = [(model, model.training) for model in (drafter, refiner)]
    drafter.eval(), refiner.eval()
    out = code_generate(drafter, refiner, vq, labels, draft_scales, VARSampling(cfg=cfg), torch.Generator().manual_seed(seed))
    for model, training in modes:
        model.train(training)
    return round(judge.class_accuracy(out.images * 2 - 1, labels), 4)


@torch.no_grad()
def large_samples(large: VAR, vq: VQVAE, n: int, cfg: float, seed: int, cache_dir: Path,
                  batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int16 [n, L], labels [n]): n sequences the large VAR samples itself (classes in turn), cached."""
    key = hashlib.sha256(b"".join(p.detach().float().numpy().tobytes() for p in large.parameters())).hexdigest()[:16]
    filters = "-k{top_k}-p{top_p:g}".format(**shapes_var.SAMPLER)
    path = cache_dir / f"var-large-samples-s{seed}-n{n}-cfg{cfg:g}{filters}-{key}.pt"
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        return saved["codes"], saved["labels"]
    labels = torch.arange(n) % large.num_classes
    generator, sampling, codes = torch.Generator().manual_seed(seed + 7919), VARSampling(cfg=cfg, **shapes_var.SAMPLER), []
    for i in tqdm(range(0, n, batch_size), desc="large VAR samples", mininterval=10):
        state = large.begin(labels[i : i + batch_size])
        large.run_scales(state, vq, 0, len(large.patch_nums), sampling, generator)
        codes.append(torch.cat(state.token_maps, dim=1).to(torch.int16))
    codes = torch.cat(codes)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"codes": codes, "labels": labels}, path)
    return codes, labels


def earlier_runs(out: Path, section: str, init: Path) -> list[dict]:
    """The runs already in OUT's card for `section` when this run continues that section's own weights, else []."""
    if init.resolve() != (out / section).resolve() or not (out / "zoo_card.json").is_file():
        return []
    before = json.loads((out / "zoo_card.json").read_text()).get("components", {}).get(section)
    if not before:
        return []
    this = {key: before[key] for key in ("trained_on", "seconds_per_step", "train_wall_time_s", "rebuild_command")
            if key in before}
    this["train_wall_time_s"] = round(before.get("train_wall_time_s", 0) - sum(
        run.get("train_wall_time_s", 0) for run in before.get("earlier_runs", [])), 1)
    return [*before.get("earlier_runs", []), {**this, "quality_after": before.get("quality", {}).get("after")}]


def continued_facts(earlier: list[dict], wall: float) -> dict:
    """A continued section keeps its earlier runs, and its training time counts them all."""
    if not earlier:
        return {}
    return {"earlier_runs": earlier,
            "train_wall_time_s": round(wall + sum(run.get("train_wall_time_s", 0) for run in earlier), 1)}


def refiner_schedule(all_scales_share: float, n: int, scales: int) -> str:
    if all_scales_share == 0:
        return f"KL to the large VAR over scales {n}..{scales - 1} only"
    return (f"KL to the large VAR over every scale for the first {all_scales_share:.0%} of the steps, "
            f"then over scales {n}..{scales - 1}")


def rebuild_command(args: argparse.Namespace, steps: int, earlier: list[dict]) -> str:
    """This run's command; after the earlier runs' when it continued its own section (OUT/STAGE-N)."""
    command = (f"python -m mmspec.image_ar.recipes.train_shapes_var_code --stage {args.stage} --draft-scales "
               f"{args.draft_scales} --steps {steps} --threads {args.threads}")
    if earlier:  # the folder it continued is this section's own, whatever OUT is
        command += (f" --init-from {shapes_var.NAME}/{args.stage}-{args.draft_scales}"
                    f" --all-scales-share {args.all_scales_share:g}") + own_samples_flags(args)
        before = earlier[-1].get("rebuild_command")  # itself the whole chain of the runs before
        return f"{before} && {command}" if before else command
    if args.init_from:
        command += f" --init-from {args.init_from}"
    if args.all_scales_share != 0.5:
        command += f" --all-scales-share {args.all_scales_share:g}"
    return command + own_samples_flags(args)


def own_samples_flags(args: argparse.Namespace) -> str:
    if not args.large_samples:
        return ""
    return f" --large-samples {args.large_samples} --sample-share {args.sample_share:g} --cfg {args.cfg:g}"


def train(args: argparse.Namespace) -> dict:
    data.set_threads(args.threads)
    seed_everything(args.seed)
    out, n = Path(args.out), args.draft_scales
    vq_dir = out / "vq"
    if not (vq_dir / "config.json").is_file() or not (out / "model" / "config.json").is_file():
        raise SystemExit(f"no VQ-VAE or large VAR in {out}: build shapes-var first (build_shapes_var)")
    vq = VQVAE.from_pretrained(vq_dir, torch_dtype=torch.float32).eval()
    large = load_var(out / "model", "large VAR").eval().requires_grad_(False)
    try:
        check_draft_steps(n, len(large.patch_nums))
    except ValueError as error:
        raise SystemExit(str(error)) from None
    init = Path(args.init_from) if args.init_from else out / STAGES[args.stage]
    section = f"{args.stage}-{n}"
    earlier = earlier_runs(out, section, init)
    model = load_var(init, args.stage).train()
    model.check_vq(vq)
    refiner = None if args.stage == "refiner" else load_var(out / "refiner", "refiner")
    t0 = time.time()
    codes, labels = cached_scale_codes(vq_dir, vq, args.train_n, args.seed, "train", Path(args.cache_dir))
    held_codes, held_labels = cached_scale_codes(vq_dir, vq, args.heldout_n, args.seed, "heldout", Path(args.cache_dir))
    own = large_samples(large, vq, args.large_samples, args.cfg, args.seed, Path(args.cache_dir)) if args.large_samples else None
    per_batch = round(args.sample_share * args.batch_size) if own else 0
    prep = time.time() - t0
    judge = load_judge(args.judge) if args.sample_n else None

    def quality() -> dict:
        result = heldout_metric(args.stage, model, large, vq, held_codes, held_labels, n)
        if judge is not None:
            pair = (large, model) if args.stage == "refiner" else (model, refiner)
            result[f"code_{n}_class_accuracy_cfg_{args.cfg:g}"] = code_accuracy(*pair, vq, judge, args.sample_n, n,
                                                                                args.cfg, args.seed)
        return result

    before = quality()
    print(f"before: {json.dumps(before)}", flush=True)
    opt, generator, batches, loop = training_parts(model, args, codes.shape[0], f"CoDe {args.stage} N={n}")
    own_batches = IndexBatches(own[0].shape[0], generator) if own else None
    for step in loop:
        idx = batches.take(args.batch_size - per_batch)
        batch_codes, batch_labels = codes[idx], labels[idx]
        if per_batch:
            j = own_batches.take(per_batch)
            batch_codes, batch_labels = torch.cat([batch_codes, own[0][j]]), torch.cat([batch_labels, own[1][j]])
        maps = split_scales(model, batch_codes)
        set_lr(opt, warmup_cosine(step, loop.planned(), args.warmup, floor=0.1, peak=args.lr))
        with data.autocast(args.bf16):
            if args.stage == "refiner":  # stage one: every scale; stage two: only the scales it generates
                from_scale = 0 if step < args.all_scales_share * loop.planned() else n
                loss = refiner_loss(model, large, vq, batch_labels, maps, from_scale, args.class_dropout, generator)
            else:
                loss = drafter_loss(model, vq, batch_labels, maps, n, args.class_dropout, generator)
        optimizer_step(opt, loss.float(), model.parameters())
        loop.log(step, loss.item(), every=50, lr=opt.param_groups[0]["lr"])
    wall = loop.wall
    model.half().float()  # evaluate what ships (fp16 weights)
    after = quality()
    print(f"after: {json.dumps(after)}", flush=True)
    folder = data.save_fp16(model, out / section)
    info = {
        "role": f"CoDe {args.stage} fine-tuned for draft_scales {n} (use only at that N)",
        **saved_var_facts(model, folder),
        "trained_on": (f"VQ-VAE codes of image_ar_data.images({args.train_n}, seed={args.seed}, split='train')"
                       + (f" and {args.large_samples} of the large VAR's own samples (cfg {args.cfg:g}, top-k "
                          f"{shapes_var.SAMPLER['top_k']}, top-p {shapes_var.SAMPLER['top_p']}), {per_batch} of every batch"
                          if per_batch else "")
                       + f"; {loop.done} steps x {args.batch_size}; "
                       + ("continued from its own earlier runs (earlier_runs); " if earlier else f"started from {init}; ")
                       + (refiner_schedule(args.all_scales_share, n, len(model.patch_nums)) if args.stage == "refiner"
                          else f"cross-entropy on the ground truth of scales 0..{n - 1}")
                       + f"; class dropout {args.class_dropout}"),
        "optimiser": optimiser_text(args),
        **data.timing_facts(loop, wall, args.threads, prep),
        **continued_facts(earlier, wall),
        "quality": {"before": before, "after": after,
                    "measured_on": (f"{args.heldout_n} held-out sequences; {args.sample_n} CoDe samples at N={n}, "
                                    f"cfg {args.cfg:g}, temperature 1, judged by {args.judge}/judge")},
        "rebuild_command": rebuild_command(args, loop.done, earlier),
    }
    shapes_var.update_card(out, section, info)
    if args.stage == "refiner" and (out / "model_index.json").is_file():
        build_shapes_var.assemble(out)  # the pipeline lists the new refiner (run at draft_scales N) in its card
    else:
        shapes_var.update_card(out, "pipeline", shapes_var.summary(out))  # totals now count this model too
    print(f"saved {folder} after {wall:.0f}s of training", flush=True)
    return info


def main(argv: list[str] | None = None) -> dict:
    parser = shapes_var.recipe_parser(__doc__, "the shapes-var folder (reads vq/, model/, refiner/; writes STAGE-N/)",
                                      max_minutes=15.0, batch_size=32, lr=5e-4, warmup=50)
    parser.add_argument("--stage", choices=sorted(STAGES), required=True, help="which model to fine-tune")
    parser.add_argument("--draft-scales", type=int, required=True, metavar="N",
                        help="scales of the large model (the drafter); the refiner generates the rest")
    parser.add_argument("--init-from", default=None, help="a saved VAR to start from (default OUT/refiner or OUT/model)")
    parser.add_argument("--all-scales-share", type=float, default=0.5,
                        help="refiner: share of the steps distilled over every scale before only its own")
    parser.add_argument("--cache-dir", default=str(shapes_var.CACHE_DIR), help="where the encoded codes are cached")
    parser.add_argument("--class-dropout", type=float, default=0.1)
    parser.add_argument("--train-n", type=int, default=24000)
    parser.add_argument("--heldout-n", type=int, default=480)
    parser.add_argument("--sample-n", type=int, default=96, help="CoDe samples judged before and after (0 = skip)")
    parser.add_argument("--cfg", type=float, default=1.5, help="guidance of the judged samples (and of --large-samples)")
    parser.add_argument("--large-samples", type=int, default=0, metavar="M",
                        help="refiner: also distil on M sequences the large VAR samples itself (0 = real images only)")
    parser.add_argument("--sample-share", type=float, default=0.5,
                        help="share of every batch taken from --large-samples")
    parser.add_argument("--judge", default="shapes-image-ar", help="zoo model or folder whose judge scores samples")
    args = shapes_var.parse_recipe_args(parser, argv)
    if not 0 <= args.all_scales_share <= 1:
        parser.error("--all-scales-share must be in [0, 1]")
    if args.large_samples < 0 or not 0 <= args.sample_share <= 1:
        parser.error("--large-samples must be >= 0 and --sample-share in [0, 1]")
    if args.large_samples and args.stage != "refiner":
        parser.error("--large-samples distils the refiner: use it with --stage refiner")
    return train(args)


if __name__ == "__main__":
    main()
