"""Training a Whisper feature drafter (`feature_drafter.py`) on cached encoder states.

EAGLE's objective: at every slot j the drafter reads the target's feature f_j (with a little noise,
so it tolerates its own imperfect features when it drafts further) and token t_{j+1}, and learns to
predict f_{j+1} (smooth L1, on features scaled to unit RMS) and, through the target's frozen head
over the drafting vocabulary, token t_{j+2} (cross-entropy). The labels are the target's own greedy
transcripts and the features come from one teacher-forced pass of the target per batch of clips.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from ..cached_model import model_vocab_size
from ..errors import MMSpecError
from ..training import fit
from .feature_drafter import WhisperFeatureDrafterModel
from .train_fast import Example, _check_settings, _eos_ids, draft_vocabulary

DEFAULT_FEATURE_LEARNING_RATE = 5e-4


@dataclass
class FeatureExample:
    """A clip's encoder states [T, D], its whole decoder sequence (prompt + labels + end-of-text) and the
    target's final-normed features of that sequence [L, D]."""

    states: torch.Tensor
    sequence: torch.LongTensor
    features: torch.Tensor


@torch.no_grad()
def target_features(target_model: PreTrainedModel, examples: Sequence[Example], *, batch_size: int = 32,
                    progress_bar: bool = True) -> list[FeatureExample]:
    """One teacher-forced pass of the target over each example's prompt + labels + end-of-text."""
    eos = min(_eos_ids(target_model))
    out: list[FeatureExample] = []
    device, dtype = target_model.device, target_model.dtype
    for start in tqdm(range(0, len(examples), batch_size), desc="target features", unit="batch", disable=not progress_bar):
        chunk = examples[start : start + batch_size]
        rows = [e.prompt + e.labels + [eos] for e in chunk]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [eos] * (width - len(r)) for r in rows], device=device)
        states = torch.stack([e.states for e in chunk]).to(device=device, dtype=dtype)
        hidden = target_model(encoder_outputs=BaseModelOutput(last_hidden_state=states), decoder_input_ids=ids,
                              output_hidden_states=True).decoder_hidden_states[-1]
        out += [FeatureExample(e.states, torch.tensor(r), hidden[i, : len(r)].to(e.states.dtype).cpu())
                for i, (e, r) in enumerate(zip(chunk, rows))]
    return out


def train_feature_drafter(
    target_model: PreTrainedModel,
    examples: Sequence[Example],
    steps: int,
    drafter: WhisperFeatureDrafterModel | None = None,
    *,
    batch_size: int = 16,
    learning_rate: float = DEFAULT_FEATURE_LEARNING_RATE,
    warmup_steps: int | None = None,
    seed: int = 0,
    draft_vocab_size: int | None = None,
    draft_tokens: int = 6,
    feature_noise: float = 0.02,
    features: Sequence[FeatureExample] | None = None,
    progress_bar: bool = True,
) -> tuple[WhisperFeatureDrafterModel, list[float]]:
    """Train a feature drafter (fresh: from the target's last decoder layer); returns (drafter, loss per step).

    Loss per slot = smooth L1 of the predicted feature + cross-entropy of the token after next, over the
    drafting vocabulary (`draft_vocab_size` most frequent label tokens; None: all). `feature_noise` is
    the standard deviation of the Gaussian noise on input features, relative to their RMS. `features`:
    `target_features(target_model, examples)` computed beforehand (e.g. once for several runs).
    """
    if not examples:
        raise MMSpecError("the training set is empty")
    _check_settings(steps, batch_size, learning_rate)
    if drafter is None:
        vocab = None if draft_vocab_size is None else draft_vocabulary(
            examples, draft_vocab_size, model_vocab_size(target_model), _eos_ids(target_model))
        drafter = WhisperFeatureDrafterModel.for_target(target_model, draft_vocab=vocab, draft_tokens=draft_tokens)
    drafter.bind_target(target_model)
    # The cross-attention keys/values of the encoder states stay the target layer's: the states are fixed
    # inputs, and freezing them saves a third of each step.
    cross = drafter.layers[0].encoder_attn
    for parameter in (cross.k_proj.weight, cross.v_proj.weight, cross.v_proj.bias):
        parameter.requires_grad_(False)
    data = list(features) if features is not None else target_features(target_model, examples, progress_bar=progress_bar)
    if len(data) != len(examples):
        raise MMSpecError(f"{len(data)} feature examples for {len(examples)} examples")
    ids = drafter.bound[2].cpu()
    column = torch.full((model_vocab_size(target_model),), -100, dtype=torch.long)
    column[ids] = torch.arange(len(ids))
    scale = torch.cat([d.features.float() for d in data[:256]]).pow(2).mean().sqrt()  # feature RMS
    eos = min(_eos_ids(target_model))
    device, dtype = drafter.fc.weight.device, drafter.fc.weight.dtype

    def batch_loss(indices: list[int]) -> torch.Tensor:
        chosen = [data[i] for i in indices]
        width = max(len(d.sequence) for d in chosen) - 1  # slots: positions 0 .. L-2
        features = torch.zeros(len(chosen), width, drafter.config.d_model)
        goals = torch.zeros_like(features)
        tokens = torch.full((len(chosen), width), eos, dtype=torch.long)
        targets = torch.full((len(chosen), width), -100, dtype=torch.long)
        mask = torch.zeros(len(chosen), width)
        for r, d in enumerate(chosen):
            n = len(d.sequence) - 1
            features[r, :n], goals[r, :n] = d.features[:n].float(), d.features[1:].float()
            tokens[r, :n], mask[r, :n] = d.sequence[1:], 1.0
            targets[r, : n - 1] = column[d.sequence[2:]]
        features = features + torch.randn_like(features) * feature_noise * scale
        states = torch.stack([d.states for d in chosen]).to(device=device, dtype=dtype)
        predicted = drafter(features.to(device, dtype), tokens.to(device), states).float()
        logits = drafter.draft_logits(predicted.to(dtype)).float()
        token_loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten().to(device), ignore_index=-100)
        mask = mask.to(device)
        feature_loss = nn.functional.smooth_l1_loss(predicted / scale, goals.to(device) / scale, reduction="none").mean(-1)
        return token_loss + (feature_loss * mask).sum() / mask.sum()

    warmup = warmup_steps if warmup_steps is not None else min(100, steps // 10)
    losses = fit(drafter, batch_loss, len(data), steps, batch_size=batch_size, learning_rate=learning_rate,
                 warmup_steps=warmup, seed=seed, progress_bar=progress_bar, desc="train feature drafter")
    return drafter.eval(), losses
