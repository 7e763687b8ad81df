"""Train a one-shape video captioner: a real ``LlavaNextVideoForConditionalGeneration`` built from the
zoo caption LM. It made the earlier zoo ``shapes-video-captioner``, the starting point of the detailed
captioner that ships now (``train_detailed_captioner``).

    python -m mmspec.vision.recipes.train_video_captioner                  # full run, auto-sized
    python -m mmspec.vision.recipes.train_video_captioner --time-steps 3   # time steps only
    python -m mmspec.vision.recipes.train_video_captioner --aux-steps 4 --steps 4 --eval-n 4 --out /tmp/x  # smoke

It writes to ``--out`` (default ``./shapes-video-captioner``); ``--into-zoo`` replaces the shipped model.

Model: the caption LM ``shapes-caption-lm`` (Llama, tied embeddings) with two rows
appended to its embeddings for the new special tokens ``<video>`` and ``<image>``
(every existing token keeps its id), a tiny CLIP vision tower trained from scratch
(96x96 frames, 8 px patches, 3 layers, hidden 128), the LLaVA-NeXT-Video 2x2 average
pooler and a 2-layer projector. A video of 8 frames becomes 8 x 36 = 288 visual tokens.

Sequences are ``<bos> <video>*288 describe the video. caption <eos>``; the loss is on
the caption and ``<eos>`` only. Videos and captions come from the shapes world
(:mod:`mmspec.world`), rendered on the fly from seeded train examples.

Training has two stages, both cheap on CPU:

A. vision pre-training: the vision tower + pooler feed a small throw-away head (one
   transformer block over the 288 pooled tokens) that predicts what is in the video
   (colours, kinds, motions, directions, sizes, background, count, and kind x colour /
   kind x motion / colour x motion pairs) with a multi-label loss. No LM involved.
B. captioning: caption cross-entropy through the LM (+ the stage-A loss at a small
   weight); the LM is frozen for the first part and unfrozen with a small learning
   rate for the last ``--lm-frac`` of the steps.

``--steps 0`` (default) sizes stage B to the wall-clock budget ``--max-minutes`` from
the measured time of its first steps; the run also stops at that deadline whatever
happens and saves what it has. Then it evaluates ``--eval-n`` held-out videos (greedy
captions, 40 new tokens max) and saves fp16 safetensors, the processor and a
``zoo_card.json``.

``--content-weight`` up-weights the loss on caption words only the video can decide;
``--init-from`` continues from a saved captioner folder. The shipped captioner is the last of a
chain of runs, each continuing the one before with ``--init-from``: the defaults give a first run,
and the card's ``rebuild_command`` records the options of the last one.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import copy
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm
from transformers import (
    AutoTokenizer,
    CLIPVisionConfig,
    LlamaForCausalLM,
    LlavaNextVideoConfig,
    LlavaNextVideoForConditionalGeneration,
)

from mmspec.training import (
    adamw,
    add_output_arguments,
    optimizer_step,
    parse_output_folder,
    seed_everything,
    warmup_cosine,
)
from mmspec.world import example_seed, render_video, sample_example
from mmspec.zoo import MODELS_DIR

from . import captioner_data as cd

# The caption LM a captioner starts from: what `train_caption_lm --which target` writes by default. (The zoo's
# shapes-caption-lm is the shipped captioner's own fine-tuned language model, not this starting point.)
LM_DIR = Path("shapes-caption-lm")
DRAFTER_NAME = "shapes-caption-drafter"
OUT_DIR = MODELS_DIR / "shapes-video-captioner"
MAX_NEW_TOKENS = 40
# Caption words that only the video can decide; their loss can be up-weighted (--content-weight).
CONTENT_WORDS = set(cd.SHAPE_COLOURS) | set(cd.KIND_OF_WORD) | {
    "two", "three", "four", "small", "little", "medium", "large", "big", "left", "right", "up", "upwards", "down",
    "downwards", "stays", "stay", "staying", "does", "do", "not", "sits", "sit", "sitting", "moves", "move", "moving",
    "slides", "slide", "sliding", "travels", "travel", "travelling", "bounces", "bounce", "bouncing", "grows", "grow",
    "growing", "gets", "get", "getting", "bigger", "smaller", "shrinks", "shrink", "shrinking", "turns", "turn",
    "turning", "changes", "change", "changing", "white", "black", "grey", "top", "bottom", "centre", "middle"}
LM_UNFROZEN_SLOWDOWN = 1.6  # measured: a step with LM weight gradients / a frozen-LM step

VISION = dict(image_size=cd.FRAME_SIZE, patch_size=cd.PATCH_SIZE, hidden_size=128, intermediate_size=512,
              num_hidden_layers=3, num_attention_heads=4, num_channels=3)


# ---------------------------------------------------------------- model

def build_model(lm_dir: Path, seed: int):
    """The untrained captioner around the trained LM, and its extended tokenizer."""
    tok = AutoTokenizer.from_pretrained(lm_dir)
    old_vocab = len(tok)
    cd.extend_tokenizer(tok)
    tok.model_max_length = 512
    lm = LlamaForCausalLM.from_pretrained(lm_dir, dtype=torch.float32)
    if lm.config.vocab_size != old_vocab:
        raise RuntimeError(f"LM vocab {lm.config.vocab_size} != tokenizer vocab {old_vocab}")
    text_config = copy.deepcopy(lm.config)
    text_config.vocab_size = len(tok)
    # Sequences are ~330 tokens (288 visual); RoPE has no learned positions, so this
    # only states the real length (the caption LM was configured with 256).
    text_config.max_position_embeddings = max(512, text_config.max_position_embeddings)
    config = LlavaNextVideoConfig(
        vision_config=CLIPVisionConfig(**VISION), text_config=text_config,
        video_token_index=tok.convert_tokens_to_ids(cd.VIDEO_TOKEN),
        image_token_index=tok.convert_tokens_to_ids(cd.IMAGE_TOKEN),
        vision_feature_layer=-1, vision_feature_select_strategy="default",
        spatial_pool_mode="average", spatial_pool_stride=cd.POOL_STRIDE,
        image_grid_pinpoints=[[cd.FRAME_SIZE, cd.FRAME_SIZE]], tie_word_embeddings=True,
        video_seq_length=cd.VISUAL_TOKENS, image_seq_length=(cd.PATCHES_PER_SIDE ** 2),
        projector_hidden_act="gelu", multimodal_projector_bias=True)
    torch.manual_seed(seed)
    model = LlavaNextVideoForConditionalGeneration(config)
    # LM weights: the old embedding rows unchanged, the two new rows = the mean row.
    state = lm.model.state_dict()
    emb = state["embed_tokens.weight"]
    state["embed_tokens.weight"] = torch.cat([emb, emb.mean(0, keepdim=True).expand(len(tok) - old_vocab, -1)])
    model.model.language_model.load_state_dict(state, strict=True)
    if model.lm_head.weight.data_ptr() != model.model.language_model.embed_tokens.weight.data_ptr():
        model.lm_head.weight = model.model.language_model.embed_tokens.weight
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    gc.do_sample, gc.max_new_tokens = False, MAX_NEW_TOKENS
    return model, tok, old_vocab


class VideoHead(nn.Module):
    """Throw-away video-level head: one transformer block over a video's pooled tokens, multi-label out."""

    def __init__(self, dim: int, frames: int, out: int):
        super().__init__()
        self.frames = frames
        self.frame_emb = nn.Parameter(torch.randn(frames, 1, dim) * 0.02)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.block = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, out)

    def video_logits(self, pooled: torch.Tensor) -> torch.Tensor:
        """``[B*T, 36, dim]`` -> ``[B, out]`` logits."""
        bt, n, d = pooled.shape
        x = pooled.view(bt // self.frames, self.frames, n, d) + self.frame_emb
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x.flatten(1, 2)], 1)
        return self.out(self.norm(self.block(x)[:, 0]))

    forward = video_logits


