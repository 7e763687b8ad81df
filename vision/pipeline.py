"""A diffusers-style caption pipeline over the vision targets and their drafters.

    pipe = CaptionPipeline.from_pretrained("shapes-video-captioner")      # or a Hub id / folder
    out = pipe(video="clip.mp4", prompt="describe the video .", max_new_tokens=48)
    out.text, out.method, out.stats.tau

Methods (all lossless, greedy output identical to the model's own `generate`):
  ar    plain autoregressive decoding through the same loop (the baseline)
  text  a small text-only LM drafts (Gagrani et al. 2024)
  std   Sparse-to-Dense self-speculation (Zhang et al., ACL 2025)
  msd   an MSD feature drafter (Lin et al. 2025), trained for this model
  flash a FLASH feature drafter (Wang et al. 2025): compressed visual tokens, several drafts per forward

MSD and FLASH drafters are loaded from the model's zoo folder (`<model>/msd/`, `<model>/flash/`)
when present, or passed explicitly:

    pipe = CaptionPipeline.from_pretrained("shapes-video-captioner", feature_drafters={"flash": "my/flash"})

`available_methods` lists only the methods whose drafter is loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoProcessor, PreTrainedModel

from ..decoding import SpeculativeDecoder
from ..drafters import Drafter, NoDrafter
from ..errors import MMSpecError
from ..policies import DraftLengthPolicy, FixedDraftLength
from ..sampling import SamplingConfig
from ..stats import SpecStats
from ..zoo import entries, folder_card, load_causal_lm, resolve
from .feature_drafter import FeatureDrafterModel
from .feature_methods import BUILD_COMMAND, FEATURE_KINDS, load_checked, runtime_drafter, zoo_drafter_folder
from .inputs import load_image, load_video
from .models import image_token_ids, inputs_on_model, load_vision_model, video_token_ids
from .sparse_to_dense import SparseToDenseDrafter
from .target import VisionTarget
from .text_drafter import TextOnlyDrafter

DEFAULT_CAPTIONER = "shapes-video-captioner"
METHODS = ("ar", "text", "std", *FEATURE_KINDS)  # ..., "msd", "flash"
# Draft length per method when neither the caller nor the model card sets one: StD's paper
# default gamma = 9; 5 for the trained drafters (the card's measured best replaces it).
DEFAULT_DRAFT_TOKENS = {"text": 5, "std": 9, "msd": 5, "flash": 5}


@dataclass
class CaptionOutput:
    """What a caption call produced, and how."""

    text: str
    method: str
    model: str
    stats: SpecStats
    sequences: torch.LongTensor


def zoo_card(name_or_path: str) -> dict[str, Any]:
    """The model's zoo card: a zoo entry's, or the `zoo_card.json` of a local folder (e.g. a toy model
    rebuilt outside the package), else empty."""
    for entry in entries():
        if entry.name == name_or_path or Path(resolve(name_or_path)) == entry.path:
            return entry.card
    return folder_card(resolve(name_or_path))


class CaptionPipeline:
    """Caption a video or an image with a vision-language model, speculatively.

    Args:
        model: a supported vision-language model (LLaVA, LLaVA-OneVision, LLaVA-NeXT-Video, Qwen2-VL).
        processor: its processor (turns frames and text into model inputs).
        drafter: a small text LM for the `text` method (None: the method is unavailable).
        model_name: shown in outputs.
        card: zoo card of the model, if it came from the zoo (prompt format, measured best method).
        feature_drafters: trained feature drafters by method, e.g. {"msd": MSDDrafterModel, "flash": "folder"};
            each is checked against the model (hidden size, vocabulary).
        num_draft_tokens: tokens drafted per round for every method (None: per method, see `draft_length`).
        model_folder: the model's local folder, named in the error when a method's drafter is missing.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        processor: Any,
        drafter: PreTrainedModel | None = None,
        model_name: str = "",
        card: dict[str, Any] | None = None,
        std_kv_budget: int = 1024,
        num_draft_tokens: int | None = None,
        feature_drafters: Mapping[str, FeatureDrafterModel | str | os.PathLike] | None = None,
        model_folder: str | os.PathLike | None = None,
    ) -> None:
        self.model = model.eval()
        self.processor = processor
        # The text drafter reads the committed tokens, which live on the model's device.
        self.drafter_model = drafter.to(model.device) if drafter is not None else None
        self.model_name = model_name or getattr(model.config, "_name_or_path", type(model).__name__)
        self.card = card or {}
        self.std_kv_budget = std_kv_budget
        if num_draft_tokens is not None and num_draft_tokens < 1:
            raise MMSpecError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        self.num_draft_tokens = num_draft_tokens
        self.target = VisionTarget(model)
        self.feature_drafters: dict[str, FeatureDrafterModel] = {
            kind: load_checked(kind, drafter_or_folder, model) for kind, drafter_or_folder in (feature_drafters or {}).items()
        }
        self.model_folder = model_folder

    @classmethod
    def from_pretrained(
        cls,
        model_id_or_path: str | os.PathLike = DEFAULT_CAPTIONER,
        drafter: str | os.PathLike | PreTrainedModel | None = None,
        feature_drafters: Mapping[str, str | os.PathLike | FeatureDrafterModel] | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        **kwargs: Any,
    ) -> "CaptionPipeline":
        """Load a model (zoo name, local folder or Hub id available offline) and, optionally, a drafter.

        With no `drafter`, a zoo model gets the text drafter it was paired with.
        `feature_drafters` maps a method ("msd", "flash") to a drafter folder (or model); a method not
        given is loaded from the model folder's `<method>/` subfolder when there is one.
        """
        name = str(model_id_or_path)
        path = resolve(name)
        card = zoo_card(name)
        model = load_vision_model(path, dtype=dtype, device=device)
        try:
            processor = AutoProcessor.from_pretrained(path)
        except Exception as error:  # noqa: BLE001 - any failure here means the folder lacks a processor
            raise MMSpecError(f"could not load the processor of {name!r}: {str(error).splitlines()[0]}") from None
        if drafter is None and card.get("pairs_with"):
            drafter = card["pairs_with"]
        if drafter is not None and not isinstance(drafter, PreTrainedModel):
            drafter = load_causal_lm(drafter, "drafter")[0].to(device=device, dtype=dtype)
        chosen = dict(feature_drafters or {})
        folder = path if Path(path).is_dir() else None
        for kind in FEATURE_KINDS:
            found = zoo_drafter_folder(folder, kind) if folder else None
            if kind not in chosen and found is not None:
                chosen[kind] = found
        return cls(model, processor, drafter=drafter, model_name=name, card=card, feature_drafters=chosen,
                   model_folder=folder, **kwargs)

    def to(self, device: str | torch.device) -> "CaptionPipeline":
        """Move the model and every drafter to `device` (as diffusers' `pipe.to("cuda")`)."""
        self.model.to(device)
        for module in (self.drafter_model, *self.feature_drafters.values()):
            if module is not None:
                module.to(device)
        return self

    @property
    def available_methods(self) -> list[str]:
        def loaded(method: str) -> bool:
            if method == "text":
                return self.drafter_model is not None
            return method not in FEATURE_KINDS or method in self.feature_drafters

        return [m for m in METHODS if loaded(m)]

    @property
    def default_method(self) -> str:
        """The fastest lossless method measured for this model (zoo card), else text if a drafter is loaded, else StD."""
        measured = self.card.get("fastest_lossless_method")
        if measured in self.available_methods:
            return measured
        return "text" if self.drafter_model is not None else "std"

    def draft_length(self, method: str) -> int:
        """Tokens drafted per round: the pipeline's `num_draft_tokens` if set, else the model card's
        measured best for the method (`draft_tokens`), else `DEFAULT_DRAFT_TOKENS`."""
        if self.num_draft_tokens is not None:
            return self.num_draft_tokens
        return int(self.card.get("draft_tokens", {}).get(method, DEFAULT_DRAFT_TOKENS.get(method, 5)))

    def make_drafter(self, method: str) -> Drafter:
        if method not in METHODS:
            raise MMSpecError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
        if method == "ar":
            return NoDrafter()
        if method == "std":
            return SparseToDenseDrafter(self.model, kv_budget=self.std_kv_budget)
        if method in FEATURE_KINDS:
            if method not in self.feature_drafters:
                raise MMSpecError(self._missing_drafter(method))
            return runtime_drafter(self.feature_drafters[method])
        if self.drafter_model is None:
            raise MMSpecError("the `text` method needs a drafter: pass drafter=... (a small LM with the model's tokenizer)")
        return TextOnlyDrafter(self.drafter_model, self.model)

    def _missing_drafter(self, method: str) -> str:
        name = FEATURE_KINDS[method][0]
        looked = f" (none in {Path(self.model_folder) / method})" if self.model_folder else ""
        return (f"the `{method}` method needs a trained {name} drafter for {self.model_name}{looked}: pass "
                f"feature_drafters={{{method!r}: FOLDER}} (CLI: --method {method} --drafter FOLDER), or train one "
                f"({BUILD_COMMAND} for the toy captioner; `mmspec train-drafter --kind {method}` for any model)")

    def prepare_inputs(
        self,
        video: str | os.PathLike | np.ndarray | None = None,
        image: Any = None,
        prompt: str | None = None,
        num_frames: int = 8,
        fps: float | None = None,
    ) -> dict[str, Any]:
        """Model inputs (input_ids, pixel tensors, ...) for one video or one image and a prompt, on the model's device."""
        if (video is None) == (image is None):
            raise MMSpecError("pass exactly one of video=... or image=...")
        if video is not None:
            if not video_token_ids(self.model):
                raise MMSpecError(f"{self.model_name} reads images, not videos: pass an image (or one frame of the video)")
            frames = video if isinstance(video, np.ndarray) else load_video(video, num_frames=num_frames, fps=fps)
            media, kind = {"videos": [frames]}, "video"
        else:
            if not image_token_ids(self.model):
                raise MMSpecError(f"{self.model_name} reads videos, not images")
            media, kind = {"images": [load_image(image)]}, "image"
        text = self._prompt_text(kind, prompt)
        try:
            inputs = self.processor(text=[text], return_tensors="pt", **media)
        except Exception as error:  # noqa: BLE001 - processors raise many types for bad media
            raise MMSpecError(f"the processor could not prepare this {kind}: {str(error).splitlines()[0]}") from None
        return inputs_on_model(self.model, inputs)

    def _prompt_text(self, kind: str, prompt: str | None) -> str:
        placeholder = getattr(self.processor, f"{kind}_token")
        template, default = self.card.get("prompt_template"), self.card.get("default_prompt")
        trained = self.card.get("prompt", "")
        if template is None and trained.startswith(placeholder):
            # The zoo captioner's card states its training prompt verbatim ("<video>describe the video.").
            template, default = "{media}{prompt}", default or trained[len(placeholder):]
        prompt = prompt if prompt is not None else (default or f"Describe this {kind}.")
        if template:
            return template.format(media=placeholder, prompt=prompt)
        if getattr(self.processor, "chat_template", None):
            content = [{"type": kind}, {"type": "text", "text": prompt}]
            return self.processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
        return f"{placeholder}\n{prompt}"

    @torch.inference_mode()
    def __call__(
        self,
        video: str | os.PathLike | np.ndarray | None = None,
        image: Any = None,
        prompt: str | None = None,
        *,
        max_new_tokens: int = 64,
        method: str | None = None,
        num_frames: int = 8,
        fps: float | None = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        policy: DraftLengthPolicy | None = None,
        progress_bar: bool = True,
    ) -> CaptionOutput:
        method = method or self.default_method
        drafter = self.make_drafter(method)
        inputs = self.prepare_inputs(video=video, image=image, prompt=prompt, num_frames=num_frames, fps=fps)
        input_ids = inputs.pop("input_ids")
        decoder = SpeculativeDecoder(self.target, drafter, policy=policy or FixedDraftLength(self.draft_length(method)),
                                     method=method)
        sampling = SamplingConfig(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p)
        with tqdm(total=max_new_tokens, desc=f"caption ({method})", disable=not progress_bar, leave=False) as bar:
            out = decoder.generate(input_ids, max_new_tokens=max_new_tokens, sampling=sampling, generator=generator,
                                   on_tokens=bar.update, **inputs)
        new_tokens = out.sequences[0, input_ids.shape[1]:]
        text = self.processor.tokenizer.decode(new_tokens, skip_special_tokens=True).strip()
        return CaptionOutput(text=text, method=method, model=self.model_name, stats=out.stats, sequences=out.sequences)
