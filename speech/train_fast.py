"""Training a fast decoder (CTC or one-layer AR) on a folder of clips: `mmspec train-fast-decoder`.

Lim et al., "Hybrid Decoding: Rapid Pass and Selective Detailed Correction for Sequence Models"
(arXiv 2508.19671) train only the light fast decoder on the frozen, shared encoder. Here:

1. the clip folder is read (`read_clip_folder`: `metadata.jsonl`, one JSON object per line,
   `{"file": "clip_00001.wav", "text": "the transcript"}`, paths relative to the folder);
2. each clip is decoded with PyAV (`load_audio`), turned into log-mel features by the target's own
   feature extractor, and run through the frozen encoder ONCE; the encoder states stay in memory
   for every training step (the encoder never changes, so recomputing them would be waste);
3. labels are the target's own greedy transcripts (`labels="target"`: distillation, which is what
   maximises acceptance) or the metadata text (`labels="truth"`, tokenised with Whisper's leading space
   and no special tokens);
4. the fast decoder is trained alone (AdamW, cosine schedule, gradient clipping) and saved with
   `save_pretrained`: a `CTCFastDecoder` (CTC loss) or an `ARFastDecoder` (next-token
   cross-entropy, teacher-forced after the target's forced prompt, end-of-text included).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from ..cached_model import model_vocab_size
from ..errors import MMSpecError
from ..training import fit
from .ar_fast_decoder import ARFastDecoder
from .audio import load_audio
from .clip_folder import METADATA_FILE, Clip, read_clip_folder  # noqa: F401 - also read from here
from .fast_decoder import CTCFastDecoder, ctc_loss
from .features import DEFAULT_FEATURE_PADDING, log_mel_features
from .target import whisper_prompt_ids

KINDS = ("ctc", "ar")
LABELS = ("target", "truth")
DEFAULT_LEARNING_RATE = {"ctc": 1e-3, "ar": 5e-4}


@dataclass
class Example:
    """A clip ready for training: frozen encoder states, the forced prompt and the label tokens.

    `labels` holds target token ids WITHOUT the prompt and without end-of-text.
    """

    states: torch.Tensor  # [frames, d_model]
    prompt: list[int]
    labels: list[int]


@dataclass
class TrainReport:
    """What a training run did (also written as training.json next to the weights)."""

    kind: str
    labels: str
    target: str
    clips: int
    steps: int
    batch_size: int
    learning_rate: float
    seed: int
    first_loss: float
    final_loss: float
    seconds: float
    out: str
    init_from: str | None = None
    losses: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("losses")
        return data


# --- data -----------------------------------------------------------------------------------------

def clip_features(processor: Any, clip_path: Path, padding: str = DEFAULT_FEATURE_PADDING) -> torch.Tensor:
    """Log-mel features [1, mel bins, frames] of one clip that must fit the model's window, padded to it as
    `padding` says (`speech/features.py`)."""
    extractor = processor.feature_extractor
    rate = int(extractor.sampling_rate)
    audio = load_audio(clip_path, rate)
    window = int(extractor.n_samples)
    if audio.shape[0] > window:
        raise MMSpecError(f"clip {clip_path.name!r} lasts {audio.shape[0] / rate:.1f} s, longer than the model's "
                          f"{window / rate:.1f} s window: split it or leave it out")
    return torch.from_numpy(log_mel_features(extractor, audio, padding))


@torch.no_grad()
def prepare_examples(
    target_model: PreTrainedModel,
    processor: Any,
    clips: Sequence[Clip],
    labels: str = "target",
    *,
    label_batch_size: int = 16,
    progress_bar: bool = True,
) -> list[Example]:
    """Encoder states (computed once), forced prompts and labels for every clip."""
    if labels not in LABELS:
        raise MMSpecError(f"unknown labels {labels!r}; choose from {', '.join(LABELS)}")
    target_model.eval()
    encoder = target_model.get_encoder()
    examples: list[Example] = []
    for clip in tqdm(clips, desc="encode clips", unit="clip", disable=not progress_bar):
        # The shipped fast decoders were trained on audio-padded features; the recipe keeps reproducing them.
        features = clip_features(processor, clip.path, "audio").to(device=target_model.device, dtype=target_model.dtype)
        states = encoder(features, return_dict=True).last_hidden_state
        prompt = whisper_prompt_ids(target_model, {"encoder_outputs": BaseModelOutput(last_hidden_state=states)})
        ids = []
        if labels == "truth":
            # Whisper transcripts start with a space (" Hello"), as the model decodes them.
            ids = processor.tokenizer(" " + clip.text.strip(), add_special_tokens=False).input_ids
        examples.append(Example(states=states[0], prompt=prompt[0].tolist(), labels=list(ids)))
    if labels == "target":
        batches = range(0, len(examples), label_batch_size)
        for start in tqdm(batches, desc="label (target greedy)", unit="batch", disable=not progress_bar):
            greedy_labels(target_model, examples[start : start + label_batch_size])
    return examples


def greedy_labels(target_model: PreTrainedModel, examples: list[Example]) -> None:
    """Fill `labels` with the target's greedy transcripts (Whisper's own `generate`, batched, reusing the states)."""
    states = torch.stack([e.states for e in examples])
    # One position short of the decoder's limit: at exactly the limit transformers' Whisper
    # generate decodes the clip a second time when no end-of-text came.
    limit = max(1, target_model.config.max_target_positions - max(len(e.prompt) for e in examples) - 1)
    sequences = target_model.generate(
        encoder_outputs=BaseModelOutput(last_hidden_state=states), do_sample=False, max_new_tokens=limit,
        return_dict_in_generate=True,
    ).sequences
    stops = _eos_ids(target_model)
    for row, example in enumerate(examples):
        tokens = sequences[row, len(example.prompt):].tolist()
        cut = next((i for i, t in enumerate(tokens) if t in stops), len(tokens))
        example.labels = tokens[:cut]


def _eos_ids(model: PreTrainedModel) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


# --- training -------------------------------------------------------------------------------------

def _check_settings(steps: int, batch_size: int, learning_rate: float) -> None:
    if steps < 1:
        raise MMSpecError(f"steps must be >= 1, got {steps}")
    if batch_size < 1:
        raise MMSpecError(f"batch size must be >= 1, got {batch_size}")
    if not learning_rate > 0:
        raise MMSpecError(f"the learning rate must be > 0, got {learning_rate}")


def train_ar_fast_decoder(
    target_model: PreTrainedModel,
    examples: Sequence[Example],
    steps: int,
    fast_decoder: ARFastDecoder | None = None,
    *,
    batch_size: int = 16,
    learning_rate: float = DEFAULT_LEARNING_RATE["ar"],
    warmup_steps: int | None = None,
    seed: int = 0,
    init_layer: int = 0,
    share_embeddings: bool = False,
    draft_vocab_size: int | None = None,
    progress_bar: bool = True,
) -> tuple[ARFastDecoder, list[float]]:
    """Distil an `ARFastDecoder` on cached encoder states; returns (fast decoder, loss per step).

    Teacher forcing: input = prompt + labels + end-of-text; the loss covers the positions that
    predict the labels and the end-of-text (never the forced prompt). A fresh decoder may share
    the target's (frozen) embedding and head (`share_embeddings`) and draft over a reduced
    vocabulary of `draft_vocab_size` ids (`draft_vocabulary`); with a reduced vocabulary the loss
    is the cross-entropy over it, and label tokens outside it are left out of the loss.
    """
    if not examples:
        raise MMSpecError("the training set is empty")
    _check_settings(steps, batch_size, learning_rate)
    prompts = Counter(tuple(e.prompt) for e in examples)
    eos = min(_eos_ids(target_model))
    if fast_decoder is None:
        vocab = None if draft_vocab_size is None else draft_vocabulary(
            examples, draft_vocab_size, model_vocab_size(target_model), _eos_ids(target_model))
        fast_decoder = ARFastDecoder.for_target(target_model, init_layer=init_layer, prompt_ids=list(prompts.most_common(1)[0][0]),
                                                share_embeddings=share_embeddings, draft_vocab=vocab)
    head, vocab_ids = fast_decoder.draft_head()
    head = head.detach()  # the target's frozen head (or the decoder's own, copied): never trained here
    if vocab_ids is not None:
        reduced = torch.full((model_vocab_size(target_model),), -100, dtype=torch.long)
        reduced[vocab_ids.cpu()] = torch.arange(len(vocab_ids))
    pad = target_model.generation_config.pad_token_id
    pad = eos if pad is None else int(pad)

    def batch_loss(indices: list[int]) -> torch.Tensor:
        rows = [examples[i].prompt + examples[i].labels + [eos] for i in indices]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        targets = torch.full((len(rows), width), -100, dtype=torch.long)
        for r, (i, row) in enumerate(zip(indices, rows)):
            ids[r, : len(row)] = torch.tensor(row)
            start = len(examples[i].prompt)
            # logits at position j predict token j + 1; right padding never leaks back (causal).
            targets[r, start - 1 : len(row) - 1] = torch.tensor(row[start:])
        states = torch.stack([examples[i].states for i in indices]).to(device=fast_decoder.device, dtype=fast_decoder.dtype)
        if vocab_ids is None:
            logits = fast_decoder(input_ids=ids.to(fast_decoder.device), encoder_outputs=states).logits
        else:
            hidden = fast_decoder.model.decoder(input_ids=ids.to(fast_decoder.device), encoder_hidden_states=states).last_hidden_state
            logits = nn.functional.linear(hidden, head)
            targets = torch.where(targets >= 0, reduced[targets.clamp(min=0)], targets)
        return nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten().to(logits.device), ignore_index=-100)

    warmup = warmup_steps if warmup_steps is not None else min(100, steps // 10)
    losses = fit(fast_decoder, batch_loss, len(examples), steps, batch_size=batch_size, learning_rate=learning_rate,
                  warmup_steps=warmup, seed=seed, progress_bar=progress_bar, desc="train AR fast decoder")
    return fast_decoder, losses


def draft_vocabulary(examples: Sequence[Example], size: int, vocab_size: int, keep: set[int] | Sequence[int] = ()) -> list[int]:
    """A reduced drafting vocabulary (FR-Spec style): the `size` most frequent tokens of the labels.

    `keep` (end-of-text) always comes first. When the labels hold fewer distinct tokens than `size`,
    the rest is filled with the lowest remaining ids: in a byte-pair vocabulary (Whisper's is GPT-2's)
    ids follow merge order, so low ids are the frequent sub-words of general text.
    """
    if not 0 < size <= vocab_size:
        raise MMSpecError(f"the draft vocabulary size must be in 1..{vocab_size}, got {size}")
    counts = Counter(t for e in examples for t in e.labels)
    chosen = list(dict.fromkeys(int(t) for t in keep))
    taken = set(chosen)
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if token not in taken:
            chosen.append(token)
            taken.add(token)
    token = 0
    while len(chosen) < size and token < vocab_size:
        if token not in taken:
            chosen.append(token)
            taken.add(token)
        token += 1
    return chosen[:size]


def train_ctc_fast_decoder(
    target_model: PreTrainedModel,
    examples: Sequence[Example],
    steps: int,
    fast_decoder: CTCFastDecoder | None = None,
    *,
    batch_size: int = 16,
    learning_rate: float = DEFAULT_LEARNING_RATE["ctc"],
    warmup_steps: int | None = None,
    seed: int = 0,
    progress_bar: bool = True,
    draft_vocab_size: int | None = None,
    **config_kwargs: Any,
) -> tuple[CTCFastDecoder, list[float]]:
    """Train a `CTCFastDecoder` on cached encoder states; returns (fast decoder, loss per step).

    Without an explicit `upsample`, the smallest one giving CTC at least 2 frames per label token
    (room for blanks between repeats) on the longest label is used. `draft_vocab_size`: a fresh
    decoder predicts only that many ids (`draft_vocabulary`); label tokens outside them are left out.
    """
    if not examples:
        raise MMSpecError("the training set is empty")
    _check_settings(steps, batch_size, learning_rate)
    vocab = model_vocab_size(target_model)
    if any(not 0 <= t < vocab for e in examples for t in e.labels):
        raise MMSpecError(f"a label holds token ids outside the target's vocabulary (0..{vocab - 1})")
    if fast_decoder is None:
        frames = examples[0].states.shape[0]
        longest = max(len(e.labels) for e in examples)
        config_kwargs.setdefault("upsample", max(1, math.ceil((2 * longest + 1) / frames)))
        if draft_vocab_size is not None:
            config_kwargs["draft_vocab"] = draft_vocabulary(examples, draft_vocab_size, vocab, _eos_ids(target_model))
        fast_decoder = CTCFastDecoder.for_target(target_model, **config_kwargs)
    columns = [fast_decoder.label_columns(e.labels) for e in examples]

    def batch_loss(indices: list[int]) -> torch.Tensor:
        states = torch.stack([examples[i].states for i in indices]).to(fast_decoder.device, fast_decoder.dtype)
        width = max(1, max(len(columns[i]) for i in indices))
        labels = torch.full((len(indices), width), -100, dtype=torch.long)
        for r, i in enumerate(indices):
            if columns[i]:
                labels[r, : len(columns[i])] = torch.tensor(columns[i])
        logits = fast_decoder(states).logits
        return ctc_loss(logits, labels.to(logits.device), fast_decoder.blank_id)

    warmup = warmup_steps if warmup_steps is not None else min(100, steps // 10)
    losses = fit(fast_decoder, batch_loss, len(examples), steps, batch_size=batch_size, learning_rate=learning_rate,
                  warmup_steps=warmup, seed=seed, progress_bar=progress_bar, desc="train CTC fast decoder")
    return fast_decoder, losses


# --- the whole command ----------------------------------------------------------------------------

def check_output_folder(out: str | Path) -> Path:
    """Refuse to write over a full Whisper checkpoint (an easy slip: --out pointing at the model folder)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise MMSpecError(f"--out {str(path)!r} exists and is not a folder")
    config = path / "config.json"
    if config.is_file():
        try:
            data = json.loads(config.read_text())
        except (OSError, json.JSONDecodeError):
            data = {}
        if data.get("model_type") == "whisper" and data.get("is_encoder_decoder", True):
            raise MMSpecError(f"--out {str(path)!r} holds a Whisper model; write the fast decoder to a subfolder "
                              "(e.g. MODEL/fast_decoder or MODEL/ar_fast_decoder)")
    return path