class AuxHead(VideoHead):
    """Throw-away heads for stage A: the video-level head (motions, directions, ...) plus a per-token
    linear head (colour and kind of the shape under each pooled token, per frame)."""

    def __init__(self, dim: int, frames: int, out: int):
        super().__init__(dim, frames, out)
        self.dense = nn.Linear(dim, len(cd.DENSE_COLOURS) + len(cd.DENSE_KINDS))
        self.frame = nn.Linear(dim, cd.FRAME_TARGET_DIM)  # every token predicts its whole frame's content
        self.kind = nn.Linear(dim, len(cd.AUX_KINDS))  # stage A1: one-shape frames, kind from the mean token

    def forward(self, pooled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B*T, 36, dim]`` -> video logits ``[B, out]``, token logits ``[B*T, 36, 12]``."""
        return self.video_logits(pooled), self.dense(pooled)


DENSE_CLASS_WEIGHT = torch.tensor([0.25] + [1.0] * 6), torch.tensor([0.25] + [1.0] * 4)  # background down-weighted


def aux_loss(head: AuxHead, pooled: torch.Tensor, scenes, frame_weight: float = 0.0) -> torch.Tensor:
    """Multi-label video loss + per-token colour/kind cross-entropy (+ per-token frame content)."""
    video_logits, token_logits = head(pooled)
    target = torch.from_numpy(np.stack([cd.aux_targets(s) for s in scenes]))
    dense = torch.from_numpy(np.stack([cd.dense_targets(s) for s in scenes])).flatten(0, 1)  # [B*T, 36, 2]
    nc = len(cd.DENSE_COLOURS)
    colour = F.cross_entropy(token_logits[..., :nc].flatten(0, 1), dense[..., 0].flatten(), weight=DENSE_CLASS_WEIGHT[0])
    kind = F.cross_entropy(token_logits[..., nc:].flatten(0, 1), dense[..., 1].flatten(), weight=DENSE_CLASS_WEIGHT[1])
    loss = 5.0 * F.binary_cross_entropy_with_logits(video_logits, target) + colour + kind
    if frame_weight > 0:
        frames = torch.from_numpy(np.stack([cd.frame_targets(s) for s in scenes])).flatten(0, 1)  # [B*T, D]
        logits = head.frame(pooled)  # [B*T, 36, D]
        loss = loss + frame_weight * F.binary_cross_entropy_with_logits(logits, frames[:, None].expand_as(logits))
    return loss


def frame_batch(split: str, seed: int, start: int, n: int) -> tuple[torch.Tensor, list, list[int]]:
    """``n`` single frames, each from its own one-shape scene (a random frame of its clip): far more
    varied per step than the 8 frames of a few videos, which is what shape recognition needs."""
    pixels, scenes, picks = [], [], []
    for i in range(start, start + n):
        scene, _ = sample_example(example_seed(split, seed, i), 1)
        pick = random.Random(f"frame:{split}:{seed}:{i}").randrange(cd.FRAMES)
        pixels.append(render_video(scene, cd.FRAMES, cd.FRAME_SIZE)[pick])
        scenes.append(scene)
        picks.append(pick)
    return cd.normalise_frames(np.stack(pixels)[None])[0], scenes, picks


def frame_loss(model, head: "AuxHead", pixels: torch.Tensor, scenes, picks: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage A1: the frame's shape kind from its mean pooled token + each token's colour/kind (dense)."""
    pooled = pooled_features(model, pixels[:, None])  # [N, 36, dim]
    kind_logits = head.kind(pooled.mean(1))
    kinds = torch.tensor([cd.AUX_KINDS.index(s.shapes[0].kind) for s in scenes])
    dense = torch.from_numpy(np.stack([cd.dense_targets(s)[f] for s, f in zip(scenes, picks)]))  # [N, 36, 2]
    token_logits = head.dense(pooled)
    nc = len(cd.DENSE_COLOURS)
    colour = F.cross_entropy(token_logits[..., :nc].flatten(0, 1), dense[..., 0].flatten(), weight=DENSE_CLASS_WEIGHT[0])
    kind = F.cross_entropy(token_logits[..., nc:].flatten(0, 1), dense[..., 1].flatten(), weight=DENSE_CLASS_WEIGHT[1])
    return F.cross_entropy(kind_logits, kinds) + colour + kind, (kind_logits.argmax(-1) == kinds).float().mean()


