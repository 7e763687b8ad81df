"""A diffusers-style caption pipeline over the vision targets and their drafters.

    pipe = CaptionPipeline.from_pretrained("shapes-video-captioner")      # or a Hub id / folder / saved pipeline
    out = pipe(video="clip.mp4", prompt="describe the video .", max_new_tokens=48)
    out.text, out.method, out.stats.tau                                  # also out["text"], out[0]
    pipe.save_pretrained("my-captioner")                                 # model_index.json + components

A `SpeculativePipeline` (mmspec.pipelines, on diffusers' `DiffusionPipeline`): the model, its
processor and the text drafter are components; MSD / FLASH drafters are extra modules saved in
`<folder>/msd/`, `<folder>/flash/` (where the loader looks for them in any model folder).

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
from typing import Any, Mapping, Union

import torch
from transformers import AutoProcessor, PreTrainedModel

from ..decoding import SpeculativeDecoder
from ..devices import as_device, load_options, place_drafter
from ..drafters import NoDrafter
from ..errors import MMSpecError, first_line
from ..optional import ensure
from ..pipeline_batches import batching_refusal, check_batch_size, check_batching, groups, left_padding, per_item
from ..pipelines import (
    DrafterFactory,
    RoundCallback,
    SpeculativePipeline,
    TextPipelineOutput,
    resolve_dtype,
    saved_pipeline_folder,
)
from ..policies import DraftLengthPolicy, FixedDraftLength
from ..sampling import SamplingConfig
from ..trees import TreeConfig
from ..zoo import entries, folder_card, load_causal_lm, resolve
from .feature_drafter import FeatureDrafterModel
from .feature_methods import BUILD_COMMAND, FEATURE_KINDS, load_checked, runtime_drafter, zoo_drafter_folder
from .inputs import ImageSource, VideoSource, load_frames, load_image
from .models import image_token_ids, inputs_on_model, load_vision_model, video_token_ids
from .sparse_to_dense import SparseToDenseDrafter
from .target import VisionTarget
from .text_drafter import TextOnlyDrafter

DEFAULT_CAPTIONER = "shapes-video-captioner"
TEXT_DRAFTER_FOLDER = "text"  # a model folder's own text-only drafter, beside its msd/ and flash/ ones
METHODS = ("ar", "text", "std", *FEATURE_KINDS)  # ..., "msd", "flash"
# Draft length per method when neither the caller nor the model card sets one: StD's paper
# default gamma = 9; 5 for the trained drafters (the card's measured best replaces it).
DEFAULT_DRAFT_TOKENS = {"text": 5, "std": 9, "msd": 5, "flash": 5}


@dataclass
class CaptionOutput(TextPipelineOutput):
    """What a caption call produced, and how: `text`, `method`, `model`, `stats`, `sequences`
    (prompt + new token ids, as `generate` returns them), and `notes` (settings the call had to change,
    e.g. a `max_new_tokens` cut to the model's context)."""

    sequences: torch.LongTensor
    notes: list[str] | None = None


def zoo_card(name_or_path: str) -> dict[str, Any]:
    """The model's zoo card: a zoo entry's, or the `zoo_card.json` of a local folder (e.g. a toy model
    rebuilt outside the package), else empty."""
    for entry in entries():
        if entry.name == name_or_path or Path(resolve(name_or_path)) == entry.path:
            return entry.card
    own = folder_card(name_or_path) if Path(name_or_path).expanduser().is_dir() else {}
    return own or folder_card(resolve(name_or_path))  # a derived model's card sits in its own folder


def feature_drafter_folders(folder: str | os.PathLike | None,
                            given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The feature drafters to load: those `given`, plus each kind found in `folder/<kind>/`."""
    chosen = dict(given or {})
    for kind in FEATURE_KINDS:
        found = zoo_drafter_folder(folder, kind) if folder else None
        if kind not in chosen and found is not None:
            chosen[kind] = found
    return chosen


class CaptionPipeline(SpeculativePipeline):
    """Caption a video or an image with a vision-language model, speculatively.

    Args:
        model: a supported vision-language model (LLaVA, LLaVA-OneVision, LLaVA-NeXT-Video, Qwen2-VL).
        processor: its processor (turns frames and text into model inputs).
        drafter: a small text LM for the `text` method (None: the method is unavailable).
        model_name: shown in outputs.
        card: zoo card of the model, if it came from the zoo (prompt format, measured best method).
        std_kv_budget: Sparse-to-Dense's visual KV entries kept per layer and KV-head group.
        num_draft_tokens: tokens drafted per round for every method (None: per method, see `draft_length`).
        feature_drafters: trained feature drafters by method, e.g. {"msd": MSDDrafterModel, "flash": "folder"};
            each is checked against the model (hidden size, vocabulary).
        model_folder: the model's local folder, named in the error when a method's drafter is missing.
        drafter_dtype: the dtype the drafters (text and feature) run in; default the model's. A drafter
            only proposes, so its precision moves acceptance, never the output: on a CPU with bfloat16
            matrix units (AVX512-BF16, AMX) `torch.bfloat16` makes drafting faster (BENCHMARKS.md).

    Components (saved by `save_pretrained`): `model`, `processor`, `drafter`; settings in
    `model_index.json`: `card`, `std_kv_budget`, `num_draft_tokens`.
    """

    _optional_components = ["drafter"]
    # Without a measured fastest method on the card: trained feature drafters first (FLASH > MSD > text-only in every
    # caption bench here), Sparse-to-Dense last (it pays only on long visual contexts).
    preferred_methods = ("flash", "msd", "text", "std")
    default_draft_tokens = DEFAULT_DRAFT_TOKENS

    def __init__(
        self,
        model: PreTrainedModel,
        processor: Any,
        drafter: PreTrainedModel | None = None,
        model_name: str = "",
        card: dict[str, Any] | None = None,
        std_kv_budget: int = 1024,
        num_draft_tokens: int | None = None,
        # typing.Union inside the dict: diffusers' loader checks the values against it (it cannot read `|` there)
        feature_drafters: dict[str, Union[FeatureDrafterModel, str, os.PathLike]] | None = None,  # noqa: UP007
        model_folder: str | os.PathLike | None = None,
        drafter_device: str | torch.device | None = None,
        drafter_dtype: torch.dtype | str | None = None,
    ) -> None:
        super().__init__()
        self.check_draft_tokens(num_draft_tokens)
        drafter_dtype = resolve_dtype(drafter_dtype) if drafter_dtype is not None else None
        if drafter is not None and drafter_dtype is not None:
            drafter = drafter.to(dtype=drafter_dtype)
        # The text drafter reads the committed tokens, which live on the model's input device; on a device of
        # its own (`drafter_device`) accelerate's hook carries them there and its logits back.
        self.register_modules(model=model.eval(), processor=processor,
                              drafter=place_drafter(drafter, drafter_device, model) if drafter is not None else None)
        self.card = dict(card or {})
        self.std_kv_budget = std_kv_budget
        self.num_draft_tokens = num_draft_tokens
        self.register_to_config(card=self.card, std_kv_budget=std_kv_budget, num_draft_tokens=num_draft_tokens)
        self.model_name = model_name or model.config.name_or_path or type(model).__name__
        self.target = VisionTarget(model)
        self.feature_drafters: dict[str, FeatureDrafterModel] = {
            kind: load_checked(kind, drafter_or_folder, model, dtype=drafter_dtype, device=drafter_device)
            for kind, drafter_or_folder in (feature_drafters or {}).items()
        }
        self.drafter_device = drafter_device  # where the feature drafters run too (None: next to the target's head)
        self.model_folder = model_folder

    @classmethod
    def from_pretrained(
        cls,
        model_id_or_path: str | os.PathLike = DEFAULT_CAPTIONER,
        drafter: str | os.PathLike | PreTrainedModel | None = None,
        feature_drafters: Mapping[str, str | os.PathLike | FeatureDrafterModel] | None = None,
        dtype: torch.dtype | str | None = None,
        device: str | torch.device | None = None,
        *,
        torch_dtype: torch.dtype | str | None = None,
        device_map: str | dict[str, Any] | None = None,
        max_memory: dict[Any, Any] | None = None,
        offload_folder: str | os.PathLike | None = None,
        drafter_device: str | torch.device | None = None,
        **kwargs: Any,
    ) -> "CaptionPipeline":
        """Load a model (zoo name, local folder, saved pipeline or Hub id available offline) and, optionally, a drafter.

        With no `drafter`, a model folder's `text/` subfolder is its text drafter; failing that, a zoo model
        gets the text drafter its card pairs it with (a saved pipeline: the one it was saved with).
        `feature_drafters` maps a method ("msd", "flash") to a drafter folder
        (or model); a method not given is loaded from the folder's `<method>/` subfolder when there is
        one. `dtype` (or `torch_dtype`, the same) defaults to float32. Other keyword arguments go to
        the constructor (`num_draft_tokens`, `std_kv_budget`, ...).

        Placement: `device` (default CPU) holds the whole pipeline. A model bigger than one device is
        spread by accelerate instead: `device_map` ("auto" or {module name: device}), `max_memory`
        ({"cpu": "20GiB", 0: "10GiB"}; alone it means device_map="auto") and `offload_folder` (for
        layers mapped to "disk") go to the model's `from_pretrained`; the drafters then sit on
        `drafter_device` (default: the model's first device, where its inputs go).
        """
        dtype = resolve_dtype(dtype, torch_dtype)
        placement = load_options(device, device_map, max_memory, offload_folder)
        device = None if placement else (device or "cpu")
        name = str(model_id_or_path)
        saved = saved_pipeline_folder(name)
        if saved is not None:
            if drafter is not None:
                kwargs["drafter"] = cls._load_text_drafter(drafter, dtype)
            if placement:  # diffusers' loader moves components whole: load the model dispatched here
                kwargs["model"] = load_vision_model(saved / "model", dtype=dtype, **placement)
            pipe = cls._from_saved(saved, name=name, dtype=dtype, device=device, model_name=name,
                                   feature_drafters=feature_drafter_folders(saved, feature_drafters),
                                   model_folder=saved, **kwargs)
            if drafter_device is not None:  # after `_from_saved` moved the pipeline
                pipe.place_drafters(drafter_device)
            return pipe
        path = resolve(name)
        card = zoo_card(name)
        model = load_vision_model(path, dtype=dtype, device=device, **placement)
        try:
            processor = AutoProcessor.from_pretrained(path)
        except Exception as error:  # noqa: BLE001 - any failure here means the folder lacks a processor
            ensure("torchvision", "vision", f"the processor of {name!r}")  # transformers' video processors need it
            raise MMSpecError(f"could not load the processor of {name!r}: {first_line(error)}") from None
        folder = path if Path(path).is_dir() else None
        if drafter is None:  # the folder's own text drafter (`text/`), else the one its card pairs it with
            own = Path(folder) / TEXT_DRAFTER_FOLDER if folder is not None else None
            drafter = own if own is not None and (own / "config.json").is_file() else card.get("pairs_with")
        if drafter is not None:
            drafter = cls._load_text_drafter(drafter, dtype)
        return cls(model, processor, drafter=drafter, model_name=name, card=card,
                   feature_drafters=feature_drafter_folders(folder, feature_drafters), model_folder=folder,
                   drafter_device=drafter_device, **kwargs)

    @staticmethod
    def _load_text_drafter(drafter: str | os.PathLike | PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
        if isinstance(drafter, PreTrainedModel):
            return drafter
        return load_causal_lm(drafter, "drafter")[0].to(dtype=dtype)

    # --- components and methods ----------------------------------------------------------------

    @property
    def drafter_model(self) -> PreTrainedModel | None:
        """The text drafter (the `drafter` component)."""
        return self.drafter

    def place_drafters(self, device: str | torch.device) -> None:
        """Put every drafter, text and feature, on `device`; the loop's tensors cross to them and back."""
        if self.drafter is not None:
            place_drafter(self.drafter, device, self.model)
        for network in self.feature_drafters.values():
            network.to(as_device(device, "drafter_device"))
        self.drafter_device = device

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        return dict(self.feature_drafters)

    def drafter_factories(self) -> dict[str, DrafterFactory | None]:
        factories: dict[str, DrafterFactory | None] = {
            "ar": NoDrafter,
            "text": (lambda: TextOnlyDrafter(self.drafter, self.model)) if self.drafter is not None else None,
            "std": lambda: SparseToDenseDrafter(self.model, kv_budget=self.std_kv_budget),
        }
        for kind in FEATURE_KINDS:
            network = self.feature_drafters.get(kind)
            factories[kind] = ((lambda network=network: runtime_drafter(network, device=self.drafter_device))
                               if network is not None else None)
        return factories

    def unavailable_reason(self, method: str) -> str:
        if method == "text":
            return "the `text` method needs a drafter: pass drafter=... (a small LM with the model's tokenizer)"
        name = FEATURE_KINDS[method][0]
        looked = f" (none in {Path(self.model_folder) / method})" if self.model_folder else ""
        return (f"the `{method}` method needs a trained {name} drafter for {self.model_name}{looked}: pass "
                f"feature_drafters={{{method!r}: FOLDER}} (CLI: --method {method} --drafter FOLDER), or train one "
                f"({BUILD_COMMAND} for the toy captioner; `mmspec train-drafter --kind {method}` for any model)")

    # --- inputs --------------------------------------------------------------------------------

    def prepare_inputs(
        self,
        video: VideoSource | None = None,
        image: ImageSource | None = None,
        prompt: str | None = None,
        num_frames: int | None = None,
        fps: float | None = None,
    ) -> dict[str, Any]:
        """Model inputs (input_ids, pixel tensors, ...) for one video or one image and a prompt, on the model's device.

        `video`: a file path, frames as an array / tensor [T, H, W, 3] uint8 (or [T, 3, H, W]), or a list
        of frames (PIL images or HxWx3 arrays). `image`: a file path, a PIL image, or an HxWx3 uint8
        array / tensor. Frames given in memory are used as they are (`num_frames`, default
        `default_num_frames`, and `fps` pick frames from a file).
        """
        if (video is None) == (image is None):
            raise MMSpecError("pass exactly one of video=... or image=...")
        kind, source = ("video", video) if video is not None else ("image", image)
        return self.prepare_batch_inputs(kind, [source], [prompt], num_frames=num_frames, fps=fps)

    def prepare_batch_inputs(
        self,
        kind: str,
        sources: list[Any],
        prompts: list[str | None],
        num_frames: int | None = None,
        fps: float | None = None,
    ) -> dict[str, Any]:
        """Model inputs for several videos (`kind` "video") or images ("image"), one prompt each: input_ids
        padded on the left with their `attention_mask` (one row: unpadded), pixels for every item
        (`num_frames` from a video file: `default_num_frames` unless given)."""
        num_frames = self.default_num_frames if num_frames is None else num_frames
        media = [self._load_media(kind, source, num_frames, fps) for source in sources]
        texts = [self._prompt_text(kind, prompt) for prompt in prompts]
        try:
            if len(texts) == 1:
                inputs = self.processor(text=texts, return_tensors="pt", **{f"{kind}s": media})
            else:
                with left_padding(self.processor.tokenizer):  # the batch loop needs each prompt to end in the last column
                    inputs = self.processor(text=texts, return_tensors="pt", padding=True, **{f"{kind}s": media})
        except Exception as error:  # noqa: BLE001 - processors raise many types for bad media
            what = f"this {kind}" if len(texts) == 1 else f"these {len(texts)} {kind}s"
            raise MMSpecError(f"the processor could not prepare {what}: {str(error).splitlines()[0]}") from None
        return inputs_on_model(self.model, inputs)

    def _load_media(self, kind: str, source: Any, num_frames: int, fps: float | None) -> Any:
        """One video's frames [T, H, W, 3] or one PIL image, refused when the model does not read that kind."""
        if kind == "video":
            if not video_token_ids(self.model):
                raise MMSpecError(f"{self.model_name} reads images, not videos: pass an image (or one frame of the video)")
            context = self.context_length()
            if isinstance(source, (str, Path)) and num_frames is not None and context and num_frames >= context:
                # Checked before decoding: every frame takes at least one position.
                raise MMSpecError(f"{num_frames} frames cannot fit: {self.model_name} holds {context} positions in all "
                                  "(prompt, visual tokens and caption); use fewer frames")
            return load_frames(source, num_frames=num_frames, fps=fps)
        if not image_token_ids(self.model):
            raise MMSpecError(f"{self.model_name} reads videos, not images")
        return load_image(source)

    def context_length(self) -> int | None:
        """Positions the language model holds (prompt + visual tokens + new tokens), from its config."""
        config = self.model.config
        text_config = getattr(config, "text_config", None) or config
        return getattr(text_config, "max_position_embeddings", None) or getattr(config, "max_position_embeddings", None)

    @property
    def default_max_new_tokens(self) -> int:
        """The caption length cap when none is given: the model's generation config's `max_new_tokens` (what its
        own `generate` would use), else 64."""
        configured = getattr(getattr(self.model, "generation_config", None), "max_new_tokens", None)
        return int(configured) if configured else 64

    @property
    def default_num_frames(self) -> int:
        """Frames taken from a video file when none is said: as many as the model card says it was trained on, else 8."""
        return int(self.card.get("frames", 8))

    def check_length(self, input_ids: torch.Tensor, max_new_tokens: int, method: str) -> tuple[int, list[str]]:
        """Refuse an input longer than the context (naming the prompt and visual token counts); cut a
        `max_new_tokens` that runs past it. Returns the new tokens allowed and a note per change made."""
        context, length = self.context_length(), int(input_ids.shape[1])
        if not context:
            return max_new_tokens, []
        media_ids = [*video_token_ids(self.model), *image_token_ids(self.model)]
        visual = int(torch.isin(input_ids, torch.tensor(media_ids, device=input_ids.device)).sum()) if media_ids else 0
        if length >= context:
            raise MMSpecError(f"the input is {length} tokens ({visual} visual + {length - visual} prompt), but "
                              f"{self.model_name} holds {context} positions: use fewer frames or a shorter prompt")
        notes = []
        if length + max_new_tokens > context:
            notes.append(f"max_new_tokens cut from {max_new_tokens} to {context - length}: {self.model_name} holds "
                         f"{context} positions and the input takes {length} ({visual} visual)")
            max_new_tokens = context - length
        draft = self.draft_policy(method).max_tokens() if method != "ar" else 0
        if draft >= max(max_new_tokens, 2):
            notes.append(f"drafts of {draft} tokens are cut to {max(max_new_tokens - 1, 1)} (max_new_tokens - 1) each round")
        return max_new_tokens, notes

    def _prompt_text(self, kind: str, prompt: str | None) -> str:
        if prompt is not None and not isinstance(prompt, str):
            raise MMSpecError(f"prompt must be a string (or None for the model's own), got {type(prompt).__name__}")
        placeholder = getattr(self.processor, f"{kind}_token")
        if prompt is not None and placeholder in prompt:
            # The caller placed the media already: use the prompt as it is.
            if prompt.count(placeholder) > 1:
                raise MMSpecError(f"the prompt holds {prompt.count(placeholder)} {placeholder} placeholders; one {kind} is given")
            return prompt
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

    # --- the call ------------------------------------------------------------------------------

    @torch.inference_mode()
    def __call__(
        self,
        video: VideoSource | list[VideoSource] | None = None,
        image: ImageSource | list[ImageSource] | None = None,
        prompt: str | list[str | None] | None = None,
        *,
        max_new_tokens: int | None = None,
        method: str | None = None,
        num_frames: int | None = None,
        fps: float | None = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        seed: int | None = None,
        policy: DraftLengthPolicy | None = None,
        progress_bar: bool = True,
        callback_on_round: RoundCallback | None = None,
        tree: TreeConfig | None = None,
        batch_size: int = 1,
        compile: bool = False,
    ) -> CaptionOutput | list[CaptionOutput]:
        """Caption one video or one image, or a list of them.

        Args:
            video, image: exactly one (see `prepare_inputs` for the forms each takes), or a list of them:
                `image=[a, b, c]`; `video=[a, b]` where each item is a video (a path, a [T, H, W, 3] array,
                or a list of frames; a list of PIL images or HxWx3 arrays is ONE video's frames).
                A list gives a list of `CaptionOutput`, one per item, in order, each with its own stats.
            prompt: the question or instruction (default: the model card's, else "Describe this video.");
                for a list, one prompt for all items or a list of one per item.
            max_new_tokens: the longest caption, in tokens (default: the model's generation config's
                `max_new_tokens`, as `generate` reads it, else 64).
            method: one of `available_methods` (default: `default_method`).
            num_frames, fps: how frames are picked from a video file (`num_frames` default: the frame count
                the model card says the model was trained on, else 8).
            do_sample, temperature, top_k, top_p: sampling (lossless speculative sampling); greedy by default.
            generator: the source of all randomness: a `torch.Generator` on any device (or a list of one).
                A list of inputs draws from this one generator: items one after another, and the rows
                of a batch in turn at every draw (so with `do_sample` an item's caption depends on its
                batch; greedy captions never do).
            seed: instead of `generator`, an int for a CPU generator.
            policy: a draft-length policy (default: `draft_policy(method)`: the card's measured best, else fixed at
                `draft_length(method)`).
            progress_bar: show a progress bar, over tokens for one input, over items for a list (see also
                `set_progress_bar_config`).
            callback_on_round: `fn(round_index, info)` after every target forward; `info` is a
                `RoundInfo` (the token ids committed that round, drafted, accepted, tokens so far; for a
                list, `info.chunk` is the item's index). Not with `batch_size` > 1.
            tree: draft EAGLE-2 trees (`TreeConfig`) instead of chains (methods text, msd and flash); `policy` is then unused.
            batch_size: for a list, items decoded together in one left-padded batch. 1 (default): one by one,
                every method. Larger: the method's target and drafter must decode batches (today `ar` and
                `text` on LLaVA, LLaVA-NeXT-Video and LLaVA-OneVision targets); greedy captions equal the
                items captioned alone.
            compile: the static-shape compiled path (`speculative_generate(compile=True)`): static caches,
                fixed-width verify and text-drafter steps, compiled on the first call (slow), the same captions.
                Chains, `batch_size` 1.
        """
        batch_size = check_batch_size(batch_size)
        method = self.check_method(method)
        max_new_tokens = self.default_max_new_tokens if max_new_tokens is None else max_new_tokens
        num_frames = self.default_num_frames if num_frames is None else num_frames
        listed = self._listed_inputs(video, image)
        sampling = SamplingConfig(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p)
        given, policy = policy, policy or self.draft_policy(method)
        if listed is None:
            if isinstance(prompt, (list, tuple)):
                raise MMSpecError("prompt is a list, but one input was given: pass a list of inputs, or one prompt")
            kind, source = ("video", video) if video is not None else ("image", image)
            prepared = self._prepare_one(kind, source, prompt, method, max_new_tokens, num_frames, fps)
            # Built before the progress bar opens: a drafter that cannot draft trees fails here, in one line.
            decoder = SpeculativeDecoder(self.target, self.make_drafter(method), policy=policy, method=method, tree=tree,
                                         compile=compile)
            generator = self.generator_for(generator, seed, needed=do_sample)
            with self.progress_bar(total=prepared[2], desc=f"caption ({method})", enabled=progress_bar) as bar:
                return self._decode_one(prepared, decoder, sampling, generator, self.round_reporter(callback_on_round, bar))
        kind, sources = listed
        prompts = per_item(prompt, len(sources), "prompt")
        if batch_size > 1:
            if compile:
                raise MMSpecError(f"batch_size={batch_size}: compile=True captions one item at a time; use batch_size=1")
            if tree is not None:
                raise MMSpecError(f"batch_size={batch_size}: draft trees follow one sequence; use batch_size=1 or chains")
            if callback_on_round is not None:
                raise MMSpecError(f"batch_size={batch_size}: callback_on_round follows one sequence; use batch_size=1")
            self.check_batches(method, batch_size)
        generator = self.generator_for(generator, seed, needed=do_sample)
        reporter = self.round_reporter(callback_on_round)
        outputs: list[CaptionOutput] = []
        with self.progress_bar(total=len(sources), desc=f"caption ({method})", unit=kind, enabled=progress_bar) as bar:
            for group in groups(list(range(len(sources))), batch_size):
                if len(group) == 1:
                    reporter.chunk = group[0]
                    prepared = self._prepare_one(kind, sources[group[0]], prompts[group[0]], method, max_new_tokens,
                                                 num_frames, fps)
                    decoder = SpeculativeDecoder(self.target, self.make_drafter(method), policy=policy, method=method,
                                                 tree=tree, compile=compile)
                    outputs.append(self._decode_one(prepared, decoder, sampling, generator, reporter))
                else:
                    # A batch drafts one length for all its rows: a carded confidence stop gives way to the carded k.
                    rows = policy if given is not None or not policy.needs_confidence else \
                        FixedDraftLength(self.draft_length(method))
                    outputs.extend(self._caption_batch(kind, [sources[i] for i in group], [prompts[i] for i in group],
                                                       method, rows, max_new_tokens, num_frames, fps, sampling, generator))
                bar.update(len(group))
        return outputs

    def check_batches(self, method: str | None, batch_size: int) -> None:
        """One clear error when `method` (default: `default_method`) cannot caption `batch_size` items at a time."""
        method = self.check_method(method)
        check_batching(self.target, self.make_drafter(method), method, check_batch_size(batch_size), self.batching_methods())

    def batching_methods(self) -> list[str]:
        """The available methods that decode a list `batch_size` > 1 at a time on this model."""
        return [m for m in self.available_methods if batching_refusal(self.target, self.make_drafter(m), m) is None]

    @staticmethod
    def _listed_inputs(video: Any, image: Any) -> tuple[str, list[Any]] | None:
        """("video" | "image", items) when a list of inputs was given, None for one input."""
        if (video is None) == (image is None):
            raise MMSpecError("pass exactly one of video=... or image=...")
        if image is not None:
            return ("image", list(image)) if isinstance(image, (list, tuple)) else None
        if not isinstance(video, (list, tuple)):
            return None
        # A list of frames (PIL images, HxWx3 arrays) is one video; a list of videos holds paths, [T, H, W, 3]
        # arrays or lists of frames.
        videos = [isinstance(item, (str, Path, list, tuple)) or (getattr(item, "ndim", 0) == 4) for item in video]
        if video and all(videos):
            return "video", list(video)
        if any(videos):
            raise MMSpecError("video=[...] mixes videos (paths, [T, H, W, 3] arrays, lists of frames) with single frames: "
                              "pass a list of videos, or one video's frames")
        return None

    def _prepare_one(self, kind: str, source: Any, prompt: str | None, method: str, max_new_tokens: int,
                     num_frames: int, fps: float | None) -> tuple[torch.LongTensor, dict[str, Any], int, list[str]]:
        """One item's input_ids, other model inputs, allowed new tokens and notes (bad input fails here, before decoding)."""
        inputs = self.prepare_batch_inputs(kind, [source], [prompt], num_frames=num_frames, fps=fps)
        input_ids = inputs.pop("input_ids")
        allowed, notes = self.check_length(input_ids, max_new_tokens, method)
        return input_ids, inputs, allowed, notes

    def _decode_one(self, prepared: tuple[torch.LongTensor, dict[str, Any], int, list[str]], decoder: SpeculativeDecoder,
                    sampling: SamplingConfig, generator: torch.Generator | None, reporter: Any) -> CaptionOutput:
        input_ids, inputs, max_new_tokens, notes = prepared
        method = decoder.method
        out = decoder.generate(input_ids, max_new_tokens=max_new_tokens, sampling=sampling, generator=generator,
                               on_round=reporter, **inputs)
        new_tokens = out.sequences[0, input_ids.shape[1]:]
        text = self.processor.tokenizer.decode(new_tokens, skip_special_tokens=True).strip()
        return CaptionOutput(text=text, method=method, model=self.model_name, stats=out.stats, sequences=out.sequences,
                             notes=notes or None)

    def _caption_batch(self, kind: str, sources: list[Any], prompts: list[str | None], method: str,
                       policy: DraftLengthPolicy, max_new_tokens: int, num_frames: int, fps: float | None,
                       sampling: SamplingConfig, generator: torch.Generator | None) -> list[CaptionOutput]:
        """Several items in one left-padded batch: one output per item, as if it had been captioned alone."""
        inputs = self.prepare_batch_inputs(kind, sources, prompts, num_frames=num_frames, fps=fps)
        input_ids = inputs.pop("input_ids")
        valid = inputs["attention_mask"].bool()
        prompts_ids = [input_ids[i, valid[i]] for i in range(input_ids.shape[0])]
        checked = [self.check_length(ids[None], max_new_tokens, method) for ids in prompts_ids]
        budget = min(allowed for allowed, _ in checked)  # one budget per batch: the tightest row's
        notes = [list(row_notes) for _, row_notes in checked]
        for row_notes, (allowed, _) in zip(notes, checked):
            if allowed > budget:
                row_notes.append(f"max_new_tokens cut to {budget}: another input of its batch leaves no more room "
                                 "(caption it with batch_size=1 for more)")
        decoder = SpeculativeDecoder(self.target, self.make_drafter(method), policy=policy, method=method)
        out = decoder.generate(input_ids, max_new_tokens=budget, sampling=sampling, generator=generator, **inputs)
        width = input_ids.shape[1]
        outputs = []
        for row, (prompt_ids, row_stats, row_notes) in enumerate(zip(prompts_ids, out.stats.rows, notes)):
            new_tokens = out.sequences[row, width:width + row_stats.new_tokens]  # the rest is the batch's padding
            text = self.processor.tokenizer.decode(new_tokens, skip_special_tokens=True).strip()
            outputs.append(CaptionOutput(text=text, method=method, model=self.model_name, stats=row_stats,
                                         sequences=torch.cat([prompt_ids, new_tokens])[None], notes=row_notes or None))
        return outputs