def train_from_folder(
    target: str,
    data: str | Path,
    out: str | Path,
    *,
    kind: str = "ctc",
    labels: str = "target",
    steps: int = 1000,
    batch_size: int = 16,
    learning_rate: float | None = None,
    seed: int = 0,
    init_from: str | Path | None = None,
    progress_bar: bool = True,
) -> TrainReport:
    """Load the target (zoo name, folder or offline Hub id), train a fast decoder on `data`, save it to `out`.

    `init_from`: a saved fast decoder of the same kind to continue training (e.g. on more clips)
    instead of a fresh one initialised from the target.
    """
    from .ar_fast_decoder import attach_ar_fast_decoder
    from .models import speech_model_path
    from .pipeline import check_fast_decoder, load_fast_decoder, load_whisper

    if kind not in KINDS:
        raise MMSpecError(f"unknown fast decoder kind {kind!r}; choose from {', '.join(KINDS)}")
    if labels not in LABELS:
        raise MMSpecError(f"unknown labels {labels!r}; choose from {', '.join(LABELS)}")
    learning_rate = DEFAULT_LEARNING_RATE[kind] if learning_rate is None else learning_rate
    _check_settings(steps, batch_size, learning_rate)
    out_path = check_output_folder(out)
    clips = read_clip_folder(data)
    started = time.perf_counter()
    model, processor = load_whisper(target, speech_model_path(target))
    for p in model.parameters():
        p.requires_grad_(False)  # the big model is frozen: only the fast decoder trains
    # Per kind: the class a saved decoder must be, its fit-to-this-model check, its trainer.
    decoder_class, check_fit, trainer = {
        "ar": (ARFastDecoder, attach_ar_fast_decoder, train_ar_fast_decoder),
        "ctc": (CTCFastDecoder, check_fast_decoder, train_ctc_fast_decoder),
    }[kind]
    start: Any = None
    if init_from is not None:
        start = load_fast_decoder(init_from)
        if not isinstance(start, decoder_class):
            raise MMSpecError(f"--init-from {str(init_from)!r} holds a {type(start).__name__}, not the --kind {kind} fast decoder")
        check_fit(start, model)
        start.to(dtype=model.dtype, device=model.device)
    examples = prepare_examples(model, processor, clips, labels, progress_bar=progress_bar)
    fast, losses = trainer(model, examples, steps, start, batch_size=batch_size, learning_rate=learning_rate, seed=seed,
                           progress_bar=progress_bar)
    out_path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_path)
    tail = losses[-min(10, len(losses)):]
    report = TrainReport(
        kind=kind, labels=labels, target=target, clips=len(examples), steps=steps, batch_size=batch_size,
        learning_rate=learning_rate, seed=seed, first_loss=losses[0], final_loss=sum(tail) / len(tail),
        seconds=time.perf_counter() - started, out=str(out_path), init_from=None if init_from is None else str(init_from),
        losses=losses,
    )
    (out_path / "training.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return report
