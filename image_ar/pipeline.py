"""A diffusers-style pipeline for class-conditional AR image models (LlamaGen-style) with speculative methods.

A Janus folder (config.json model_type "janus") loads as `janus_pipeline.JanusImagePipeline` instead:
text-to-image, same call and output.

    pipe = SpeculativeImagePipeline.from_pretrained("shapes-image-ar")   # zoo name, folder or Hub id
    out = pipe(prompt="red circle", method="gsd", generator=torch.Generator().manual_seed(0))
    out.images[0].save("x.png"); out.stats.step_compression

Methods (see `image_ar.methods`): ar, sd (drafter, lossless), sjd (lossless), gsd and lantern (relaxed).

A `SpeculativePipeline` (mmspec.pipelines, on diffusers' `DiffusionPipeline`): the target `model`,
its `vq` tokenizer and the optional `drafter` are components (`.to()`, `.device`, `.dtype`,
`pipe.components`); `class_names` and `card` are settings in `model_index.json`.

    pipe.save_pretrained("my-image-model")                 # model_index.json + model/, vq/, drafter/
    pipe = SpeculativeImagePipeline.from_pretrained("my-image-model", torch_dtype=torch.float32)

Folder layout read by `from_pretrained` (the `shapes-image-ar` zoo model follows it):
    config.json + *.safetensors   the target `LlamaGenForClassConditional` (loaded as float32)
    vq/                           its `VQModel` tokenizer (required: tokens -> pixels, LANTERN/GSD latents)
    drafter/                      optional small `LlamaGenForClassConditional` with the same codebook
    classes.json                  optional list of class names in id order ("red circle", ...): enables prompt=
    zoo_card.json                 optional: default_method, guidance_scale, gsd_defaults, lantern_defaults
    judge/                        ignored here (the benchmark's quality judge)
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import torch

from mmspec.errors import MMSpecError
from mmspec.pipelines import (
    DrafterFactory,
    RoundCallback,
    SpeculativePipeline,
    _saved_class_name,
    resolve_dtype,
    saved_pipeline_folder,
)
from mmspec.sampling import SamplingConfig
from mmspec.zoo import entries, resolve

from .decode import ar_generate
from .imaging import convert
from .janus_pipeline import JanusImagePipeline, is_janus_folder
from .llamagen import LlamaGenForClassConditional
from .mar_pipeline import MAR_METHODS, MARPipeline
from .methods import METHODS, MethodConfig, MethodRunner
from .pipeline_common import (
    ClassConditionalMixin,
    ImageGenerationOutput,
    check_guidance_scale,
    check_output_type,
    check_saved_class,
    from_saved_folder,
    load_model,
    local_folder,
    per_image_rounds,
    read_json,
)
from .rules import GSD_DISTANCE_THRESHOLD, GSD_PROB_THRESHOLD, GSD_WINDOW, LANTERN_DELTA, LANTERN_K
from .target import CFGTarget, ImageTokensOutput
from .var_pipeline import VAR_METHODS, VARPipeline
from .vq import VQModel

DEFAULT_IMAGE_MODEL = "shapes-image-ar"
# Every method of some image family (the CLI's choices); each pipeline refuses the ones it does not run.
IMAGE_METHODS = tuple(dict.fromkeys((*METHODS, *VAR_METHODS, *MAR_METHODS)))
class _ModelDefault:
    """Sentinel for a method option whose default comes from the model card (None means "off")."""

    def __repr__(self) -> str:
        return "MODEL_DEFAULT"


MODEL_DEFAULT: Any = _ModelDefault()
DEFAULT_GUIDANCE_SCALE = 4.0  # LlamaGen's class-conditional default (used when the card states none)


def image_family(name_or_path: str | os.PathLike) -> str | None:
    """The family a name loads as ("llamagen", "janus", "var" or "mar"), read from its files without loading
    weights or asking the Hub; None when only loading can tell (a Hub id, a missing folder)."""
    name = str(name_or_path)
    saved = saved_pipeline_folder(name)
    if saved is not None:
        families = {VARPipeline.__name__: "var", MARPipeline.__name__: "mar", JanusImagePipeline.__name__: "janus"}
        return families.get(_saved_class_name(saved), "llamagen")
    folder = next((entry.path for entry in entries() if entry.name == name), None) or Path(name).expanduser()
    if not (folder / "config.json").is_file():
        return None
    return "janus" if is_janus_folder(folder) else "llamagen"


class SpeculativeImagePipeline(ClassConditionalMixin, SpeculativePipeline):
    """Class-conditional image generation with an AR transformer, a VQ decoder and speculative methods.

    Use `from_pretrained` for both this and Janus folders (it returns a `JanusImagePipeline` for those).

    Args:
        model: the target `LlamaGenForClassConditional`.
        vq: its `VQModel` (codebook size = the model's vocabulary).
        drafter: optional small `LlamaGenForClassConditional` with the same codebook and classes.
        class_names: optional class names in id order (for `prompt=`).
        model_name: shown in outputs.
        card: zoo card (default_method, guidance_scale, gsd_defaults, lantern_defaults), if any.

    Components (saved by `save_pretrained`): `model`, `vq`, `drafter`; settings in `model_index.json`:
    `class_names`, `card`.
    """

    conditioning = "class"  # the CLI reads its prompt as a class name or id (Janus: "text")
    _optional_components = ["drafter"]
    speculative_method = "sjd"  # training-free and lossless: the default when the card names none
    class_names_source = "classes.json"
    speculative_needs = ("a drafter: a small LlamaGen with the model's codebook and classes "
                         "(a drafter/ folder, or drafter=...; CLI --drafter PATH)")

    def __init__(
        self,
        model: LlamaGenForClassConditional,
        vq: VQModel,
        drafter: LlamaGenForClassConditional | None = None,
        class_names: Sequence[str] | None = None,
        model_name: str = "",
        card: dict[str, Any] | None = None,
    ) -> None:
        if vq.config.codebook_size != model.config.vocab_size:
            raise MMSpecError(f"the VQ codebook has {vq.config.codebook_size} codes, the model predicts {model.config.vocab_size}")
        if drafter is not None and drafter.config.num_classes != model.config.num_classes:
            raise MMSpecError(f"drafter has {drafter.config.num_classes} classes, the model {model.config.num_classes}")
        if class_names is not None and len(class_names) != model.config.num_classes:
            raise MMSpecError(f"classes.json lists {len(class_names)} names for a model with {model.config.num_classes} classes")
        super().__init__()
        self._register_parts(class_names, card,
                             model_name or getattr(model.config, "name_or_path", "") or type(model).__name__,
                             model=model.eval(), vq=vq.eval(), drafter=drafter)
        self.runner = MethodRunner(CFGTarget(model, self.default_guidance_scale), drafter, vq.codebook_embeddings())

    @classmethod
    def from_pretrained(
        cls,
        model_id_or_path: str | os.PathLike = DEFAULT_IMAGE_MODEL,
        drafter: str | os.PathLike | LlamaGenForClassConditional | bool | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        *,
        torch_dtype: torch.dtype | str | None = None,
    ) -> "SpeculativeImagePipeline | JanusImagePipeline | VARPipeline | MARPipeline":
        """Load from a zoo name, a local folder, a saved pipeline (`save_pretrained`) or a Hub id
        (layout in the module docstring).

        `drafter`: None = the folder's `drafter/` if present; False = none; a folder or a model.
        `dtype` (or `torch_dtype`, the same) defaults to float32.
        A Janus checkpoint gives a `JanusImagePipeline` (text prompts; `drafter` = a smaller Janus or None),
        a saved `VARPipeline` (e.g. the zoo's shapes-var) a `VARPipeline` (`drafter` = its refiner), a saved
        `MARPipeline` a `MARPipeline` (`drafter` = its draft MAR).
        """
        dtype = resolve_dtype(dtype, torch_dtype)
        name = str(model_id_or_path)
        saved = saved_pipeline_folder(name)
        if saved is not None:
            if _saved_class_name(saved) == JanusImagePipeline.__name__:
                return JanusImagePipeline.from_pretrained(name, drafter=drafter, device=device, dtype=dtype)
            if _saved_class_name(saved) == VARPipeline.__name__:
                return VARPipeline.from_pretrained(name, refiner=drafter, device=device, dtype=dtype)
            if _saved_class_name(saved) == MARPipeline.__name__:
                return MARPipeline.from_pretrained(name, draft=drafter, device=device, dtype=dtype)
            return cls._load_saved(saved, name, drafter, device, dtype)
        folder = local_folder(name)

        if is_janus_folder(folder):
            return JanusImagePipeline.from_pretrained(name, drafter=drafter, device=device, dtype=dtype)
        path = str(folder)
        model = load_model(LlamaGenForClassConditional, path, "image model", dtype=dtype)
        if not isinstance(model, LlamaGenForClassConditional):
            raise MMSpecError(f"{name!r} holds a {type(model).__name__}, not a class-conditional LlamaGen model")
        if not (folder / "vq" / "config.json").is_file():
            raise MMSpecError(f"{name!r} has no vq/ folder: the VQ tokenizer is needed to turn tokens into pixels")
        vq = load_model(VQModel, path, "VQ tokenizer", subfolder="vq", dtype=dtype)
        drafter = cls._load_drafter(drafter, folder, dtype)
        class_names = read_json(folder / "classes.json") if (folder / "classes.json").is_file() else None
        card = read_json(folder / "zoo_card.json") if (folder / "zoo_card.json").is_file() else {}
        pipe = cls(model, vq, drafter=drafter, class_names=class_names, model_name=name, card=card)
        pipe.folder = folder
        return pipe.to(device)

    @staticmethod
    def _load_drafter(drafter: Any, folder: Path, dtype: torch.dtype) -> LlamaGenForClassConditional | None:
        """None: the folder's `drafter/` if present; False: none; a folder, zoo name or model: that one."""
        if drafter is None and (folder / "drafter" / "config.json").is_file():
            return load_model(LlamaGenForClassConditional, str(folder), "drafter", subfolder="drafter", dtype=dtype)
        if drafter is None or drafter is False:
            return None
        if not isinstance(drafter, LlamaGenForClassConditional):
            return load_model(LlamaGenForClassConditional, resolve(str(drafter)), "drafter", dtype=dtype)
        return drafter

    @classmethod
    def _load_saved(cls, folder: Path, name: str, drafter: Any, device: str | torch.device,
                    dtype: torch.dtype) -> "SpeculativeImagePipeline":
        """A folder written by `save_pretrained`. The mmspec models are read from their subfolders here
        and handed to diffusers' loader (which reads `model_index.json`: class names, card)."""
        check_saved_class(cls, folder, name)
        model = load_model(LlamaGenForClassConditional, str(folder), "image model", subfolder="model", dtype=dtype)
        vq = load_model(VQModel, str(folder), "VQ tokenizer", subfolder="vq", dtype=dtype)
        return from_saved_folder(cls, folder, name, dtype, device, model=model, vq=vq,
                                 drafter=cls._load_drafter(drafter, folder, dtype))

    def to(self, *args: Any, **kwargs: Any) -> "SpeculativeImagePipeline":
        """Move the model, VQ and drafter (a device and/or a dtype, as diffusers' `pipe.to`)."""
        super().to(*args, **kwargs)
        # Codebook (and LANTERN neighbour tables) on the new device.
        self.runner = MethodRunner(self.runner.target, self.drafter, self.vq.codebook_embeddings())
        return self

    @property
    def default_guidance_scale(self) -> float:
        if "guidance_scale" in self.card:
            return float(self.card["guidance_scale"])
        return DEFAULT_GUIDANCE_SCALE if self.model.config.class_dropout_prob > 0 else 1.0

    def drafter_factories(self) -> dict[str, DrafterFactory | None]:
        """Every method (`METHODS`) -> a factory for the core-loop drafter it runs with its default options
        (`MethodRunner.drafter`: none for ar, the guided drafter model for sd and LANTERN when one is loaded, Jacobi
        drafts otherwise); None while it cannot run (`sd` without a drafter)."""
        return {method: partial(self.runner.drafter, MethodConfig(method=method))
                if method != "sd" or self.drafter is not None else None for method in METHODS}

    def gsd_settings(self, **given: Any) -> dict[str, Any]:
        """GSD's group options: those given, else the zoo card's `gsd_defaults`, else the paper's.

        The distance threshold depends on the scale of the latents it compares (by default the AR
        model's input token embeddings, as the authors do), so a model card may carry values
        calibrated for that model (measured in BENCHMARKS.md); the library defaults are the
        authors' (So et al. 2025).
        """
        paper = {"gsd_window": GSD_WINDOW, "gsd_prob_threshold": GSD_PROB_THRESHOLD,
                 "gsd_distance_threshold": GSD_DISTANCE_THRESHOLD, "gsd_latents": "embeddings"}
        return self._settings("gsd_defaults", paper, given)

    def lantern_settings(self, **given: Any) -> dict[str, Any]:
        """LANTERN's options: those given, else the zoo card's `lantern_defaults`, else the authors'.

        The authors' k = 1000 neighbours is set for a 16384-code codebook; a model with a small
        codebook carries its own in the card (the toy's: k = 16). k is checked against the codebook
        when a method runs (`MethodRunner.check`).
        """
        authors = {"lantern_delta": LANTERN_DELTA, "lantern_k": LANTERN_K, "lantern_lam": None}
        return self._settings("lantern_defaults", authors, given)

    def _settings(self, section: str, defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
        unknown = set(given) - set(defaults)
        if unknown:
            raise MMSpecError(f"unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(defaults)}")
        card = self.card.get(section, {})
        return {name: (given[name] if given.get(name, MODEL_DEFAULT) is not MODEL_DEFAULT else card.get(name, value))
                for name, value in defaults.items()}

    @property
    def num_classes(self) -> int:
        return self.model.config.num_classes

    def check_num_images(self, num_images: int) -> None:
        if num_images < 1:
            raise MMSpecError(f"num_images must be >= 1, got {num_images}")

    @torch.inference_mode()
    def __call__(
        self,
        class_labels: int | Sequence[int] | torch.Tensor | None = None,
        prompt: str | Sequence[str] | None = None,
        *,
        method: str | None = None,
        guidance_scale: float | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        num_images: int = 1,
        output_type: str = "pil",
        window: int = 16,
        init: str = "left",
        num_draft_tokens: int = 4,
        drafts: str = "auto",
        lantern_delta: Any = MODEL_DEFAULT,
        lantern_k: Any = MODEL_DEFAULT,
        lantern_lam: Any = MODEL_DEFAULT,
        gsd_window: Any = MODEL_DEFAULT,
        gsd_prob_threshold: Any = MODEL_DEFAULT,
        gsd_distance_threshold: Any = MODEL_DEFAULT,
        gsd_latents: Any = MODEL_DEFAULT,
        progress_bar: bool = True,
        callback_on_round: RoundCallback | None = None,
        batch_size: int = 1,
    ) -> ImageGenerationOutput:
        """Generate `num_images` images per class label (or class-name prompt).

        temperature 0 means greedy decoding (every method then equals greedy AR exactly, relaxed ones
        included, since the greedy target distribution is one-hot). Method options: see `MethodConfig`;
        GSD's and LANTERN's options default to the model card's values (`gsd_settings`,
        `lantern_settings`), else the authors'. `generator`: a `torch.Generator` (a CPU one works with a
        model on any device); `seed`: instead, an int for a CPU generator.
        `callback_on_round(round_index, info)`: after every target forward (the core loop's `on_round`);
        `info` is a `mmspec.pipelines.RoundInfo`: the committed token ids, drafted / accepted counts,
        `chunk` = which image of the call, `position` = the raster index of the first token in its grid.
        `batch_size`: images decoded together, all rows in one forward per token (method "ar" only; the
        image drafters draft one grid at a time). Rows of a batch draw from the generator in turn, so a
        sampled image depends on its batch; greedy ones do not.
        """
        check_output_type(output_type)
        labels = self.resolve_labels(class_labels, prompt, num_images)
        method = self.check_method(method)
        config = MethodConfig(method=method, window=window, init=init, num_draft_tokens=num_draft_tokens, drafts=drafts,
                              **self.lantern_settings(lantern_delta=lantern_delta, lantern_k=lantern_k, lantern_lam=lantern_lam),
                              **self.gsd_settings(gsd_window=gsd_window, gsd_prob_threshold=gsd_prob_threshold,
                                                  gsd_distance_threshold=gsd_distance_threshold, gsd_latents=gsd_latents))
        self.runner.check(config)  # one clear error (e.g. LANTERN's k vs the codebook) before anything runs
        if temperature < 0:
            raise MMSpecError(f"temperature must be >= 0, got {temperature}")
        sampling = SamplingConfig(do_sample=temperature > 0, temperature=temperature or 1.0, top_k=top_k, top_p=top_p)
        # None and sampling: a private generator seeded from torch's global seed (torch.manual_seed repeats runs).
        generator = self.generator_for(generator, seed, needed=sampling.do_sample)
        scale = self.default_guidance_scale if guidance_scale is None else check_guidance_scale(guidance_scale)
        per_image = self.runner.target.num_tokens
        batched = check_batch_size(batch_size, method, callback_on_round) > 1
        with self.progress_bar(total=len(labels) * per_image, desc=f"image ({method})", unit="tok", enabled=progress_bar) as bar:
            if batched:
                target = self.runner.target.for_call(scale)  # the call's own scale and cache
                outs = [ar_generate(target, labels[i:i + batch_size], sampling, generator, scale, on_tokens=bar.update)
                        for i in range(0, len(labels), batch_size)]
                out = ImageTokensOutput(tokens=torch.cat([o.tokens for o in outs]), stats=sum((o.stats for o in outs[1:]), outs[0].stats))
            else:
                on_round = per_image_rounds(self.round_reporter(callback_on_round, bar), per_image)
                out = self.runner.run(config, labels, sampling=sampling, generator=generator, guidance_scale=scale,
                                      on_round=on_round)
        images = convert(self.vq.decode(out.tokens), output_type)  # stats time token generation only
        return ImageGenerationOutput(images=images, tokens=out.tokens, class_labels=labels, method=method,
                                     model=self.model_name, stats=out.stats,
                                     settings=config.settings(self.drafter is not None))


def check_batch_size(batch_size: Any, method: str, callback_on_round: Any) -> int:
    """`batch_size` as given, refused in one line where a batch cannot decode."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise MMSpecError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if batch_size > 1 and method != "ar":
        raise MMSpecError(f"method {method!r} drafts one image at a time; batch_size > 1 decodes method 'ar' only")
    if batch_size > 1 and callback_on_round is not None:
        raise MMSpecError("callback_on_round follows one image at a time; use batch_size=1")
    return batch_size


ImagePipeline = SpeculativeImagePipeline  # `from mmspec import ImagePipeline`
