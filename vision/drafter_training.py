"""Train a feature drafter (MSD, FLASH) on self-distillation traces of its target.

One generic loop for every `FeatureDrafterModel`: the drafter's own `training_loss` defines the
objective; this file owns the rest. AdamW, linear warmup then cosine decay, gradient-norm clip
0.5, the target's embedding and LM head borrowed and frozen, a tqdm bar with loss and token
accuracy, resumable checkpoints (model, optimiser, scheduler, step, RNG states), and at the end
`save_pretrained(out_dir)` plus `training.json`.

MSD's two-stage curriculum (Lin et al. 2025, arXiv 2505.14260): the first `text_fraction` of the
steps draw text-only traces only; then each sample is multimodal with a probability rising
linearly from 0.05 to 0.95.
"""

from __future__ import annotations

import importlib
import json
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from mmspec.errors import MMSpecError
from mmspec.training import Checkpoints, adamw, warmup_cosine

from .distill_data import MULTIMODAL, TEXT, DistillDataset, collate
from .feature_drafter import FeatureDrafterModel

# kind -> (module, class), imported on first use so a kind's module is only needed when trained.
DRAFTER_KINDS: dict[str, tuple[str, str]] = {
    "msd": ("mmspec.vision.msd", "MSDDrafterModel"),
    "flash": ("mmspec.vision.flash", "FlashDrafterModel"),
}
CURRICULA = ("two-stage", "none")
CHECKPOINT_FORMAT = "mmspec-drafter-checkpoint-v1"
KEEP_CHECKPOINTS = 2


def drafter_class(kind: str) -> type[FeatureDrafterModel]:
    """The `FeatureDrafterModel` subclass registered for `kind`."""
    if kind not in DRAFTER_KINDS:
        raise MMSpecError(f"unknown drafter kind {kind!r}; choose from {', '.join(sorted(DRAFTER_KINDS))}")
    module_name, class_name = DRAFTER_KINDS[kind]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        raise MMSpecError(f"the {kind!r} drafter is not available in this install ({module_name} is missing)") from None
    return getattr(module, class_name)


def multimodal_share(step: int, steps: int, text_fraction: float = 0.5, start: float = 0.05, end: float = 0.95) -> float:
    """MSD's curriculum: probability that a sample at `step` (0-based, of `steps`) is multimodal.

    0 during the text-only stage (the first `text_fraction` of the steps), then rising linearly
    from `start` to `end` over the remaining steps.
    """
    text_steps = int(round(text_fraction * steps))
    if step < text_steps:
        return 0.0
    rising = steps - text_steps
    if rising <= 1:
        return end
    return start + (end - start) * (step - text_steps) / (rising - 1)


class CurriculumSampler:
    """Draws the trace indices of each step's batch, from its own seeded generator."""

    def __init__(
        self, modalities: list[str], curriculum: str, steps: int, text_fraction: float, generator: torch.Generator
    ) -> None:
        self.curriculum, self.steps, self.text_fraction, self.generator = curriculum, steps, text_fraction, generator
        self.pools = {m: [i for i, tag in enumerate(modalities) if tag == m] for m in (TEXT, MULTIMODAL)}
        self.all = list(range(len(modalities)))
        if curriculum == "two-stage" and not (self.pools[TEXT] and self.pools[MULTIMODAL]):
            raise MMSpecError(
                f"the two-stage curriculum needs text-only and multimodal traces (found {len(self.pools[TEXT])} text, "
                f"{len(self.pools[MULTIMODAL])} multimodal); generate text traces too, or use curriculum 'none'"
            )

    def sample(self, step: int, batch_size: int) -> list[int]:
        if self.curriculum == "none":
            picks = torch.randint(len(self.all), (batch_size,), generator=self.generator)
            return [self.all[i] for i in picks.tolist()]
        share = multimodal_share(step, self.steps, self.text_fraction)
        multimodal = (torch.rand(batch_size, generator=self.generator) < share).tolist()
        out = []
        for is_multimodal in multimodal:
            pool = self.pools[MULTIMODAL if is_multimodal else TEXT]
            out.append(pool[int(torch.randint(len(pool), (1,), generator=self.generator))])
        return out


def frozen_copy(module: nn.Module) -> nn.Module:
    """An Embedding / Linear sharing `module`'s weights, detached: no gradient reaches the target."""
    if isinstance(module, nn.Embedding):
        copy = nn.Embedding(module.num_embeddings, module.embedding_dim, device="meta")
    elif isinstance(module, nn.Linear):
        copy = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
    else:
        raise MMSpecError(f"cannot borrow a {type(module).__name__} from the target (expected Embedding or Linear)")
    for name, param in module.named_parameters(recurse=False):
        setattr(copy, name, nn.Parameter(param.detach(), requires_grad=False))
    return copy


