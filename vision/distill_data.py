"""Self-distillation data for feature drafters (MSD, FLASH): the target's own greedy traces.

For each (visual input, prompt) example the target decodes greedily, and every position's
input embedding (hidden_states[0], visual features merged in) and last hidden state
(hidden_states[-1], the "feature") is kept, so a drafter learns to predict exactly what this
target computes (EAGLE, Li et al. 2024; MSD, Lin et al. 2025, arXiv 2505.14260). Text-only
traces (the same prompt with its visual tokens removed and no pixels) feed MSD's first
curriculum stage.

The trace is produced by the prefill + one-token extensions mmspec's `Target` performs, which
is the target's greedy `generate` computation; each generated token is fed once more so its
feature is recorded too.

On disk: `out_dir/metadata.json` and `out_dir/shard-00000.pt`, ... Each shard is a `torch.save`d
list of traces: {"input_ids" [L] long, "embeds" [L, H] fp16, "features" [L, H] fp16,
"visual_mask" [L] bool, "prompt_length" int, "modality" "multimodal" | "text"}, plus on a Qwen2-VL
target with visual inputs "position_ids" [3, L] long (the target's M-RoPE positions of the trace).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from mmspec.decoding import eos_ids
from mmspec.errors import MMSpecError, first_line
from mmspec.paths import inside
from mmspec.targets import as_target

from .feature_drafter import DistillBatch
from .models import feature_token_ids, inputs_on_model, visual_token_ids
from .rope_positions import positions_at, target_prompt_positions

DISTILL_FORMAT = "mmspec-distill-v1"
MULTIMODAL, TEXT = "multimodal", "text"


def _ids(model: PreTrainedModel, getter, device: torch.device) -> torch.Tensor:
    try:
        return torch.tensor(sorted(getter(model)), dtype=torch.long, device=device)
    except MMSpecError:  # a text-only target has no visual tokens
        return torch.empty(0, dtype=torch.long, device=device)


def text_only_inputs(model: PreTrainedModel, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The example's prompt without any visual input: placeholder and vision marker tokens removed, no pixels."""
    input_ids = inputs["input_ids"]
    keep = ~torch.isin(input_ids[0], _ids(model, visual_token_ids, input_ids.device))
    return {"input_ids": input_ids[:, keep]}


@torch.inference_mode()
def trace_target(
    model: PreTrainedModel, inputs: Mapping[str, Any], max_new_tokens: int, eos_token_id: int | Iterable[int] | None = None
) -> dict[str, Any]:
    """One greedy trace of `model` on `inputs` (a model_inputs dict with `input_ids` [1, L]).

    Returns the trace dict described in the module docstring (modality from the presence of
    visual tokens in the prompt).
    """
    model_inputs = inputs_on_model(model, inputs)  # the examples may come from a processor, on the CPU
    input_ids = model_inputs.pop("input_ids", None)
    if input_ids is None or input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise MMSpecError("each distillation example needs input_ids of shape [1, L] (one prompt, batch size 1)")
    mask = model_inputs.pop("attention_mask", None)
    if mask is not None and not bool(mask.bool().all()):
        raise MMSpecError("distillation examples must be unpadded (batch size 1)")
    stops = eos_ids(model, eos_token_id)
    target = as_target(model)
    target.output_hidden_states = True
    sequence = target.initial_sequence(input_ids, model_inputs)
    rope_table = target_prompt_positions(model, sequence, model_inputs)  # the target's M-RoPE positions, if any
    step = target.start(sequence, **model_inputs)
    embeds, features = [step.hidden_states[0][0]], [step.hidden_states[-1][0]]
    generated = []
    for _ in range(max_new_tokens):
        token = step.logits[:, -1].argmax(-1)
        generated.append(token)
        # Fed once more even when it is the last one: its feature is part of the trace.
        fed = token[:, None]
        step = target.verify(fed, fed[:, :0])
        embeds.append(step.hidden_states[0][0])
        features.append(step.hidden_states[-1][0])
        if int(token[0]) in stops:
            break
    target.cache = None  # free the KV cache
    ids = torch.cat([sequence[0], torch.cat(generated)]).cpu()
    visual = torch.isin(ids, _ids(model, feature_token_ids, ids.device))
    visual[input_ids.shape[1]:] = False  # generated placeholder ids are plain tokens, as in generate
    trace = {
        "input_ids": ids,
        "embeds": torch.cat(embeds).to("cpu", torch.float16),
        "features": torch.cat(features).to("cpu", torch.float16),
        "visual_mask": visual,
        "prompt_length": int(input_ids.shape[1]),
        "modality": MULTIMODAL if bool(visual.any()) else TEXT,
    }
    if rope_table is not None:  # the positions decoding gives these tokens (MSD/FLASH drafters use them)
        indices = torch.arange(ids.shape[0], device=sequence.device)[None]
        trace["position_ids"] = positions_at(indices, rope_table)[:, 0].cpu()
    return trace


