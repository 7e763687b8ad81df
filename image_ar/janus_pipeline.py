"""Text-to-image with Janus / Janus-Pro (transformers' `JanusForConditionalGeneration`) and speculative methods.

    pipe = SpeculativeImagePipeline.from_pretrained("deepseek-community/Janus-Pro-1B")   # or a local folder
    out = pipe(prompt="a red circle", method="sjd", generator=torch.Generator().manual_seed(0))
    out.images[0].save("x.png"); out.stats.step_compression

`SpeculativeImagePipeline.from_pretrained` returns this class for a folder whose config.json says
`"model_type": "janus"`; `JanusImagePipeline.from_pretrained` loads only Janus folders.

Folder: a transformers Janus checkpoint (config.json, weights, generation_config.json with
`generation_kwargs.boi_token_id`, as the converted checkpoints ship) and its `JanusProcessor`
(tokenizer + chat template), or at least a tokenizer.

Prompts are formatted as transformers' Janus docs do for image generation: one user turn through the
chat template with the generation prompt, then `processor(text=..., generation_mode="image")`, which
appends the begin-of-image token. Methods: ar, sjd (lossless), gsd and lantern (relaxed, on SJD's
Jacobi drafts). With a drafter (`drafter=`: a smaller Janus sharing the codebook and tokenizer,
e.g. Janus-Pro-1B for Janus-Pro-7B), also `sd` (lossless speculative sampling, both models guided
with the same scale) and LANTERN on the drafter's drafts.

A `SpeculativePipeline` (mmspec.pipelines): `model`, `processor` and the optional `drafter` are
components (`.to()`, `.device`, `.dtype`, `save_pretrained`); `torch_dtype=` (or `dtype=`) picks the
dtype the checkpoints load in (float32 by default).
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import AutoProcessor, AutoTokenizer, JanusForConditionalGeneration

from mmspec.errors import MMSpecError
from mmspec.pipelines import DrafterFactory, RoundCallback, SpeculativePipeline, resolve_dtype, saved_pipeline_folder
from mmspec.sampling import SamplingConfig

from .imaging import convert
from .janus import JanusCFGTarget
from .methods import MethodConfig, MethodRunner
from .pipeline_common import (
    ImageGenerationOutput,
    check_guidance_scale,
    check_output_type,
    from_saved_folder,
    load_model,
    local_folder,
    per_image_rounds,
)

JANUS_METHODS = ("ar", "sjd", "gsd", "lantern")  # + "sd" with a drafter
DEFAULT_JANUS_GUIDANCE_SCALE = 5.0  # transformers' image `generate` and the Janus repository use 5


def is_janus_folder(folder: os.PathLike | str) -> bool:
    """True when the folder's config.json declares a Janus model."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON: not a Janus folder (its loader says what it is)
        return False
    return isinstance(config, dict) and config.get("model_type") == "janus"


