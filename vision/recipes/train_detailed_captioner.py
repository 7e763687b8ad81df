"""Train the detailed video captioner: the zoo's ``LlavaNextVideoForConditionalGeneration``
(same classes and sizes as ``shapes-video-captioner``) taught to describe detailed
shapes-world scenes: every shape, the background and the order of events.

    python -m mmspec.vision.recipes.train_detailed_captioner                     # full run
    python -m mmspec.vision.recipes.train_detailed_captioner --time-steps 5 --threads 1   # time steps only
    python -m mmspec.vision.recipes.train_detailed_captioner --text-steps 1 --steps 3 --eval-n 2 --out /tmp/x  # smoke

It writes to ``--out`` (default ``./shapes-video-captioner``); ``--into-zoo`` replaces the shipped
captioner (its ``msd/`` and ``flash/`` drafters then need retraining against it). The shipped captioner
was made by this recipe in four runs, each continuing the last on new examples (``--seed``; its card's
``rebuild_steps``), the first started from the earlier one-shape captioner (``train_video_captioner``).

Start: ``--init-from`` a saved captioner (default: the shipped one, whose vision tower already
knows the shapes world's colours, kinds and motions), or ``--init-from none`` to build one from
the caption LM ``shapes-caption-lm`` with a fresh vision tower. The shipped caption tokenizer is
kept (ids unchanged, so the zoo's text drafter still shares them); words new to it (behind,
first, then, ...) are spelt with several of its tokens.

Data: detailed scenes and captions from :mod:`mmspec.world` (``sample_detailed_example`` of
train seeds), rendered on the fly at ``--frames`` frames (default 8 = 288 visual tokens; the
long-video mode is ``--frames 64`` = 2304). Sequences are ``<bos> <video>*36F describe the
video. caption <eos>``; the loss is on the caption and ``<eos>``.

Stages:
T. text: the LM alone learns the detailed grammar on ``<bos> caption <eos>`` (``--text-steps``);
B. captioning: caption cross-entropy through the whole model (vision tower, projector and LM
   at their own learning rates) plus a small video-level multi-label loss on a throw-away head
   over the pooled vision tokens (colours, kinds, motions, directions, sizes, background, count,
   interaction kinds, number of turns).

Long videos: ``--frames 64 --rope yarn:8 --lora 16`` extends the 8-frame captioner to 64 frames (2304
visual tokens, positions ~5x past the ~460 it was trained on): YaRN rotary scaling (Peng et al. 2023,
transformers' ``rope_parameters``) keeps the positions in the range the model knows, and a short fine-tune
trains only low-rank updates of the language model's linear layers and the projector (vision tower frozen,
no auxiliary loss). Such a run writes an overlay (``mmspec.low_rank``): the new config, the updates and the
projector, a few MB that the zoo merges into the starting captioner on first load (a card with
``derived_from: {"overlay": ...}``), so the package holds the captioner's weights once. ``--lora`` needs
``--init-from`` a zoo captioner.

Checkpoints: every ``--checkpoint-every`` steps (default 500) the weights, optimiser and step go to
``--checkpoint-dir`` (default ``~/.cache/mmspec/detailed-captioner-checkpoints/<output name>``, the newest
two kept); a run that was stopped continues with the same command plus ``--resume`` and ends on the same
weights. A finished run deletes them. Continuing from another detailed captioner (``--init-from``) records
its training in the card's ``earlier_training``.

Evaluation: greedy captions of ``--eval-n`` held-out videos, parsed by the fact checker
(:func:`mmspec.world.check_caption`) into per-attribute accuracy, next to a wrong-video
control (each caption generated from another held-out video: what the text alone gets right).

Cost (measured: ``--time-steps 5 --threads 1``, batch 8, 8 frames, on the 2-core development
machine shared with other jobs): stage T 1.9 s per step, stage B 7.0 s per step (the 28M LM
over ~430-token sequences dominates). Estimated wall time of the defaults at one thread:
300 x 1.9 s + 3000 x 7.0 s = about 21,600 s, i.e. about 6 hours, plus about a minute of
evaluation (8 held-out videos took 1.9 s untrained).
The long-video mode costs 18.2 s per captioning step at batch 2 (``--frames 64 --batch-size 2
--time-steps 3 --threads 1``; stage T 0.5 s), so it suits a short fine-tune of an 8-frame model.

On a GPU: ``--device cuda --bf16 --workers 12 --batch-size 32`` (bf16 autocast over fp32 weights, 12
processes rendering batches ahead) ran stage B at 0.058 s per step on an NVIDIA H200: 150 text + 6500
captioning steps in 409 s; the later runs took 0.063-0.084 s per step on the same kind of machine (the
data workers set the pace). ``--workers`` changes nothing but speed (the batches are the same).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoConfig, AutoTokenizer, LlavaNextVideoForConditionalGeneration

from mmspec.devices import synchronize, usable_device
from mmspec.errors import MMSpecError
from mmspec.low_rank import add_low_rank, apply_overlay, overlay_of, remove_low_rank
from mmspec.training import (
    Checkpoints,
    adamw,
    add_output_arguments,
    optimizer_step,
    parse_output_folder,
    seed_everything,
    warmup_cosine,
)
from mmspec.world import (
    event_slots,
    example_seed,
    interactions,
    parse_facts,
    render_video,
    sample_detailed_example,
    scene_facts,
    score_facts,
)
from mmspec.world.detailed_captions import MAX_TOKENS
from mmspec.world.detailed_facts import ATTRIBUTES
from mmspec.world.detailed_scenes import MAX_SHAPES
from mmspec.zoo import MODELS_DIR, entries
from mmspec.zoo.derived import file_digest

from . import captioner_data as cd
from .train_video_captioner import (
    LM_DIR,
    VideoHead,
    build_model,
    caption_batch,
    save_captioner_weights,
    target_card,
    write_card_and_samples,
)

OUT_DIR = MODELS_DIR / "shapes-video-captioner"
CHECKPOINT_ROOT = Path.home() / ".cache" / "mmspec" / "detailed-captioner-checkpoints"
CHECKPOINT_FORMAT = "mmspec-detailed-captioner-v1"
RELATIONS = ("behind", "in front of", "meets")
AUX_OUT = cd.AUX_DIM + len(RELATIONS) + 4  # + interaction kinds present + number of turns (0..3)
ROPE_KINDS = ("yarn", "linear", "dynamic")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROJECTOR = "model.multi_modal_projector."
OVERLAY = "overlay.safetensors"


def aux_targets(scene) -> np.ndarray:
    """The one-shape recipe's video-level targets plus what only detailed scenes have."""
    relations = {it.relation for it in interactions(scene)}
    turns = np.zeros(4, np.float32)
    turns[min(len(event_slots(scene)), 3)] = 1.0
    return np.concatenate([cd.aux_targets(scene), np.array([r in relations for r in RELATIONS], np.float32), turns])