def generate_distill_data(
    model: PreTrainedModel,
    examples: Iterable[Mapping[str, Any]],
    out_dir: str | Path,
    max_new_tokens: int = 64,
    *,
    text_traces: bool = True,
    shard_size: int = 64,
    eos_token_id: int | Iterable[int] | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Write the target's greedy traces on `examples` to `out_dir`; returns the metadata written.

    Args:
        model: the target (any of the supported VLM classes; a text LM works for text traces).
        examples: model_inputs dicts, one prompt each: `input_ids` [1, L] with expanded visual
            placeholders, plus what the model needs (`pixel_values`, `pixel_values_videos`,
            `image_grid_thw`, ...), e.g. a processor's output.
        text_traces: also trace each multimodal prompt with its visual input removed (MSD's
            curriculum starts with text-only traces).
        shard_size: traces per shard file.
        overwrite: replace an existing dataset in `out_dir` (otherwise refuse).
    """
    if max_new_tokens < 1:
        raise MMSpecError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise MMSpecError(f"{out} is not empty; pass overwrite=True to replace it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    total = len(examples) if hasattr(examples, "__len__") else None
    shards: list[dict[str, Any]] = []
    buffer: list[dict[str, Any]] = []
    counts = {MULTIMODAL: 0, TEXT: 0}

    def flush() -> None:
        if buffer:
            name = f"shard-{len(shards):05d}.pt"
            torch.save(list(buffer), out / name)
            shards.append({"file": name, "num_traces": len(buffer)})
            buffer.clear()

    for example in tqdm(examples, total=total, desc="distill traces", unit="example", disable=not progress):
        trace = trace_target(model, example, max_new_tokens, eos_token_id)
        todo = [trace]
        if text_traces and trace["modality"] == MULTIMODAL:
            text_inputs = text_only_inputs(model, example)
            if text_inputs["input_ids"].shape[1] > 0:
                todo.append(trace_target(model, text_inputs, max_new_tokens, eos_token_id))
        for item in todo:
            counts[item["modality"]] += 1
            buffer.append(item)
            if len(buffer) >= shard_size:
                flush()
    flush()
    if not shards:
        raise MMSpecError("no distillation examples were given")
    text_config = model.config.get_text_config()
    metadata = {
        "format": DISTILL_FORMAT,
        "num_traces": sum(s["num_traces"] for s in shards),
        "modalities": counts,
        "hidden_size": int(text_config.hidden_size),
        "vocab_size": int(text_config.vocab_size),
        "model_type": model.config.model_type,
        "target": str(getattr(model, "name_or_path", "") or ""),
        "max_new_tokens": max_new_tokens,
        "shards": shards,
    }
    (out / "metadata.json").write_text(json.dumps(metadata, indent=2))
    return metadata


def load_shard(path: Path) -> list[dict[str, Any]]:
    """A shard's traces, memory-mapped; a file that is not a tensor archive (a pickle would run code) is refused."""
    try:
        traces = torch.load(path, mmap=True, weights_only=True)
    except Exception as error:  # noqa: BLE001 - pickle refused by weights_only, not a zip archive, truncated
        raise MMSpecError(f"cannot read distillation shard {str(path)!r}: not a tensor archive torch.save wrote "
                          f"({first_line(error)})") from None
    if not isinstance(traces, list) or not all(isinstance(t, dict) for t in traces):
        raise MMSpecError(f"distillation shard {str(path)!r} holds no list of traces")
    return traces


class DistillDataset(Dataset):
    """The traces of a `generate_distill_data` folder; shards are memory-mapped, not read into memory.

    `modalities[i]` is trace i's tag; `indices(modality)` lists the traces of one modality.
    """

    def __init__(self, data_dir: str | Path) -> None:
        folder = Path(data_dir)
        if not folder.is_dir():
            raise MMSpecError(f"distillation data folder not found: {folder}")
        meta_path = folder / "metadata.json"
        if not meta_path.is_file():
            raise MMSpecError(f"{folder} has no metadata.json; make it with generate_distill_data")
        try:
            self.metadata = json.loads(meta_path.read_text())
        except json.JSONDecodeError as err:
            raise MMSpecError(f"{meta_path} is not valid JSON: {err}") from None
        if not isinstance(self.metadata, dict) or self.metadata.get("format") != DISTILL_FORMAT:
            found = self.metadata.get("format") if isinstance(self.metadata, dict) else type(self.metadata).__name__
            raise MMSpecError(f"{folder} is not mmspec distillation data (format {found!r})")
        self.traces: list[dict[str, Any]] = []
        shards = self.metadata.get("shards", [])
        if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
            raise MMSpecError(f"{meta_path}: \"shards\" must be a list of {{\"file\": ..., \"num_traces\": ...}} objects")
        for shard in shards:
            path = inside(folder, shard.get("file"), f"{meta_path}: shard")
            if not path.is_file():
                raise MMSpecError(f"distillation shard missing: {path}")
            self.traces.extend(load_shard(path))
        if not self.traces:
            raise MMSpecError(f"{folder} holds no traces")
        self.modalities = [t["modality"] for t in self.traces]
        self.hidden_size = int(self.traces[0]["features"].shape[-1])

    def __len__(self) -> int:
        return len(self.traces)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.traces[index]

    def indices(self, modality: str) -> list[int]:
        return [i for i, m in enumerate(self.modalities) if m == modality]


def trace_loss_mask(length: int, prompt_length: int) -> torch.Tensor:
    """[length] bool: slots t whose target feature t + 1 runs from the last prompt position to the end."""
    mask = torch.zeros(length, dtype=torch.bool)
    mask[max(prompt_length - 2, 0) : length - 1] = True
    return mask


def collate(
    samples: list[Mapping[str, Any]], dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> DistillBatch:
    """Right-pad traces into a `DistillBatch` (embeds and features cast to `dtype`)."""
    if not samples:
        raise MMSpecError("cannot collate an empty list of traces")
    batch, length = len(samples), max(int(s["input_ids"].shape[0]) for s in samples)
    hidden = int(samples[0]["features"].shape[-1])
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    embeds = torch.zeros(batch, length, hidden, dtype=dtype)
    features = torch.zeros(batch, length, hidden, dtype=dtype)
    visual = torch.zeros(batch, length, dtype=torch.bool)
    attention = torch.zeros(batch, length, dtype=torch.long)
    loss_mask = torch.zeros(batch, length, dtype=torch.bool)
    with_positions = any("position_ids" in s for s in samples)
    # Traces without M-RoPE positions (and padding) take sequence indices on all three axes.
    positions = torch.arange(length).expand(3, batch, length).clone() if with_positions else None
    for b, s in enumerate(samples):
        n = int(s["input_ids"].shape[0])
        input_ids[b, :n] = s["input_ids"]
        embeds[b, :n] = s["embeds"].to(dtype)
        features[b, :n] = s["features"].to(dtype)
        visual[b, :n] = s["visual_mask"]
        attention[b, :n] = 1
        loss_mask[b, :n] = trace_loss_mask(n, int(s["prompt_length"]))
        if positions is not None and "position_ids" in s:
            positions[:, b, :n] = s["position_ids"]
    return DistillBatch(
        input_ids=input_ids.to(device), embeds=embeds.to(device), features=features.to(device),
        visual_mask=visual.to(device), attention_mask=attention.to(device), loss_mask=loss_mask.to(device),
        position_ids=None if positions is None else positions.to(device),
    )