def load_prompt_processor(path: str) -> Any:
    """The folder's JanusProcessor, else its tokenizer, else None."""
    for loader in (AutoProcessor, AutoTokenizer):
        try:
            return loader.from_pretrained(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


class JanusImagePipeline(SpeculativePipeline):
    """Text-to-image generation with a Janus model, its VQ decoder and training-free speculative methods.

    Args:
        model: the `JanusForConditionalGeneration`.
        processor: its `JanusProcessor`, or a tokenizer (prompts then end with the BOI token id).
        model_name: shown in outputs.
        drafter: a smaller `JanusForConditionalGeneration` with the same codebook, image grid and
            tokenizer (None: no `sd`, LANTERN on Jacobi drafts only).
    """

    conditioning = "text"  # the CLI passes the prompt through as free text
    _optional_components = ["drafter"]

    def __init__(self, model: JanusForConditionalGeneration, processor: Any, model_name: str = "",
                 drafter: JanusForConditionalGeneration | None = None) -> None:
        if processor is None:
            raise MMSpecError("Janus needs its processor or tokenizer to read text prompts")
        super().__init__()
        self.register_modules(model=model.eval(), processor=processor, drafter=None if drafter is None else drafter.eval())
        self.model_name = model_name or model.config.name_or_path or type(model).__name__
        self.folder = None  # set by from_pretrained (the benchmark looks for judge/ there)
        self.runner = self._runner()

    def _runner(self) -> MethodRunner:
        target = JanusCFGTarget(self.model, guidance_scale=self.default_guidance_scale)
        drafter = None
        if self.drafter is not None:
            drafter = JanusCFGTarget(self.drafter, guidance_scale=self.default_guidance_scale)
            check_janus_drafter(drafter, target)
        return MethodRunner(target, drafter=drafter, codebook=target.codebook_embeddings())

    @classmethod
    def from_pretrained(
        cls,
        model_id_or_path: str | os.PathLike,
        drafter: Any = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        *,
        torch_dtype: torch.dtype | str | None = None,
    ) -> "JanusImagePipeline":
        """Load a Janus folder, a saved Janus pipeline (`save_pretrained`) or a Hub id and its processor,
        and optionally a drafter: a smaller Janus (folder, Hub id or loaded model) sharing its codebook
        and tokenizer. `dtype` (or `torch_dtype`, the same) defaults to float32."""
        dtype = resolve_dtype(dtype, torch_dtype)
        name = str(model_id_or_path)
        saved = saved_pipeline_folder(name)
        if saved is not None:
            kwargs: dict[str, Any] = {}
            if drafter is False:
                kwargs["drafter"] = None
            elif drafter is not None:
                kwargs["drafter"] = cls._load_drafter(drafter, dtype)
            return from_saved_folder(cls, saved, name, dtype, device, **kwargs)
        folder = local_folder(name)
        if not is_janus_folder(folder):
            raise MMSpecError(f"{name!r} is not a Janus checkpoint (config.json model_type is not 'janus')")
        model = load_model(JanusForConditionalGeneration, str(folder), "Janus model", dtype=dtype)
        processor = load_prompt_processor(str(folder))
        if processor is None:
            raise MMSpecError(f"{name!r} has no processor or tokenizer files: Janus cannot read a text prompt without them")
        if drafter not in (None, False):
            drafter = cls._load_drafter(drafter, dtype)
        pipe = cls(model, processor, model_name=name, drafter=drafter or None)
        pipe.folder = folder
        return pipe.to(device)

    @staticmethod
    def _load_drafter(drafter: Any, dtype: torch.dtype) -> JanusForConditionalGeneration:
        if isinstance(drafter, JanusForConditionalGeneration):
            return drafter
        drafter_folder = local_folder(str(drafter))
        if not is_janus_folder(drafter_folder):
            raise MMSpecError(f"the drafter {str(drafter)!r} is not a Janus checkpoint (config.json model_type is not 'janus')")
        return load_model(JanusForConditionalGeneration, str(drafter_folder), "Janus drafter", dtype=dtype)

    def to(self, *args: Any, **kwargs: Any) -> "JanusImagePipeline":
        """Move the model and drafter (a device and/or a dtype, as diffusers' `pipe.to`)."""
        super().to(*args, **kwargs)
        self.runner = self._runner()  # codebook on the new device
        return self

    # ------------------------------------------------------------------ defaults (the LlamaGen pipeline's names)

    @property
    def target(self) -> JanusCFGTarget:
        return self.runner.target  # type: ignore[return-value]

    @property
    def vq(self) -> JanusCFGTarget:
        """The token-grid decoder (`decode(grids) -> pixels`), as `bench_image` reads it from any image pipeline."""
        return self.target

    @property
    def default_guidance_scale(self) -> float:
        scale = getattr(self.model.generation_config, "guidance_scale", None)
        return float(scale) if scale else DEFAULT_JANUS_GUIDANCE_SCALE

    def drafter_factories(self) -> dict[str, DrafterFactory | None]:
        """`JANUS_METHODS`, then `sd` (None without a drafter): a factory gives the core-loop drafter the method runs
        with its default options (`MethodRunner.drafter`)."""
        factories: dict[str, DrafterFactory | None] = {
            method: partial(self.runner.drafter, MethodConfig(method=method)) for method in JANUS_METHODS}
        factories["sd"] = partial(self.runner.drafter, MethodConfig(method="sd")) if self.drafter is not None else None
        return factories

    def unavailable_reason(self, method: str) -> str:
        return ("method 'sd' needs a drafter: a smaller Janus sharing the codebook and tokenizer "
                "(drafter=PATH; CLI --drafter PATH); without one use ar, sjd, gsd or lantern (Jacobi drafts)")

    @property
    def default_method(self) -> str:
        return "sjd"

    # ------------------------------------------------------------------ prompts

    def encode_prompt(self, prompt: str) -> torch.LongTensor:
        """Text -> token ids for image generation: chat template (if any), then the BOI token at the end."""
        if not isinstance(prompt, str):
            raise MMSpecError(f"Janus prompts are text, got {type(prompt).__name__}")
        if not prompt.strip():
            raise MMSpecError("the prompt is empty: Janus generates from a text description")
        messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
        if hasattr(self.processor, "tokenizer"):  # a JanusProcessor: exactly transformers' documented recipe
            text = prompt
            if self.processor.chat_template:
                text = self.processor.apply_chat_template(messages, add_generation_prompt=True)
            return self.processor(text=text, generation_mode="image", return_tensors="pt").input_ids[0]
        tokenizer = self.processor
        if getattr(tokenizer, "chat_template", None):
            prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        boi = self.target.boi
        if boi is None:
            raise MMSpecError("cannot find Janus' begin-of-image token id (generation_config.generation_kwargs.boi_token_id)")
        return torch.tensor([*tokenizer(prompt).input_ids, boi], device=self.model.device)

    def encode_prompts(self, prompts: str | Sequence[str] | None) -> tuple[list[str], list[torch.Tensor]]:
        """The prompts as a list, and their token ids (one 1-D tensor each); condition i means `prompts[i]`."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts or [])
        if not prompts:
            raise MMSpecError("no prompt given: Janus generates from a text description")
        return prompts, [self.encode_prompt(p) for p in prompts]

    def set_prompts(self, prompts: str | Sequence[str]) -> list[str]:
        """Make `prompts` the ones the runner's own target (and drafter) read when a run passes none (the
        benchmark's setup); a pipeline call passes its own instead and leaves these alone."""
        prompts, encoded = self.encode_prompts(prompts)
        self.target.set_prompts(encoded)
        if self.runner.drafter_model is not None:  # same tokenizer: the drafter reads the same ids
            self.runner.drafter_model.set_prompts(encoded)
        return prompts

    def bench_conditions(self, n: int, prompts: Sequence[str] | None = None) -> list[int]:
        """Conditions for `bench_image`: n prompt indices cycling through `prompts` (required for Janus)."""
        if not prompts:
            raise MMSpecError("Janus is a text-to-image model: give the benchmark text prompts (--prompts \"a red circle\" ...)")
        count = len(self.set_prompts(prompts))
        return [i % count for i in range(n)]

    # ------------------------------------------------------------------ generation

    @torch.inference_mode()
    def __call__(
        self,
        prompt: str | Sequence[str] | None = None,
        *,
        class_labels: Any = None,
        method: str | None = None,
        guidance_scale: float | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        num_images: int = 1,
        output_type: str = "pil",
        progress_bar: bool = True,
        callback_on_round: RoundCallback | None = None,
        **method_options: Any,
    ) -> ImageGenerationOutput:
        """Generate `num_images` images per text prompt.

        temperature 0 means greedy decoding (every method then equals greedy AR exactly).
        `method_options` are `MethodConfig` fields: window, init, lantern_delta, lantern_k,
        lantern_lam, gsd_window, gsd_prob_threshold, gsd_distance_threshold, gsd_latents (GSD measures
        distances between the language model's input embeddings of the image codes by default).
        `callback_on_round(round_index, info)`: after every target forward (the core loop's `on_round`);
        `info` is a `mmspec.pipelines.RoundInfo`: the committed token ids, drafted / accepted counts,
        `chunk` = which image of the call, `position` = the raster index of the first token in its grid.
        """
        if class_labels is not None:
            raise MMSpecError("Janus is text-conditional: pass prompt=\"...\" instead of class_labels")
        check_output_type(output_type)
        if num_images < 1:
            raise MMSpecError(f"num_images must be >= 1, got {num_images}")
        if temperature < 0:
            raise MMSpecError(f"temperature must be >= 0, got {temperature}")
        method = method or self.default_method
        config = self.method_config(method, method_options)
        scale = self.default_guidance_scale if guidance_scale is None else check_guidance_scale(guidance_scale)
        prompts, encoded = self.encode_prompts(prompt)
        conditions = [i for i in range(len(prompts)) for _ in range(num_images)]
        sampling = SamplingConfig(do_sample=temperature > 0, temperature=temperature or 1.0, top_k=top_k, top_p=top_p)
        # None and sampling: a private generator seeded from torch's global seed (torch.manual_seed repeats runs).
        generator = self.generator_for(generator, seed, needed=sampling.do_sample)
        per_image = self.target.num_tokens
        with self.progress_bar(total=len(conditions) * per_image, desc=f"image ({method})", unit="tok",
                               enabled=progress_bar) as bar:
            on_round = per_image_rounds(self.round_reporter(callback_on_round, bar), per_image)
            out = self.runner.run(config, conditions, sampling=sampling, generator=generator, guidance_scale=scale,
                                  prompts=encoded, on_round=on_round)
        images = convert(self.target.decode(out.tokens), output_type)  # stats time token generation only
        return ImageGenerationOutput(images=images, tokens=out.tokens, class_labels=[], method=method, model=self.model_name,
                                     stats=out.stats, prompts=[prompts[i] for i in conditions],
                                     settings=config.settings(self.drafter is not None))

    def method_config(self, method: str, options: dict[str, Any]) -> MethodConfig:
        """Validate a method for Janus: `sd` and LANTERN on drafter drafts need a drafter."""
        if method == "sd" and self.drafter is None:
            raise MMSpecError(self.unavailable_reason(method))
        if method not in self.available_methods:
            raise MMSpecError(f"unknown method {method!r} for Janus; choose from {', '.join(self.available_methods)}")
        if self.drafter is None:
            if options.get("drafts", "jacobi") not in ("auto", "jacobi"):
                raise MMSpecError("no Janus drafter is loaded: LANTERN runs on Jacobi drafts (drafts='jacobi')")
            options = {**options, "drafts": "jacobi"}
        try:
            config = MethodConfig(method=method, **options)
        except TypeError as error:
            raise MMSpecError(f"unknown method option: {error}") from None
        self.runner.check(config)  # e.g. LANTERN's k against the codebook, before anything runs
        return config


def check_janus_drafter(drafter: JanusCFGTarget, target: JanusCFGTarget) -> None:
    """One clear error when a Janus drafter cannot draft for this target."""
    if drafter.vocab_size != target.vocab_size or drafter.grid_size != target.grid_size:
        raise MMSpecError(f"the Janus drafter makes {drafter.grid_size}x{drafter.grid_size} grids over {drafter.vocab_size} codes, "
                          f"the target {target.grid_size}x{target.grid_size} over {target.vocab_size}: they must match")
    mine = drafter.model.config.get_text_config().vocab_size
    theirs = target.model.config.get_text_config().vocab_size
    if mine != theirs:
        raise MMSpecError(f"the Janus drafter reads a {mine}-token text vocabulary, the target {theirs}: prompts need one tokenizer")
