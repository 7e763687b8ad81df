"""A diffusers pipeline for class-conditional MAR (masked autoregression over continuous tokens) with CSpD.

    pipe = MARPipeline(model=target_mar, vae=autoencoder_kl, draft=small_mar, class_names=[...])
    out = pipe(prompt="red circle", method="cspd", num_iter=16, generator=torch.Generator().manual_seed(0))
    out.images[0].save("x.png"); out.stats.target_forwards, out.stats.alpha

Methods:
    ar    the target MAR alone: `num_iter` steps of MAR's random order and cosine schedule, one forward each
    cspd  continuous speculative decoding (`image_ar.cspd`): the target pre-fills the first steps, the
          draft MAR runs `num_draft` steps at a time and the target verifies each window in one forward
          (accept with min(1, p/q), redraw rejected tokens from the residual). For a diffusion head the
          densities are an approximation, so the output is close to, not provably equal to, the target's
          law; with draft == target, num_draft 1 and no pre-fill it is the `ar` output of the same seed.

A `SpeculativePipeline` (mmspec.pipelines, on diffusers' `DiffusionPipeline`): the target `model`, the
optional `draft` (both `MAR`, diffusers `ModelMixin`) and the `vae` (diffusers `AutoencoderKL`; tokens
are its latents times `scaling_factor`) are components; `class_names` and `card` (num_iter, num_draft,
prefill_ratio, cfg, default_method) are settings in `model_index.json`. `save_pretrained(folder)` writes
model_index.json + model/, vae/, draft/; `from_pretrained(folder)` reads them back.

Output: an `ImageGenerationOutput` whose `tokens` are the continuous tokens [N, L, C]. Stats (a
`StepStats`): `target_forwards`, `drafter_forwards` (draft MAR forwards), `drafted` / `accepted` (window
tokens drafted and kept), `new_tokens` (tokens of every image), `schedule` (tokens unknown after each
target step), and for cspd `prefill_steps`, `windows` (one `WindowRecord` per verified window) and
`residual_fallbacks`.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import torch
from diffusers import AutoencoderKL

from mmspec.devices import synchronize
from mmspec.errors import MMSpecError
from mmspec.pipelines import SpeculativePipeline, resolve_dtype

from .cspd import cspd_generate
from .imaging import convert
from .mar import MAR
from .masked_decode import target_generate
from .pipeline_common import ClassConditionalMixin, ImageGenerationOutput, check_class_count, check_output_type

MAR_METHODS = ("ar", "cspd")
DEFAULT_NUM_ITER = 64  # the official sampler's steps (256 tokens); fewer tokens cap it at the token count
DEFAULT_NUM_DRAFT = 8  # the official CSpD runner's window
DEFAULT_PREFILL_RATIO = 0.15


class MARPipeline(ClassConditionalMixin, SpeculativePipeline):
    """Class-conditional image generation by MAR, alone or with continuous speculative decoding.

    Args:
        model: the target `MAR`.
        vae: the `AutoencoderKL` whose latents (times its scaling_factor) the MAR generates.
        draft: optional smaller `MAR` making the same tokens with the same diffusion steps (method cspd).
        class_names: optional class names in id order (for `prompt=`).
        model_name: shown in outputs.
        card: settings (num_iter, num_draft, prefill_ratio, cfg, default_method), if any.
    """

    conditioning = "class"
    family = "mar"
    speculative_method = "cspd"
    speculative_needs = ("a draft: a smaller MAR making the same tokens with the same diffusion steps "
                         "(a draft/ folder, or draft=...)")
    _optional_components = ["draft"]

    def __init__(self, model: MAR, vae: AutoencoderKL, draft: MAR | None = None,
                 class_names: Sequence[str] | None = None, model_name: str = "",
                 card: dict[str, Any] | None = None) -> None:
        if vae.config.latent_channels != model.config.vae_embed_dim:
            raise MMSpecError(f"the VAE has {vae.config.latent_channels} latent channels, the MAR expects "
                              f"{model.config.vae_embed_dim}")
        if draft is not None and (draft.seq_len, draft.token_embed_dim) != (model.seq_len, model.token_embed_dim):
            raise MMSpecError(f"the draft makes {draft.seq_len} x {draft.token_embed_dim} tokens, the model "
                              f"{model.seq_len} x {model.token_embed_dim}")
        if draft is not None and draft.denoising_timesteps != model.denoising_timesteps:
            raise MMSpecError("the draft's diffusion head denoises on other timesteps than the model's (set the same "
                              "num_sampling_steps and timestep_spacing): cspd's shared noise could not align them")
        check_class_count(model.config.class_num, class_names, "draft", None if draft is None else draft.config.class_num)
        super().__init__()
        self._register_parts(class_names, card, model_name or type(model).__name__, model=model.eval(), vae=vae.eval(),
                             draft=draft.eval() if draft is not None else None)

    # --- loading --------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, model_id_or_path: str | os.PathLike, draft: Any = None,
                        device: str | torch.device = "cpu", dtype: torch.dtype | str | None = None, *,
                        torch_dtype: torch.dtype | str | None = None) -> "MARPipeline":
        """Load a folder written by `save_pretrained` (model_index.json + model/, vae/, optional draft/).

        `draft`: None = the folder's draft/ if present; False = none; a folder or a `MAR`.
        `dtype` (or `torch_dtype`) defaults to float32.
        """
        return cls._load_saved_parts(model_id_or_path, device, resolve_dtype(dtype, torch_dtype),
                                     {"model": (MAR, "MAR"), "vae": (AutoencoderKL, "VAE")},
                                     ("draft", MAR, "draft MAR", draft),
                                     "{name!r} is not a folder saved by MARPipeline.save_pretrained "
                                     "(model_index.json with model/, vae/ and optionally draft/)")

    # --- methods --------------------------------------------------------------------------------

    @property
    def num_classes(self) -> int:
        return int(self.model.config.class_num)

    def settings_for(self, method: str, num_iter: int | None, num_draft: int | None, prefill_ratio: float | None,
                     guidance_scale: float | None, temperature: float, inner_temperature: float) -> dict[str, Any]:
        """The call's settings (the caller's, else the card's, else the official defaults), checked."""
        if method != "cspd":
            given = [n for n, v in (("num_draft", num_draft), ("prefill_ratio", prefill_ratio)) if v is not None]
            if given or inner_temperature != 1.0:
                flags = ", ".join(given + (["inner_temperature"] if inner_temperature != 1.0 else []))
                raise MMSpecError(f"{flags}: settings of method 'cspd', not {method!r}")
        seq_len = self.model.seq_len
        steps = num_iter if num_iter is not None else int(self.card.get("num_iter", min(DEFAULT_NUM_ITER, seq_len)))
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= seq_len:
            raise MMSpecError(f"num_iter must be an integer in 1..{seq_len} (the token count), got {steps!r}")
        cfg = guidance_scale if guidance_scale is not None else float(self.card.get("cfg", 1.0))
        for name, value, low in (("guidance_scale", cfg, 1.0), ("temperature", temperature, 0.0),
                                 ("inner_temperature", inner_temperature, 0.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < float("inf") \
                    or (low == 0.0 and value == 0):
                bound = ">= 1 (1 = no guidance)" if low else "> 0 (MAR's diffusion head has no greedy mode)"
                raise MMSpecError(f"{name} must be a finite number {bound}, got {value!r}")
        settings = {"num_iter": steps, "cfg": float(cfg), "temperature": float(temperature)}
        if method == "cspd":
            window = num_draft if num_draft is not None else int(self.card.get("num_draft", DEFAULT_NUM_DRAFT))
            if isinstance(window, bool) or not isinstance(window, int) or window < 1:
                raise MMSpecError(f"num_draft must be an integer >= 1, got {window!r}")
            ratio = prefill_ratio if prefill_ratio is not None else float(self.card.get("prefill_ratio",
                                                                                         DEFAULT_PREFILL_RATIO))
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
                raise MMSpecError(f"prefill_ratio must be in [0, 1), got {ratio!r}")
            settings.update(num_draft=window, prefill_ratio=float(ratio), inner_temperature=float(inner_temperature))
        return settings

    @torch.inference_mode()
    def __call__(
        self,
        class_labels: int | Sequence[int] | torch.Tensor | None = None,
        prompt: str | Sequence[str] | None = None,
        *,
        method: str | None = None,
        num_iter: int | None = None,
        num_draft: int | None = None,
        prefill_ratio: float | None = None,
        guidance_scale: float | None = None,
        cfg_schedule: str = "linear",
        temperature: float = 1.0,
        inner_temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        num_images: int = 1,
        output_type: str = "pil",
        progress_bar: bool = True,
    ) -> ImageGenerationOutput:
        """Generate `num_images` images per class label (or class-name prompt), all in one batch.

        num_iter: steps of the cosine schedule (default: the card's, else min(64, tokens)).
        guidance_scale: MAR's CFG (>= 1; 1 = none), ramped by `cfg_schedule` ("linear" or "constant").
        temperature: of the diffusion head (> 0). cspd only: num_draft (draft steps per verification,
        default the card's, else 8), prefill_ratio (share of steps the target runs first, default 0.15),
        inner_temperature (exponent scale of the acceptance ratio; 1 = the paper's, exact).
        `generator`: a `torch.Generator` (a CPU one works with a model on any device); `seed`: an int instead.
        """
        check_output_type(output_type)
        if top_k is not None:
            raise MMSpecError("top_k does not apply to MAR: its tokens are continuous (sampled by a diffusion head)")
        method = self.check_method(method)
        settings = self.settings_for(method, num_iter, num_draft, prefill_ratio, guidance_scale, temperature,
                                     inner_temperature)
        labels = self.resolve_labels(class_labels, prompt, num_images)
        generator = self.generator_for(generator, seed)
        label_tensor = torch.tensor(labels, device=self.device)
        common = dict(num_iter=settings["num_iter"], cfg=settings["cfg"], cfg_schedule=cfg_schedule,
                      temperature=settings["temperature"], generator=generator)
        with self.progress_bar(total=settings["num_iter"], desc=f"image ({method})", unit="step",
                               enabled=progress_bar) as bar:
            on_step = lambda left: bar.update(1)  # noqa: E731
            synchronize(self.device)  # on a GPU the timing covers the queued work
            start = time.perf_counter()
            if method == "cspd":
                out = cspd_generate(self.draft, self.model, len(labels), labels=label_tensor,
                                    num_draft=settings["num_draft"], prefill_ratio=settings["prefill_ratio"],
                                    inner_temperature=settings["inner_temperature"], on_step=on_step, **common)
                tokens, stats = out.tokens, out.stats
            else:
                tokens, stats = target_generate(self.model, len(labels), labels=label_tensor, on_step=on_step, **common)
            stats.method = method
            synchronize(self.device)
            stats.total_time = time.perf_counter() - start
        latents = self.model.unpatchify(tokens) / self.vae.config.scaling_factor  # stats time token generation only
        pixels = self.vae.decode(latents.to(self.vae.device, self.vae.dtype)).sample
        return ImageGenerationOutput(images=convert(pixels, output_type), method=method, model=self.model_name,
                                     stats=stats, tokens=tokens, class_labels=labels, settings=settings)