def train_drafter(
    target_model: PreTrainedModel | str | Path,
    kind: str,
    data_dir: str | Path,
    out_dir: str | Path,
    steps: int = 1000,
    batch_size: int = 4,
    lr: float = 1e-4,
    warmup: int | None = None,
    noise_std: float = 0.2,
    curriculum: str = "two-stage",
    checkpoint_every: int = 500,
    resume: bool = False,
    seed: int = 0,
    progress: bool = True,
    *,
    text_fraction: float = 0.5,
    weight_decay: float = 0.0,
    drafter_options: dict[str, Any] | None = None,
) -> FeatureDrafterModel:
    """Train a `kind` drafter ("msd", "flash") for `target_model` on `data_dir` traces; saves to `out_dir`.

    Args:
        target_model: the target (model, or folder / Hub id loaded with `load_vision_model`);
            only its input embedding and LM head are used, frozen.
        data_dir: a `generate_distill_data` folder.
        warmup: warmup steps (default 5% of `steps`).
        noise_std: standard deviation of the uniform noise on input features (EAGLE uses 0.2).
        curriculum: "two-stage" (MSD: text-only, then a rising multimodal share) or "none".
        checkpoint_every: save a resumable checkpoint to out_dir/checkpoints every N steps (0 = never).
        resume: continue from the latest checkpoint in out_dir/checkpoints, if there is one.
        text_fraction: share of the steps in the text-only stage of the two-stage curriculum.
        drafter_options: overrides for the drafter's config (`from_target_config(text_config, **options)`).

    Returns the trained drafter (also saved with `save_pretrained(out_dir)`).
    """
    cls = drafter_class(kind)
    if steps < 1 or batch_size < 1 or lr <= 0:
        raise MMSpecError(f"steps and batch size must be >= 1 and lr > 0 (got {steps}, {batch_size}, {lr})")
    if curriculum not in CURRICULA:
        raise MMSpecError(f"unknown curriculum {curriculum!r}; choose from {', '.join(CURRICULA)}")
    if not 0.0 <= text_fraction < 1.0:
        raise MMSpecError(f"text_fraction must be in [0, 1), got {text_fraction}")
    dataset = DistillDataset(data_dir)
    target = _load_target(target_model)
    text_config = target.config.get_text_config()
    if dataset.hidden_size != text_config.hidden_size:
        raise MMSpecError(f"the traces in {data_dir} have hidden size {dataset.hidden_size}, the target's language model "
                          f"{text_config.hidden_size}: they were made with another target")
    embed_tokens, lm_head = frozen_copy(target.get_input_embeddings()), frozen_copy(target.get_output_embeddings())
    device = lm_head.weight.device
    out = Path(out_dir)
    checkpoints = Checkpoints(out / "checkpoints", CHECKPOINT_FORMAT, kind, keep=KEEP_CHECKPOINTS)
    checkpoint = checkpoints.load() if resume else None

    torch.manual_seed(seed)
    if checkpoint is not None:
        model = cls(cls.config_class.from_dict(checkpoint["config"]))
        model.load_state_dict(checkpoint["model"])
    else:
        model = cls.from_target_config(text_config, **(drafter_options or {}))
    model.to(device).train()
    warmup = max(1, steps // 20) if warmup is None else warmup
    optimizer = adamw(model, lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, steps, warmup))
    sample_rng = torch.Generator().manual_seed(seed)
    noise_rng = torch.Generator(device=device).manual_seed(seed + 1)
    sampler = CurriculumSampler(dataset.modalities, curriculum, steps, text_fraction, sample_rng)
    start, history, wall_before = 0, [], 0.0
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        sample_rng.set_state(checkpoint["sample_rng"])
        noise_rng.set_state(checkpoint["noise_rng"])
        torch.set_rng_state(checkpoint["torch_rng"])
        start, history, wall_before = checkpoint["step"], checkpoint["history"], checkpoint["wall_time_s"]

    log_every = max(1, steps // 1000)
    recent: deque[tuple[float, float]] = deque(maxlen=20)
    began = time.perf_counter()

    def save_checkpoint(step: int) -> None:
        checkpoints.save(step, {
            "config": model.config.to_dict(), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "sample_rng": sample_rng.get_state(), "noise_rng": noise_rng.get_state(),
            "torch_rng": torch.get_rng_state(), "history": history, "wall_time_s": wall_before + time.perf_counter() - began,
        })

    bar = tqdm(total=steps, initial=start, desc=f"train {kind} drafter", unit="step", disable=not progress)
    for step in range(start, steps):
        batch = collate([dataset[i] for i in sampler.sample(step, batch_size)], device=device)
        metrics = model.training_loss(batch, embed_tokens, lm_head, noise_std=noise_std, generator=noise_rng)
        optimizer.zero_grad(set_to_none=True)
        metrics["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        scheduler.step()
        loss = float(metrics["loss"].detach())
        accuracy = float(metrics["token_accuracy"]) if "token_accuracy" in metrics else float("nan")
        recent.append((loss, accuracy))
        if step % log_every == 0 or step + 1 == steps:
            history.append({"step": step + 1, "loss": loss, "token_accuracy": accuracy, "lr": scheduler.get_last_lr()[0]})
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}", acc=f"{accuracy:.3f}")
        if checkpoint_every > 0 and ((step + 1) % checkpoint_every == 0 or step + 1 == steps):
            save_checkpoint(step + 1)
    bar.close()

    model.eval()
    model.save_pretrained(out)
    final = recent or deque((h["loss"], h["token_accuracy"]) for h in history[-20:])
    report = {
        "kind": kind,
        "steps": steps,
        "resumed_from_step": start if checkpoint is not None else None,
        "batch_size": batch_size, "lr": lr, "warmup": warmup, "noise_std": noise_std,
        "curriculum": curriculum, "text_fraction": text_fraction if curriculum == "two-stage" else None, "seed": seed,
        "wall_time_s": wall_before + time.perf_counter() - began,
        "final": {"loss": _mean(x[0] for x in final), "token_accuracy": _mean(x[1] for x in final)},
        "first_loss": history[0]["loss"] if history else None,
        "data": {"dir": str(data_dir), "num_traces": len(dataset), "modalities": dataset.metadata.get("modalities"),
                 "target": dataset.metadata.get("target")},
        "target": {"model_type": target.config.model_type, "hidden_size": text_config.hidden_size},
        "history": history,
    }
    (out / "training.json").write_text(json.dumps(report, indent=2))
    return model


def _load_target(target_model: PreTrainedModel | str | Path) -> PreTrainedModel:
    if isinstance(target_model, PreTrainedModel):
        return target_model
    from .models import load_vision_model

    return load_vision_model(target_model)


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None