def pooled_features(model, pixel_values_videos: torch.Tensor) -> torch.Tensor:
    """What the model's pooler outputs (before the projector): ``[B*T, 36, hidden]``."""
    b, t = pixel_values_videos.shape[:2]
    out = model.model.vision_tower(pixel_values_videos.flatten(0, 1), output_hidden_states=True)
    return model.model.vision_resampler(out.hidden_states[model.config.vision_feature_layer][:, 1:])


# ---------------------------------------------------------------- data

class Stream:
    """Train examples (scene, caption) of ``seed``, index after index; renders on the fly."""

    def __init__(self, seed: int, split: str = "train", max_shapes: int = 3):
        self.seed, self.split, self.next, self.max_shapes = seed, split, 0, max_shapes
        self.max_index = 0

    def take(self, n: int) -> list:
        out = [sample_example(example_seed(self.split, self.seed, i), self.max_shapes)
               for i in range(self.next, self.next + n)]
        self.next += n
        self.max_index = max(self.max_index, self.next)
        return out


def videos(scenes) -> torch.Tensor:
    return cd.normalise_frames(np.stack([render_video(s, cd.FRAMES, cd.FRAME_SIZE) for s in scenes]))


def caption_batch(tok, prefix: list[int], captions: list[str]):
    """Right-padded ``prefix + caption + <eos>``; labels only on caption and ``<eos>``."""
    caps = [ids + [tok.eos_token_id] for ids in tok(captions, add_special_tokens=False)["input_ids"]]
    width = len(prefix) + max(len(c) for c in caps)
    ids = torch.full((len(caps), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, c in enumerate(caps):
        seq = torch.tensor(prefix + c)
        ids[i, : len(seq)] = seq
        mask[i, : len(seq)] = 1
        labels[i, len(prefix) : len(seq)] = torch.tensor(c)
    return ids, mask, labels


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Every stage's schedule: warm-up, then cosine to 10% of the peak."""
    return warmup_cosine(step, total, warmup, floor=0.1)


# ---------------------------------------------------------------- evaluation

@torch.inference_mode()
def aux_accuracy(model, head, examples_) -> float:
    """Exact-set accuracy of the stage-A head on colours/kinds/motions (3 groups averaged)."""
    model.eval()
    scenes = [s for s, _ in examples_]
    pooled = pooled_features(model, videos(scenes))
    logits, token_logits = head(pooled)
    model.train()
    dense = torch.from_numpy(np.stack([cd.dense_targets(s) for s in scenes])).flatten(0, 1)
    nc = len(cd.DENSE_COLOURS)
    fg = dense[..., 0] > 0
    colour_acc = (token_logits[..., :nc].argmax(-1) == dense[..., 0])[fg].float().mean().item()
    kind_acc = (token_logits[..., nc:].argmax(-1) == dense[..., 1])[fg].float().mean().item()
    frames = torch.from_numpy(np.stack([cd.frame_targets(s) for s in scenes])).flatten(0, 1)[:, None]
    frame_bits = ((head.frame(pooled) > 0).float() == frames)[..., :10].all(-1).float().mean().item()
    print(f"held-out token accuracy on shape cells: colour {colour_acc:.3f}, kind {kind_acc:.3f}; "
          f"tokens knowing their frame's colours and kinds: {frame_bits:.3f}", flush=True)
    pred = (logits > 0).float().numpy()
    true = np.stack([cd.aux_targets(s) for s, _ in examples_])
    spans = {"colours": (0, 6), "kinds": (12, 16), "motions": (16, 22)}
    return float(np.mean([(pred[:, a:b] == true[:, a:b]).all(1).mean() for a, b in spans.values()]))


@torch.inference_mode()
def evaluate(model, tok, examples_, batch_size: int = 10) -> tuple[dict, list[dict]]:
    """Greedy captions of held-out videos vs their ground truth."""
    model.eval()
    prefix = cd.prompt_ids(tok)
    rows, nll, count = [], 0.0, 0
    for i in range(0, len(examples_), batch_size):
        chunk = examples_[i : i + batch_size]
        pv = videos([s for s, _ in chunk])
        ids, mask, labels = caption_batch(tok, prefix, [c for _, c in chunk])
        logits = model(input_ids=ids, attention_mask=mask, pixel_values_videos=pv).logits[:, :-1].float()
        target = labels[:, 1:]
        valid = target != -100
        nll += F.cross_entropy(logits[valid], target[valid], reduction="sum").item()
        count += valid.sum().item()
        prompt = torch.tensor([prefix] * len(chunk))
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), pixel_values_videos=pv,
                             max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        for (scene, truth), seq in zip(chunk, out[:, len(prefix):]):
            text = tok.decode(seq, skip_special_tokens=True).strip()
            rows.append({"truth": truth, "generated": text, "new_tokens": int((seq != tok.pad_token_id).sum()),
                         "ended": bool((seq == tok.eos_token_id).any()),
                         "pred": cd.parse_caption(text), "gold": cd.scene_attributes(scene)})
    model.train()
    n = len(rows)
    said_bg = [r for r in rows if r["pred"]["background"] is not None]
    acc = lambda key: sum(r["pred"][key] == r["gold"][key] for r in rows) / n  # noqa: E731
    quality = {
        "heldout_videos": n,
        "heldout_caption_exact_match": round(sum(r["generated"] == r["truth"] for r in rows) / n, 4),
        "heldout_attribute_accuracy": round((acc("colours") + acc("kinds") + acc("motions")) / 3, 4),
        "heldout_colour_accuracy": round(acc("colours"), 4),
        "heldout_shape_kind_accuracy": round(acc("kinds"), 4),
        "heldout_motion_accuracy": round(acc("motions"), 4),
        "heldout_all_three_correct": round(sum(all(r["pred"][k] == r["gold"][k] for k in ("colours", "kinds", "motions"))
                                               for r in rows) / n, 4),
        "heldout_direction_accuracy": round(acc("directions"), 4),
        "heldout_background_accuracy_when_mentioned": (
            round(sum(r["pred"]["background"] == r["gold"]["background"] for r in said_bg) / len(said_bg), 4)
            if said_bg else None),
        "heldout_caption_loss": round(nll / count, 4),
        "heldout_mean_new_tokens": round(sum(r["new_tokens"] for r in rows) / n, 2),
        "heldout_ended_with_eos": round(sum(r["ended"] for r in rows) / n, 4),
        "attribute_definition": ("per video, the set of shape colours (incl. colours changed to), of shape kinds "
                                 "(synonyms mapped: ball/disc->circle, box->square) and of motions named in the "
                                 "generated caption must equal the scene's; heldout_attribute_accuracy is the mean "
                                 "of the colour, kind and motion accuracies"),
    }
    for r in rows:
        r["pred"] = {k: sorted(v) if isinstance(v, set) else v for k, v in r["pred"].items()}
        r["gold"] = {k: sorted(v) if isinstance(v, set) else v for k, v in r["gold"].items()}
    return quality, rows


@torch.inference_mode()
def reading_probe(model, tok, prefix: list[int], examples_) -> dict:
    """Does the LM read the video? Teacher-forced accuracy on the caption words only the
    video can decide, with each caption's own video and with the videos rotated by one
    (a wrong video): reading shows as a gap between the two."""
    model.eval()
    content = torch.zeros(len(tok), dtype=torch.bool)
    colour = torch.zeros(len(tok), dtype=torch.bool)  # colour words have no synonyms: a clean accuracy
    for token, idx in tok.get_vocab().items():
        content[idx] = token.lstrip("\u0120") in CONTENT_WORDS
        colour[idx] = token.lstrip("\u0120") in cd.SHAPE_COLOURS
    pv = videos([s for s, _ in examples_])
    ids, mask, labels = caption_batch(tok, prefix, [c for _, c in examples_])
    result = {}
    for name, video in (("own", pv), ("wrong", pv.roll(1, 0))):
        logits = model(input_ids=ids, attention_mask=mask, pixel_values_videos=video).logits[:, :-1]
        target = labels[:, 1:]
        keep = (target != -100) & content[target.clamp(min=0)]
        result[f"content_acc_{name}"] = round((logits.argmax(-1) == target)[keep].float().mean().item(), 3)
        result[f"content_nll_{name}"] = round(F.cross_entropy(logits[keep].float(), target[keep]).item(), 3)
        is_colour = (target != -100) & colour[target.clamp(min=0)]
        result[f"colour_acc_{name}"] = round((logits.argmax(-1) == target)[is_colour].float().mean().item(), 3)
    model.train()
    return result


# ---------------------------------------------------------------- training

def train(args) -> None:
    torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    start = time.time()
    deadline = start + args.max_minutes * 60
    model, tok, old_vocab = build_model(Path(args.lm_dir), args.seed)
    if args.init_from:  # continue from a saved captioner
        saved = LlavaNextVideoForConditionalGeneration.from_pretrained(args.init_from, dtype=torch.float32)
        model.load_state_dict(saved.state_dict())
        del saved
        if args.reinit_projector:
            for module in model.model.multi_modal_projector.modules():
                if isinstance(module, nn.Linear):
                    module.reset_parameters()
    model.train()
    weights = torch.ones(len(tok))
    for token, idx in tok.get_vocab().items():
        if token.lstrip("\u0120") in CONTENT_WORDS:
            weights[idx] = args.content_weight
    n_params = sum(p.numel() for p in model.parameters())
    print(f"captioner: {n_params / 1e6:.2f}M parameters, vocab {old_vocab} -> {len(tok)}, "
          f"{cd.VISUAL_TOKENS} visual tokens per video", flush=True)
    with torch.inference_mode():  # the caption LM's own greedy caption (no video): a chance-level reference
        model.eval()
        bos = torch.tensor([[tok.bos_token_id]])
        out = model.generate(input_ids=bos, attention_mask=torch.ones_like(bos), max_new_tokens=MAX_NEW_TOKENS,
                             do_sample=False)
        text_only_caption = tok.decode(out[0, 1:], skip_special_tokens=True).strip()
        model.train()
    print(f"text-only greedy caption of the LM: {text_only_caption!r}", flush=True)
    head = AuxHead(VISION["hidden_size"], cd.FRAMES, cd.AUX_DIM)
    stream = Stream(args.seed, max_shapes=args.max_shapes)
    heldout = [sample_example(example_seed("heldout", args.seed, i), args.max_shapes) for i in range(args.eval_n)]

    lm_params = list(model.model.language_model.parameters())
    for p in lm_params:
        p.requires_grad_(False)
    vision_params = list(model.model.vision_tower.parameters()) + list(head.parameters())
    proj_params = list(model.model.multi_modal_projector.parameters())

    # ---- stage A: vision tower + pooler with the per-token and per-video heads
    opt_a = adamw(vision_params, args.aux_lr, weight_decay=0.01)
    t_a = time.time()
    aux_total = args.aux_steps
    aux_deadline = t_a + args.aux_minutes * 60
    bar = tqdm(total=aux_total or None, desc="stage A (vision)", mininterval=10)
    step, timed = 0, []
    while not args.skip_stage_a and (not aux_total or step < aux_total):
        now = time.time()
        if now > deadline - 60 or (not aux_total and step > 3 and now > aux_deadline):
            print(f"stage-A time budget reached at step {step}", flush=True)
            break
        if not aux_total and len(timed) == 3:
            aux_total = step + max(1, int((aux_deadline - now) / float(np.median(timed))))
            bar.total = aux_total
            print(f"stage A: {np.median(timed):.2f}s per step -> {aux_total} steps", flush=True)
        t0 = time.time()
        batch = stream.take(args.aux_batch_size)
        for g in opt_a.param_groups:
            g["lr"] = args.aux_lr * lr_factor(step, aux_total or 10**9, 30)
        scenes = [s for s, _ in batch]
        loss = aux_loss(head, pooled_features(model, videos(scenes)), scenes, args.frame_weight)
        optimizer_step(opt_a, loss, vision_params)
        if step >= 1 and len(timed) < 3:
            timed.append(time.time() - t0)
        if step % 25 == 0 or step == aux_total - 1:
            bar.set_postfix(loss=f"{loss.item():.4f}")
            print(f"A step {step} aux_loss {loss.item():.4f} elapsed {time.time() - start:.0f}s", flush=True)
        bar.update(1)
        step += 1
    bar.close()
    aux_steps_done = step
    stage_a_s = time.time() - t_a
    aux_acc = aux_accuracy(model, head, heldout[:64]) if aux_steps_done else None
    print(f"stage A: {aux_steps_done} steps in {stage_a_s:.0f}s; held-out aux set accuracy {aux_acc}", flush=True)
    del opt_a

    # ---- stage A1: shape recognition on varied single frames of one-shape scenes
    frame_steps_done, frame_acc = 0, None
    if args.frame_steps:
        opt_f = adamw(vision_params, args.aux_lr, weight_decay=0.01)
        held_pixels, held_scenes, held_picks = frame_batch("heldout", args.seed, 0, 256)
        for step in tqdm(range(args.frame_steps), desc="stage A1 (frames)", mininterval=10):
            if time.time() > deadline - 60:
                print(f"stage-A1 time budget reached at step {step}", flush=True)
                break
            for g in opt_f.param_groups:
                g["lr"] = args.aux_lr * lr_factor(step, args.frame_steps, 30)
            pixels, scenes, picks = frame_batch("train", args.seed, step * args.frame_batch_size, args.frame_batch_size)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss, _ = frame_loss(model, head, pixels, scenes, picks)
            optimizer_step(opt_f, loss, vision_params)
            frame_steps_done = step + 1
            if step % 100 == 0 or step == args.frame_steps - 1:
                with torch.no_grad():
                    frame_acc = round(float(frame_loss(model, head, held_pixels, held_scenes, held_picks)[1]), 4)
                print(f"A1 step {step} loss {loss.item():.4f} held-out frame kind accuracy {frame_acc} "
                      f"elapsed {time.time() - start:.0f}s", flush=True)
        del opt_f

    # ---- stage B: captioning through the LM
    prefix = cd.prompt_ids(tok)
    probe_set = heldout[: args.probe_n]
    groups = [{"params": vision_params, "base": args.vision_lr},
              {"params": proj_params, "base": args.proj_lr},
              {"params": lm_params, "base": args.lm_lr}]
    opt = adamw([{"params": g["params"], "lr": 0.0} for g in groups], 0.0, weight_decay=0.0)
    total = args.steps
    timed: list[float] = []
    lm_start = None
    step_times: dict[str, list[float]] = {"frozen": [], "unfrozen": []}
    t_b = time.time()
    step = 0
    bar = tqdm(total=total or None, desc="stage B (captions)", mininterval=10)
    while True:
        if total and step >= total:
            break
        now = time.time()
        if now > deadline:
            print(f"deadline reached at stage B step {step}", flush=True)
            break
        if not total and len(timed) == 3:
            # Auto-size: fill the remaining budget with frozen + unfrozen steps.
            t = float(np.median(timed))
            remaining = deadline - now - 30
            per = t * ((1 - args.lm_frac) + args.lm_frac * LM_UNFROZEN_SLOWDOWN)
            total = step + max(1, int(remaining / per))
            bar.total = total
            print(f"stage B: {t:.2f}s per frozen-LM step -> {total} steps", flush=True)
        plan = total or 10**9
        if lm_start is None and args.lm_frac > 0 and (args.lm_frac >= 1 or total) and step >= int((total or 0) * (1 - args.lm_frac)):
            lm_start = step
            for p in lm_params:
                p.requires_grad_(True)
            print(f"unfreezing the LM at step {step}", flush=True)
        t0 = time.time()
        batch = stream.take(args.batch_size)
        pv = videos([s for s, _ in batch])
        ids, mask, labels = caption_batch(tok, prefix, [c for _, c in batch])
        captured = {}
        hook = model.model.vision_resampler.register_forward_hook(lambda m, i, o: captured.setdefault("pooled", o))
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                out = model(input_ids=ids, attention_mask=mask, pixel_values_videos=pv)
        finally:
            hook.remove()
        logits, target = out.logits[:, :-1].float(), labels[:, 1:]
        valid = target != -100
        tok_loss = F.cross_entropy(logits[valid], target[valid], reduction="none")
        out.loss = tok_loss.mean()  # the plain caption loss, for the log
        w = weights[target[valid]]
        loss = (tok_loss * w).sum() / w.sum()
        if args.aux_weight > 0:
            loss = loss + args.aux_weight * aux_loss(head, captured["pooled"], [s for s, _ in batch], args.frame_weight)
        f = lr_factor(step, plan, args.warmup)
        for g, spec in zip(opt.param_groups, groups):
            g["lr"] = spec["base"] * f
        if lm_start is not None:
            opt.param_groups[2]["lr"] = args.lm_lr * lr_factor(step - lm_start, plan - lm_start, 20)
        optimizer_step(opt, loss, [p for g in groups for p in g["params"] if p.requires_grad])
        dt = time.time() - t0
        step_times["unfrozen" if lm_start is not None else "frozen"].append(dt)
        if step >= 1 and len(timed) < 3:
            timed.append(dt)
        if step % 10 == 0 or (total and step == total - 1):
            bar.set_postfix(loss=f"{out.loss.item():.4f}")
            print(f"B step {step} caption_loss {out.loss.item():.4f} total_loss {loss.item():.4f} "
                  f"lr_f {f:.3f} step_s {dt:.2f} elapsed {time.time() - start:.0f}s", flush=True)
        if args.probe_every and step % args.probe_every == 0:
            print(f"B step {step} probe {json.dumps(reading_probe(model, tok, prefix, probe_set))}", flush=True)
        bar.update(1)
        step += 1
        if args.time_steps and step >= args.time_steps:
            break
    bar.close()
    steps_done = step
    train_wall = time.time() - start
    med = {k: (round(float(np.median(v)), 3) if v else None) for k, v in step_times.items()}
    print(f"stage B: {steps_done} steps in {time.time() - t_b:.0f}s; median step s {med}; "
          f"train wall {train_wall:.0f}s", flush=True)
    if args.time_steps:
        return

    # ---- ship fp16, evaluate what ships
    model.half()
    model.float()
    model.eval()
    t_e = time.time()
    quality, rows = evaluate(model, tok, heldout)
    base = cd.parse_caption(text_only_caption)
    golds = [cd.scene_attributes(s) for s, _ in heldout]
    quality["reference_text_only_caption"] = text_only_caption
    quality["reference_text_only_attribute_accuracy"] = round(
        sum(base[k] == g[k] for g in golds for k in ("colours", "kinds", "motions")) / (3 * len(golds)), 4)
    quality["eval_wall_time_s"] = round(time.time() - t_e, 1)
    print(json.dumps(quality, indent=1), flush=True)
    for r in rows[:8]:
        print(f"  truth: {r['truth']}\n  gen:   {r['generated']}", flush=True)
    info = {
        "n_params": n_params, "old_vocab": old_vocab, "train_wall": train_wall, "aux_steps": aux_steps_done,
        "frame_steps": frame_steps_done, "frame_kind_acc": frame_acc,
        "steps": steps_done, "lm_start": lm_start, "step_times": med, "stage_a_s": stage_a_s, "aux_acc": aux_acc,
        "data_size": stream.max_index,
    }
    save(model, tok, Path(args.out), args, info, quality, rows)


def rebuild_command(args, info: dict) -> str:
    """The command that repeats this run: every option that differs from its default, with the
    step counts actually done (a run continued with --init-from also needs the run it started from)."""
    defaults = vars(build_parser().parse_args([]))
    given = dict(vars(args), aux_steps=info["aux_steps"], frame_steps=info["frame_steps"], steps=info["steps"],
                 max_minutes=600.0)
    parts = ["python -m mmspec.vision.recipes.train_video_captioner"]
    for name, value in given.items():
        if name in ("out", "into_zoo", "lm_dir", "time_steps") or value == defaults.get(name):
            continue
        flag = "--" + name.replace("_", "-")
        parts.append(flag if value is True else f"{flag} {value}")
    return " ".join(parts)


def save_captioner_weights(model, tok, folder: Path) -> int:
    """Write the captioner (fp16, replacing any older shards) and its processor; returns the weights' bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    model.half().save_pretrained(folder, safe_serialization=True)
    cd.build_processor(tok).save_pretrained(folder)
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def target_card(folder: Path, task: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The zoo card of a captioner target: its name, task, architecture and role, then `fields`."""
    return {"name": folder.name, "task": task, "architecture": "LlavaNextVideoForConditionalGeneration",
            "role": "target", **fields}


def write_card_and_samples(folder: Path, card: dict[str, Any], samples: list[dict], size: int) -> None:
    """The zoo card and the first 20 held-out samples beside the saved weights (`size` bytes)."""
    (folder / "zoo_card.json").write_text(json.dumps(card, indent=2) + "\n")
    (folder / "heldout_samples.json").write_text(json.dumps(samples[:20], indent=1) + "\n")
    print(f"saved {folder} ({size / 1e6:.1f} MB of weights)", flush=True)


def save(model, tok, folder: Path, args, info: dict, quality: dict, rows: list[dict]) -> None:
    size = save_captioner_weights(model, tok, folder)
    card = target_card(folder, "video-captioning", {
        "pairs_with": DRAFTER_NAME,
        "params": info["n_params"],
        "file_size_bytes": size,
        "dtype": "float16",
        "visual_tokens_per_video": cd.VISUAL_TOKENS,
        "frames": cd.FRAMES,
        "frame_size": cd.FRAME_SIZE,
        "prompt": f"<video>{cd.PROMPT}",
        "inputs": ("AutoProcessor.from_pretrained(folder)(text='<video>describe the video.', videos=frames[T,H,W,3] "
                   "uint8, return_tensors='pt'); or mmspec.vision.recipes.captioner_data.build_captioner_inputs"),
        "vocab_size": len(tok),
        "base_vocab_size": info["old_vocab"],
        "vocab_note": (f"the caption LM's vocabulary ({info['old_vocab']}) + <video> (id {info['old_vocab']}) and "
                       f"<image> (id {info['old_vocab'] + 1}); all other ids unchanged, so {DRAFTER_NAME} "
                       f"(vocab {info['old_vocab']}) shares ids 0..{info['old_vocab'] - 1}"),
        "components": {
            "language_model": "shapes-caption-lm (LlamaForCausalLM, tied embeddings), 2 embedding rows added "
                              "(initialised to the mean row); fine-tuned with a small lr at the end" if info["lm_start"]
                              is not None else "shapes-caption-lm, frozen (only 2 embedding rows added)",
            "vision_tower": f"CLIPVisionModel from scratch: {VISION}",
            "pooler": "LLaVA-NeXT-Video average pooling, stride 2 (12x12 -> 6x6 per frame)",
            "projector": "Linear(128, 512) - GELU - Linear(512, 512)",
            "vision_feature_layer": -1,
            "vision_feature_select_strategy": "default (CLS dropped)",
        },
        "trained_on": (f"shapes-world train examples rendered on the fly (mmspec.world.sample_example("
                       f"example_seed('train', {args.seed}, i), max_shapes={args.max_shapes}), "
                       f"render_video(scene, {cd.FRAMES}, {cd.FRAME_SIZE})), "
                       f"i < {info['data_size']}; stage A: {info['aux_steps']} steps x {args.aux_batch_size} videos, "
                       "per-token colour/kind cross-entropy + per-video multi-label scene-content loss on throw-away heads "
                       "over the pooled vision tokens; "
                       f"stage A1: {info['frame_steps']} steps x {args.frame_batch_size} single frames of one-shape scenes, shape kind "
                       f"from the mean pooled token + per-token colour/kind; stage B: {info['steps']} steps x "
                       f"{args.batch_size} videos, caption cross-entropy (+{args.aux_weight} x stage-A loss), LM frozen"
                       + (f" until step {info['lm_start']}, then lr {args.lm_lr}" if info["lm_start"] is not None else "")),
        "seed": args.seed,
        "max_shapes": args.max_shapes,
        "data_size": info["data_size"],
        "aux_steps": info["aux_steps"],
        "frame_steps": info["frame_steps"],
        "frame_batch_size": args.frame_batch_size,
        "aux_batch_size": args.aux_batch_size,
        "steps": info["steps"],
        "batch_size": args.batch_size,
        "lm_unfrozen_from_step": info["lm_start"],
        "optimiser": (f"AdamW; stage A lr {args.aux_lr}; stage B lr vision {args.vision_lr}, projector "
                      f"{args.proj_lr}, LM {args.lm_lr}; warm-up then cosine to 10%"),
        "step_time_s": {"stage_b_frozen_lm": info["step_times"]["frozen"],
                        "stage_b_unfrozen_lm": info["step_times"]["unfrozen"],
                        "stage_a": round(info["stage_a_s"] / max(1, info["aux_steps"]), 3)},
        "train_wall_time_s": round(info["train_wall"], 1),
        "train_machine": f"2 CPU cores, torch.set_num_threads({args.threads})",
        "quality": {**quality, "stage_a_heldout_aux_set_accuracy": info["aux_acc"],
                    "stage_a1_heldout_frame_kind_accuracy": info["frame_kind_acc"],
                    "measured_on": f"{args.eval_n} held-out videos: sample_example(example_seed('heldout', "
                                   f"{args.seed}, i), max_shapes={args.max_shapes}), greedy, max {MAX_NEW_TOKENS} new tokens, fp16 weights "
                                   "upcast to fp32"},
        "rebuild_command": rebuild_command(args, info),
    })
    write_card_and_samples(folder, card, rows, size)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.out = str(parse_output_folder(parser, args, OUT_DIR))
    train(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lm-dir", default=str(LM_DIR),
                        help="the caption LM to start from (python -m mmspec.vision.recipes.train_caption_lm --which target)")
    add_output_arguments(parser, OUT_DIR.name, "the captioner")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-minutes", type=float, default=50.0,
                        help="wall-clock budget of training (evaluation and saving come after)")
    parser.add_argument("--aux-steps", type=int, default=0, help="stage-A steps; 0 = fit --aux-minutes")
    parser.add_argument("--aux-minutes", type=float, default=10.0)
    parser.add_argument("--aux-batch-size", type=int, default=32)
    parser.add_argument("--aux-lr", type=float, default=2e-3)
    parser.add_argument("--frame-steps", type=int, default=0,
                        help="stage A1: steps of shape recognition on single frames of one-shape scenes")
    parser.add_argument("--frame-batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=0, help="stage-B steps; 0 = fit the time budget")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--vision-lr", type=float, default=5e-4)
    parser.add_argument("--proj-lr", type=float, default=1e-3)
    parser.add_argument("--lm-lr", type=float, default=1e-4)
    parser.add_argument("--lm-frac", type=float, default=0.5, help="last share of stage B with the LM unfrozen")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--aux-weight", type=float, default=0.3)
    parser.add_argument("--eval-n", type=int, default=50)
    parser.add_argument("--max-shapes", type=int, default=3,
                        help="shapes per scene, 1..N (train and held-out videos alike)")
    parser.add_argument("--content-weight", type=float, default=1.0,
                        help="loss weight of caption words only the video can decide (colours, kinds, motions, ...)")
    parser.add_argument("--init-from", default=None, help="continue from a saved captioner folder")
    parser.add_argument("--frame-weight", type=float, default=0.0,
                        help="weight of the per-token whole-frame content loss in stage A (and B via --aux-weight)")
    parser.add_argument("--reinit-projector", action="store_true", help="fresh projector after --init-from")
    parser.add_argument("--skip-stage-a", action="store_true", help="no vision pre-training (with --init-from)")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast for stage-B forwards")
    parser.add_argument("--probe-every", type=int, default=0, help="run the reading probe every N stage-B steps")
    parser.add_argument("--probe-n", type=int, default=24, help="held-out videos in the reading probe")
    parser.add_argument("--time-steps", type=int, default=0, help="only time this many stage-B steps; save nothing")
    return parser


if __name__ == "__main__":
    main()