# ---------------------------------------------------------------- model and data

def load_model(args):
    """The captioner to train and its tokenizer (with ``<video>``/``<image>``)."""
    if args.init_from.lower() == "none":
        model, tok, _ = build_model(Path(args.lm_dir), args.seed)
    else:
        config = AutoConfig.from_pretrained(args.init_from)
        if args.rope:
            config.text_config.rope_parameters = rope_parameters(args.rope, config.text_config)
        model = LlavaNextVideoForConditionalGeneration.from_pretrained(args.init_from, config=config,
                                                                      dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(args.init_from)
    # The sequence the model is trained on: prompt + visual tokens + the longest caption (RoPE has
    # no learned positions; this states the real length).
    longest = 1 + cd.TOKENS_PER_FRAME * args.frames + 8 + MAX_TOKENS + 1
    model.config.text_config.max_position_embeddings = max(model.config.text_config.max_position_embeddings,
                                                           1 << (longest - 1).bit_length())
    model.config.video_seq_length = cd.TOKENS_PER_FRAME * args.frames
    tok.model_max_length = model.config.text_config.max_position_embeddings
    model.generation_config.max_new_tokens = args.max_new_tokens
    return model, tok


def rope_parameters(spec: str, text_config) -> dict:
    """``yarn:8`` -> transformers' rope_parameters scaling the starting model's rotary positions by 8 (its
    trained range, ``max_position_embeddings``, becomes the original one)."""
    kind, factor = spec.split(":")
    return {"rope_type": kind, "factor": float(factor), "rope_theta": text_config.rope_parameters["rope_theta"],
            "original_max_position_embeddings": text_config.max_position_embeddings}


def zoo_name_of(folder: str) -> str | None:
    """The zoo name of a packaged model folder, else None."""
    return next((e.name for e in entries() if e.path.resolve() == Path(folder).resolve()), None)


class CaptioningBatches(torch.utils.data.Dataset):
    """Stage B's batches: batch ``b`` holds train examples ``first + b*size ...`` rendered, tokenised and
    with their video-level targets (a map-style dataset, so ``--workers`` processes prepare them in order)."""

    def __init__(self, tok, prefix: list[int], seed: int, first: int, size: int, steps: int, frames: int):
        self.tok, self.prefix, self.seed, self.first, self.size, self.steps, self.frames = (
            tok, prefix, seed, first, size, steps, frames)

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, b: int):
        start = self.first + b * self.size
        batch = [sample_detailed_example(example_seed("train", self.seed, i)) for i in range(start, start + self.size)]
        scenes = [s for s, _ in batch]
        ids, mask, labels = caption_batch(self.tok, self.prefix, [c for _, c in batch])
        target = torch.from_numpy(np.stack([aux_targets(s) for s in scenes]))
        return videos(scenes, self.frames), ids, mask, labels, target


class Stream:
    """Detailed train examples of ``seed``, index after index."""

    def __init__(self, seed: int, split: str = "train"):
        self.seed, self.split, self.next = seed, split, 0

    def take(self, n: int) -> list:
        out = [sample_detailed_example(example_seed(self.split, self.seed, i)) for i in range(self.next, self.next + n)]
        self.next += n
        return out


def videos(scenes, frames: int) -> torch.Tensor:
    return cd.normalise_frames(np.stack([render_video(s, frames, cd.FRAME_SIZE) for s in scenes]))


def text_batch(tok, captions: list[str]):
    """``<bos> caption <eos>`` right-padded, loss on everything after ``<bos>``."""
    return caption_batch(tok, [tok.bos_token_id], captions)


def pooled_features(model, pixel_values_videos: torch.Tensor) -> torch.Tensor:
    out = model.model.vision_tower(pixel_values_videos.flatten(0, 1), output_hidden_states=True)
    return model.model.vision_resampler(out.hidden_states[model.config.vision_feature_layer][:, 1:])


def caption_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits, target = logits[:, :-1].float(), labels[:, 1:]
    valid = target != -100
    return F.cross_entropy(logits[valid], target[valid])


# ---------------------------------------------------------------- evaluation

@torch.inference_mode()
def generate_captions(model, tok, pixel_values: torch.Tensor, frames: int, max_new_tokens: int) -> list[str]:
    prefix = cd.prompt_ids(tok, num_frames=frames)
    prompt = torch.tensor([prefix] * len(pixel_values), device=pixel_values.device)
    out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), pixel_values_videos=pixel_values,
                         max_new_tokens=max_new_tokens, do_sample=False)
    return [tok.decode(seq, skip_special_tokens=True).strip() for seq in out[:, len(prefix):]]


def accuracy(rows: list[tuple[str, object]]) -> dict[str, float | None]:
    """Per-attribute accuracy (correct / total summed over videos) of captions against scenes."""
    totals = {a: [0, 0] for a in ATTRIBUTES}
    for text, scene in rows:
        for attr, (c, t) in score_facts(parse_facts(text), scene_facts(scene)).items():
            totals[attr][0] += c
            totals[attr][1] += t
    return {a: (round(c / t, 4) if t else None) for a, (c, t) in totals.items()}


def evaluate(model, tok, heldout, frames: int, max_new_tokens: int, batch_size: int = 8) -> tuple[dict, list]:
    model.eval()
    own = []
    for i in range(0, len(heldout), batch_size):
        chunk = heldout[i : i + batch_size]
        pv = videos([s for s, _ in chunk], frames).to(next(model.parameters()).device)
        own += generate_captions(model, tok, pv, frames, max_new_tokens)
    scenes = [s for s, _ in heldout]
    # wrong-video control: caption video k+1, score against scene k
    shifted = own[1:] + own[:1] if len(own) > 1 else own
    quality = {"heldout_videos": len(heldout),
               "attribute_accuracy": accuracy(list(zip(own, scenes))),
               "wrong_video_control_accuracy": accuracy(list(zip(shifted, scenes))),
               "exact_match": round(sum(g == t for g, (_, t) in zip(own, heldout)) / len(heldout), 4)}
    samples = [{"truth": t, "generated": g} for g, (_, t) in zip(own, heldout)]
    model.train()
    return quality, samples


# ---------------------------------------------------------------- training

def autocast(args):
    """bf16 mixed precision with ``--bf16`` (fp32 weights and optimiser state), else a no-op."""
    return torch.autocast(args.device.type, dtype=torch.bfloat16, enabled=args.bf16)


def train(args) -> None:
    torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    start = time.time()
    model, tok = load_model(args)
    model.to(args.device).train()
    if args.lora:  # low-rank updates of the LM and the projector; everything else frozen
        model.requires_grad_(False)
        low_rank = add_low_rank(model, "model.language_model.", LORA_TARGETS, args.lora, 2.0 * args.lora)
        model.model.multi_modal_projector.requires_grad_(True)
    head = VideoHead(model.config.vision_config.hidden_size, args.frames, AUX_OUT).to(args.device)
    on = dict(device=args.device, non_blocking=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"captioner: {n_params / 1e6:.2f}M parameters, {cd.TOKENS_PER_FRAME * args.frames} visual tokens "
          f"per video ({args.frames} frames)", flush=True)
    stream = Stream(args.seed)
    lm_params = low_rank if args.lora else list(model.model.language_model.parameters())
    vision_params = [] if args.lora else list(model.model.vision_tower.parameters()) + list(head.parameters())
    use_aux = bool(vision_params) and args.aux_weight > 0  # the aux loss only teaches the vision tower
    proj_params = list(model.model.multi_modal_projector.parameters())
    # resumable: a checkpoint holds stage, step, weights and optimiser; its number counts T then B steps
    checkpoints = Checkpoints(args.checkpoint_dir, CHECKPOINT_FORMAT, "captioner")
    resumed = checkpoints.load() if args.resume and not args.time_steps else None
    text_steps = args.time_steps if args.time_steps and args.text_steps else args.text_steps
    done_t, done_b, text_s = 0, 0, 0.0
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        head.load_state_dict(resumed["head"])
        start -= float(resumed["elapsed"])  # the wall time of the run so far counts
        in_b = resumed["stage"] == "B"
        done_t, done_b = (text_steps, resumed["step"] + 1) if in_b else (resumed["step"] + 1, 0)
        text_s = float(resumed.get("text_s", 0.0))
        print(f"resumed from {checkpoints.latest()} (stage {resumed['stage']}, step {resumed['step']})", flush=True)

    def checkpoint(stage: str, step: int, steps: int, opt) -> None:
        if args.time_steps or not args.checkpoint_every or (step + 1) % args.checkpoint_every:
            return
        checkpoints.save(step + (text_steps if stage == "B" else 0), dict(
            stage=stage, step=step, model=model.state_dict(), head=head.state_dict(), opt=opt.state_dict(),
            elapsed=time.time() - start, text_s=text_s))

    # ---- stage T: the LM alone on detailed captions
    opt = adamw(lm_params, args.text_lr, weight_decay=0.0)
    if resumed is not None and resumed["stage"] == "T":
        opt.load_state_dict(resumed["opt"])
    stream.next = done_t * args.batch_size
    t_t = time.time()
    for step in range(done_t, text_steps):
        for g in opt.param_groups:
            g["lr"] = args.text_lr * warmup_cosine(step, text_steps, min(20, text_steps // 10), floor=0.1)
        ids, mask, labels = (t.to(args.device) for t in text_batch(tok, [c for _, c in stream.take(args.batch_size)]))
        with autocast(args):
            loss = caption_loss(model(input_ids=ids, attention_mask=mask).logits, labels)
        optimizer_step(opt, loss, lm_params)
        if step % 25 == 0 or step == text_steps - 1:
            print(f"T step {step} loss {loss.item():.4f} elapsed {time.time() - start:.0f}s", flush=True)
        text_s = (time.time() - t_t) / (step + 1 - done_t)
        checkpoint("T", step, text_steps, opt)
    synchronize(args.device)
    del opt

    # ---- stage B: captioning through the whole model
    prefix = cd.prompt_ids(tok, num_frames=args.frames)
    groups = [(g, lr) for g, lr in ((vision_params, args.vision_lr), (proj_params, args.proj_lr),
                                    (lm_params, args.lm_lr)) if g]
    opt = adamw([{"params": p, "lr": 0.0} for p, _ in groups], 0.0, weight_decay=0.0)
    if resumed is not None and resumed["stage"] == "B":
        opt.load_state_dict(resumed["opt"])
    steps = args.time_steps or args.steps
    # batch b holds the same examples whether or not the run was resumed before it
    batches = CaptioningBatches(tok, prefix, args.seed, stream.next + done_b * args.batch_size, args.batch_size,
                                steps - done_b, args.frames)
    stream.next += steps * args.batch_size
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=args.workers,
                                         pin_memory=args.device.type == "cuda",
                                         prefetch_factor=4 if args.workers else None)
    times = []
    t0 = time.time()
    for step, batch in enumerate(loader, start=done_b):
        pv, ids, mask, labels, target = (t.to(**on) for t in batch)
        captured = {}
        hook = model.model.vision_resampler.register_forward_hook(lambda m, i, o: captured.setdefault("pooled", o))
        try:
            with autocast(args):
                out = model(input_ids=ids, attention_mask=mask, pixel_values_videos=pv)
        finally:
            hook.remove()
        cap = caption_loss(out.logits, labels)
        aux = torch.zeros((), device=cap.device)
        if use_aux:
            with autocast(args):
                pooled = head(captured["pooled"])
            aux = F.binary_cross_entropy_with_logits(pooled.float(), target)
        loss = cap + args.aux_weight * aux
        f = warmup_cosine(step, steps, min(args.warmup, steps // 10), floor=0.1)
        for g, (_, lr) in zip(opt.param_groups, groups):
            g["lr"] = lr * f
        optimizer_step(opt, loss, [q for params, _ in groups for q in params])
        if step % 10 == 0 or step == steps - 1:  # .item() waits for the device: time whole stretches
            print(f"B step {step} caption_loss {cap.item():.4f} aux_loss {aux.item():.4f} "
                  f"elapsed {time.time() - start:.0f}s", flush=True)
        times.append(time.time() - t0)
        checkpoint("B", step, steps, opt)
        t0 = time.time()
    synchronize(args.device)
    if times:
        times[-1] = time.time() - t0 + times[-1]
    step_s = float(np.mean(times[1:] if len(times) > 1 else times)) if times else None
    print(f"seconds per step on {machine(args)}, batch {args.batch_size}, {args.frames} frames: "
          f"text {text_s:.3f}, captioning {'-' if step_s is None else f'{step_s:.3f}'}", flush=True)
    if args.time_steps:
        return
    train_wall = time.time() - start

    # ---- evaluate and ship fp16 (evaluate what ships: an overlay merged as the zoo merges it)
    overlay = None
    if args.lora:
        overlay = overlay_of(model, [n for n, _ in model.named_parameters() if n.startswith(PROJECTOR)])
        remove_low_rank(model)
        apply_overlay(model, overlay)
    model.half()
    model.float()
    heldout = [sample_detailed_example(example_seed("heldout", args.seed, i)) for i in range(args.eval_n)]
    t_e = time.time()
    quality, samples = evaluate(model, tok, heldout, args.frames, args.max_new_tokens)
    quality["eval_wall_time_s"] = round(time.time() - t_e, 1)
    print(json.dumps(quality, indent=1), flush=True)
    save(model, tok, Path(args.out), args, dict(n_params=n_params, train_wall=train_wall, text_s=text_s,
                                               step_s=step_s, data_size=stream.next), quality, samples, overlay)
    checkpoints.clear()  # the run is complete and saved; its resumable states (~12 bytes a parameter) go


def save(model, tok, folder: Path, args, info: dict, quality: dict, samples: list[dict], overlay=None) -> None:
    extra = {}
    if overlay is None:
        size = save_captioner_weights(model, tok, folder)
    else:
        size = save_overlay(model, tok, folder, overlay)
        parent = zoo_name_of(args.init_from)
        drafters = sorted(f.name for f in Path(args.init_from).iterdir() if (f / "config.json").is_file())
        extra = {"derived_from": {"model": parent, "overlay": OVERLAY,
                                  "parent_sha256": file_digest(Path(args.init_from) / "model.safetensors").hexdigest(),
                                  "folders": drafters},
                 "overlay": {"low_rank": {"rank": args.lora, "alpha": 2.0 * args.lora, "modules": list(LORA_TARGETS),
                                          "of": "every layer of the language model"},
                             "replaced": "the multimodal projector",
                             "tensors": len(overlay), "params": sum(t.numel() for t in overlay.values())},
                 "source": (f"{parent} with its rotary positions scaled ({args.rope}) and the overlay merged in on "
                            "first load (written to the user cache, ~/.cache/mmspec/zoo)")}
    card = target_card(folder, "video-captioning (detailed shapes world)", {
        "params": info["n_params"],
        "file_size_bytes": size,
        "dtype": "float16",
        "scenes": "detailed",
        "max_shapes": MAX_SHAPES,
        "frames": args.frames,  # the frame count it was trained on (the key the shipped captioner card uses)
        "visual_tokens_per_video": cd.TOKENS_PER_FRAME * args.frames,
        "frame_size": cd.FRAME_SIZE,
        "prompt": f"<video>{cd.PROMPT}",
        "vocab_size": len(tok),
        "started_from": f"the zoo's {OUT_DIR.name}" if args.init_from == str(OUT_DIR) else args.init_from,
        "earlier_training": earlier_training(args.init_from),
        "trained_on": (f"detailed shapes-world examples rendered on the fly (mmspec.world.sample_detailed_example("
                       f"example_seed('train', {args.seed}, i)), render_video(scene, {args.frames}, {cd.FRAME_SIZE})), "
                       f"i < {info['data_size']}; stage T: {args.text_steps} LM-only steps; stage B: {args.steps} "
                       f"steps x {args.batch_size} videos, caption cross-entropy"
                       + (" of the low-rank updates and the projector (vision tower and other weights frozen)"
                          if args.lora else f" + {args.aux_weight} x video-level multi-label loss on a throw-away head")),
        "seed": args.seed,
        "optimiser": (f"AdamW; stage T lr {args.text_lr}; stage B lr "
                      + (f"projector {args.proj_lr}, low-rank updates {args.lm_lr}" if args.lora else
                         f"vision {args.vision_lr}, projector {args.proj_lr}, LM {args.lm_lr}")
                      + "; warm-up then cosine to 10%"),
        "step_time_s": {"text": round(info["text_s"], 3), "captioning": info["step_s"]},
        "train_wall_time_s": round(info["train_wall"], 1),
        "train_machine": machine(args),
        "precision": "bf16 autocast, fp32 weights" if args.bf16 else "fp32",
        "quality": {**quality, "measured_on": f"{args.eval_n} held-out videos: sample_detailed_example(example_seed("
                                              f"'heldout', {args.seed}, i)), greedy, max {args.max_new_tokens} new "
                                              "tokens, fp16 weights upcast to fp32; per-attribute accuracy from "
                                              "mmspec.world.score_facts"},
        **({"rope_parameters": model.config.text_config.rope_parameters} if args.rope else {}),
        **extra,
        "rebuild_command": rebuild_command(args) + (f" --out {folder.name}" if overlay is not None else ""),
        **({"install": f"copy the output folder into {MODELS_DIR}/ (a zoo entry of its own)"} if overlay is not None
           else {}),
    })
    write_card_and_samples(folder, card, samples, size)


def save_overlay(model, tok, folder: Path, overlay: dict) -> int:
    """Write an overlay entry: config, generation config, processor and the overlay tensors (no full weights);
    returns the overlay's bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    model.config.dtype = torch.float16  # what the merged model is saved in
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    cd.build_processor(tok).save_pretrained(folder)
    save_file({k: v.contiguous() for k, v in overlay.items()}, str(folder / OVERLAY), metadata={"format": "pt"})
    return (folder / OVERLAY).stat().st_size


def earlier_training(init_from: str) -> list[dict]:
    """What made the starting captioner, when it is itself a detailed captioner (a continued run keeps its
    lineage: every stage's data, steps, wall time and machine)."""
    card_path = Path(init_from) / "zoo_card.json"
    if init_from.lower() == "none" or not card_path.is_file():
        return []
    card = json.loads(card_path.read_text())
    if card.get("scenes") != "detailed":
        return []
    keep = ("trained_on", "seed", "optimiser", "train_wall_time_s", "train_machine", "precision", "rebuild_command")
    return [*card.get("earlier_training", []), {k: card[k] for k in keep if k in card}]


def machine(args) -> str:
    if args.device.type == "cuda":
        return f"{torch.cuda.get_device_name(args.device)}, {args.workers} data workers"
    return f"{os.cpu_count()} CPU cores, torch.set_num_threads({args.threads}), {args.workers} data workers"


def rebuild_command(args) -> str:
    defaults = vars(build_parser().parse_args([]))
    parts = ["python -m mmspec.vision.recipes.train_detailed_captioner"]
    for name, value in vars(args).items():
        if name in ("out", "into_zoo", "lm_dir", "time_steps", "workers", "checkpoint_every", "checkpoint_dir",
                    "resume") or str(value) == str(defaults.get(name)):
            continue
        if value is True:
            parts.append(f"--{name.replace('_', '-')}")
            continue
        parts.append(f"--{name.replace('_', '-')} {value}")
    return " ".join(parts)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-from", default=str(OUT_DIR),
                        help="a saved captioner folder to start from, or 'none' for a fresh vision tower")
    parser.add_argument("--lm-dir", default=str(LM_DIR),
                        help="the caption LM to start from with --init-from none (train_caption_lm --which target)")
    add_output_arguments(parser, OUT_DIR.name, "the captioner")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="where to train: cpu, cuda, cuda:1, ...")
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision (fp32 weights)")
    parser.add_argument("--workers", type=int, default=0,
                        help="processes rendering captioning batches ahead (results do not depend on it)")
    parser.add_argument("--frames", type=int, default=cd.FRAMES, help="frames per training video")
    parser.add_argument("--text-steps", type=int, default=300)
    parser.add_argument("--text-lr", type=float, default=3e-4)
    parser.add_argument("--steps", type=int, default=3000, help="captioning steps")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--vision-lr", type=float, default=3e-4)
    parser.add_argument("--proj-lr", type=float, default=1e-3)
    parser.add_argument("--lm-lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--aux-weight", type=float, default=0.3)
    parser.add_argument("--eval-n", type=int, default=100)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_TOKENS + 10)
    parser.add_argument("--checkpoint-every", type=int, default=500,
                        help="steps between resumable checkpoints (0: none); the newest two are kept")
    parser.add_argument("--checkpoint-dir", default=None,
                        help=f"where checkpoints go (default {CHECKPOINT_ROOT}/<output folder name>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in --checkpoint-dir (same settings)")
    parser.add_argument("--rope", default=None,
                        help="scale the starting captioner's rotary positions for longer videos, e.g. yarn:8 "
                             f"({', '.join(ROPE_KINDS)})")
    parser.add_argument("--lora", type=int, default=0,
                        help="train only rank-R updates of the LM's linear layers and the projector, and write an "
                             "overlay on the --init-from zoo captioner (0: train the whole model)")
    parser.add_argument("--time-steps", type=int, default=0,
                        help="only time this many steps of each stage; save nothing")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.frames < 1 or args.steps < 0 or args.text_steps < 0 or args.batch_size < 1 or args.eval_n < 1:
        parser.error("--frames, --batch-size and --eval-n must be >= 1; --steps and --text-steps >= 0")
    if args.workers < 0:
        parser.error("--workers must be >= 0")
    try:
        args.device = usable_device(args.device)
    except MMSpecError as err:
        parser.error(str(err))
    if args.init_from.lower() != "none" and not (Path(args.init_from) / "config.json").is_file():
        parser.error(f"--init-from {args.init_from!r} is not a saved captioner folder (no config.json); "
                     "pass --init-from none to start from the caption LM")
    if args.rope:
        kind, _, factor = args.rope.partition(":")
        try:
            ok = kind in ROPE_KINDS and float(factor) > 1
        except ValueError:
            ok = False
        if not ok:
            parser.error(f"--rope {args.rope!r}: expected KIND:FACTOR with KIND one of {', '.join(ROPE_KINDS)} "
                         "and FACTOR > 1, e.g. yarn:8")
        if args.init_from.lower() == "none":
            parser.error("--rope extends a trained captioner: use it with --init-from a saved one")
    if args.lora < 0:
        parser.error("--lora must be >= 0")
    if args.lora and zoo_name_of(args.init_from) is None:
        parser.error("--lora writes an overlay on a zoo captioner: --init-from must be one (e.g. the default, "
                     f"{OUT_DIR})")
    if args.lora and args.into_zoo:
        parser.error("--lora writes an overlay on the zoo captioner, not a captioner to replace it: give it its "
                     "own --out")
    args.out = str(parse_output_folder(parser, args, OUT_DIR))
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must be >= 0")
    args.checkpoint_dir = args.checkpoint_dir or str(CHECKPOINT_ROOT / Path(args.out).name)
    try:
        train(args)
    except MMSpecError as err:  # an unreadable or foreign checkpoint
        parser.exit(1, f"error: {err}\n")


if __name__ == "__main__":
    main()
