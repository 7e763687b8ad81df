"""A diffusers pipeline for class-conditional VAR (next-scale prediction) with CoDe.

    pipe = VARPipeline.from_pretrained("shapes-var")                  # zoo name or a saved folder
    out = pipe(prompt="red circle", method="code", draft_scales=5, generator=torch.Generator().manual_seed(0))
    out.images[0].save("x.png"); out.stats.target_forwards

Methods:
    ar    the large VAR alone, one forward per scale (KV-cached), classifier-free guidance ramped over scales
    code  CoDe (Chen et al. 2024): the large VAR drafts scales 1..N (`draft_scales`), the small refiner VAR
          reads them in one block-causal prefill and generates the remaining scales (`image_ar.code`).
          Not lossless: the last scales follow the refiner. CoDe's specialised mode fine-tunes a refiner for one
          split; a pipeline holding such refiners (`fine_tuned_refiners`, saved as refiner-N/) runs the one made
          for the asked `draft_scales`, and the plain `refiner` at every other split.

A `SpeculativePipeline` (mmspec.pipelines, on diffusers' `DiffusionPipeline`): the large VAR `model`,
its VQ-VAE `vq` and the optional `refiner` are diffusers `ModelMixin` / `ConfigMixin` components
(`.to()`, `.device`, `.dtype`, `pipe.components`); `class_names` and `card` are settings in
`model_index.json`. `save_pretrained(folder)` writes model_index.json + model/, vq/, refiner/ (+ refiner-N/);
`from_pretrained(folder or zoo name)` reads them back (weights stored in fp16 load as float32 unless
`dtype=` says otherwise).

Output: an `ImageGenerationOutput`; its `tokens` are every scale's token map in scale order, [N, sum of pn^2]
(`out.stats.scales` gives each scale's side). Stats (a `ScaleStats`): `target_forwards` = forwards of the
large model, `drafter_forwards` = forwards of the small refiner (CoDe's paper calls the large model the
drafter; here the large model is the reference every method is compared with), `new_tokens` = tokens of
every scale of every image, `draft_scales` = CoDe's split, `scales` = one `ScaleRecord` per scale (who made it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from mmspec.devices import synchronize
from mmspec.errors import MMSpecError
from mmspec.pipelines import SpeculativePipeline, resolve_dtype

from .code import check_draft_steps, code_generate, scale_records
from .image_stats import ScaleStats
from .imaging import convert
from .pipeline_common import (
    ClassConditionalMixin,
    ImageGenerationOutput,
    check_class_count,
    check_output_type,
    load_component,
)
from .var import VAR, VARSampling
from .var_vq import VQVAE

DEFAULT_VAR_MODEL = "shapes-var"
DEFAULT_CFG = 1.5  # VAR's official guidance (the ramp's end value) when the card states none
VAR_METHODS = ("ar", "code")


def fine_tuned_folder(draft_scales: int) -> str:
    """The subfolder of a saved pipeline holding the refiner fine-tuned for `draft_scales`."""
    return f"refiner-{int(draft_scales)}"


class VARPipeline(ClassConditionalMixin, SpeculativePipeline):
    """Class-conditional image generation by next-scale prediction (VAR), alone or with CoDe.

    Args:
        model: the large `VAR` (method "ar"; CoDe's first scales).
        vq: its `VQVAE` (same vocabulary, Cvae and scales).
        refiner: optional small `VAR` on the same VQ-VAE and classes (CoDe's last scales).
        class_names: optional class names in id order (for `prompt=`).
        model_name: shown in outputs.
        card: zoo card (default_method, draft_scales, cfg, top_k, top_p), if any.
        fine_tuned_refiners: optional {draft_scales: small VAR} fine-tuned for that split (CoDe's specialised
            refiners); listed in the card as `fine_tuned_refiners` and saved as refiner-N/.
    """

    conditioning = "class"
    family = "var"
    speculative_method = "code"
    speculative_needs = "a refiner: a small VAR on the same VQ-VAE and classes (a refiner/ folder, or refiner=...)"
    _optional_components = ["refiner"]

    def __init__(self, model: VAR, vq: VQVAE, refiner: VAR | None = None, class_names: Sequence[str] | None = None,
                 model_name: str = "", card: dict[str, Any] | None = None,
                 fine_tuned_refiners: dict[int, VAR] | None = None) -> None:
        model.check_vq(vq)
        if refiner is not None:
            refiner.check_vq(vq)
        check_class_count(model.num_classes, class_names, "refiner", None if refiner is None else refiner.num_classes)
        super().__init__()
        self._register_parts(class_names, card, model_name or type(model).__name__, model=model.eval(), vq=vq.eval(),
                             refiner=refiner.eval() if refiner is not None else None)
        self.fine_tuned_refiners: dict[int, VAR] = {}
        self.refiner_name = "refiner"  # shown in the outputs' settings: the folder it came from, when given as one
        if fine_tuned_refiners is not None:  # None: diffusers' loader builds the pipeline; from_pretrained adds them
            self.set_fine_tuned_refiners(fine_tuned_refiners)

    # --- loading --------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, model_id_or_path: str | os.PathLike = DEFAULT_VAR_MODEL, refiner: Any = None,
                        device: str | torch.device = "cpu", dtype: torch.dtype | str | None = None, *,
                        torch_dtype: torch.dtype | str | None = None) -> "VARPipeline":
        """Load a saved pipeline folder or zoo name (model_index.json + model/, vq/, optional refiner/).

        `refiner`: None = the folder's refiner/ if present, plus the fine-tuned refiners its card lists (refiner-N/,
        each run at draft_scales N: the zoo's `shapes-var` ships refiner-6 and refiner-4); False = none; a folder, a
        subfolder's name ("refiner-6") or a `VAR` = that refiner at every split. `dtype` (or `torch_dtype`) defaults
        to float32.
        """
        dtype = resolve_dtype(dtype, torch_dtype)
        pipe = cls._load_saved_parts(model_id_or_path, device, dtype, {"model": (VAR, "VAR"), "vq": (VQVAE, "VQ-VAE")},
                                     ("refiner", VAR, "refiner VAR", refiner),
                                     "{name!r} is not a zoo VAR model or a folder saved by VARPipeline.save_pretrained "
                                     "(model_index.json with model/, vq/ and optionally refiner/)")
        if isinstance(refiner, (str, os.PathLike)):
            pipe.refiner_name = Path(str(refiner)).name
        listed = pipe.card.get("fine_tuned_refiners", []) if refiner is None else []
        pipe.set_fine_tuned_refiners({int(n): load_component(VAR, pipe.folder, fine_tuned_folder(n), "fine-tuned refiner",
                                                             dtype) for n in listed})
        return pipe

    def set_fine_tuned_refiners(self, refiners: dict[int, VAR]) -> None:
        """CoDe's specialised refiners, {draft_scales N: small VAR fine-tuned on scales N..}: a CoDe call at N runs
        its own instead of `refiner`. They move with `.to()`, are saved as refiner-N/ and listed in the card."""
        for n, refiner in refiners.items():
            self.check_draft_scales("code", n)
            refiner.check_vq(self.vq)
            check_class_count(self.num_classes, None, f"fine-tuned refiner for draft_scales {n}", refiner.num_classes)
        self.fine_tuned_refiners = {int(n): r.eval().to(self.model.device) for n, r in sorted(refiners.items())}
        listed = sorted(self.fine_tuned_refiners, reverse=True)
        if listed or "fine_tuned_refiners" in self.card:
            self.card["fine_tuned_refiners"] = listed  # the card says what save_pretrained writes
            self.register_to_config(card=self.card)

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        return {fine_tuned_folder(n): refiner for n, refiner in self.fine_tuned_refiners.items()}

    def refiner_for(self, draft_scales: int) -> tuple[VAR | None, str]:
        """The refiner CoDe runs after `draft_scales` large-model scales, and its folder's name: the one fine-tuned for
        that split if the pipeline holds it, else `refiner`."""
        if draft_scales in self.fine_tuned_refiners:
            return self.fine_tuned_refiners[draft_scales], fine_tuned_folder(draft_scales)
        return self.refiner, self.refiner_name

    # --- methods --------------------------------------------------------------------------------

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    @property
    def num_scales(self) -> int:
        return len(self.model.patch_nums)

    @property
    def default_draft_scales(self) -> int:
        """The card's, else all but the last two scales (CoDe's default N = 8 of 10, scaled)."""
        return int(self.card.get("draft_scales", max(1, self.num_scales - 2)))

    @property
    def default_guidance_scale(self) -> float:
        return float(self.card.get("cfg", DEFAULT_CFG))

    def check_draft_scales(self, method: str, draft_scales: int | None) -> int | None:
        if method != "code":
            if draft_scales is not None:
                raise MMSpecError(f"draft_scales applies to method 'code' only, not {method!r}")
            return None
        n = self.default_draft_scales if draft_scales is None else draft_scales
        try:
            check_draft_steps(n, self.num_scales)
        except MMSpecError:
            raise MMSpecError(f"draft_scales must be an integer in 1..{self.num_scales - 1} (the large model drafts that "
                              f"many of the {self.num_scales} scales, the refiner the rest), got {n!r}") from None
        return n

    def filters(self, top_k: int | None, top_p: float | None) -> tuple[int | None, float | None]:
        """(top_k, top_p) to sample with: the given ones, else the card's (CoDe's sampler filters every scale), else
        none. top_k 0 and top_p 1.0 turn a filter off."""
        return (self.card.get("top_k") if top_k is None else top_k, self.card.get("top_p") if top_p is None else top_p)

    @staticmethod
    def sampling_for(guidance_scale: float, temperature: float | Sequence[float], top_k: int | None,
                     top_p: float | None) -> VARSampling:
        """`temperature`: one value (0 = argmax at every scale) or a list of one value > 0 per scale, as CoDe's
        sampler ([1.1] * 7 + [1.0] * 3 on 10 scales; the model checks the count)."""
        per_scale = isinstance(temperature, (list, tuple))
        for name, value in (("guidance_scale", guidance_scale), ("temperature", 1.0 if per_scale else temperature)):
            if not _finite_at_least_zero(value):
                raise MMSpecError(f"{name} must be a finite number >= 0, got {value!r}")
        if per_scale and not (temperature and all(_finite_at_least_zero(t) and t > 0 for t in temperature)):
            raise MMSpecError(f"per-scale temperatures must be finite numbers > 0, got {list(temperature)!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
            raise MMSpecError(f"top_k must be an integer >= 0 (0 = no top-k filter), got {top_k!r}")
        if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
            raise MMSpecError(f"top_p must be in (0, 1] (1 = no top-p filter), got {top_p!r}")
        return VARSampling(cfg=float(guidance_scale), top_k=top_k or 0, top_p=0.0 if top_p in (None, 1) else float(top_p),
                           temperature=[float(t) for t in temperature] if per_scale else float(temperature) or 1.0,
                           do_sample=per_scale or temperature > 0)

    @torch.inference_mode()
    def __call__(
        self,
        class_labels: int | Sequence[int] | torch.Tensor | None = None,
        prompt: str | Sequence[str] | None = None,
        *,
        method: str | None = None,
        draft_scales: int | None = None,
        guidance_scale: float | None = None,
        temperature: float | Sequence[float] = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        num_images: int = 1,
        output_type: str = "pil",
        progress_bar: bool = True,
    ) -> ImageGenerationOutput:
        """Generate `num_images` images per class label (or class-name prompt), all in one batch.

        guidance_scale: VAR's CFG, ramped linearly from 0 at the first scale to this value at the last
        (0 = none; default: the card's, else 1.5). temperature 0 = argmax at every scale; a list gives one per scale
        (CoDe's sampler: [1.1] * 7 + [1.0] * 3 on 10 scales). top_k / top_p: filters
        on every scale's distribution (default: the card's, else none; 0 / 1.0 = off). draft_scales
        (method "code"): scales the large model runs, 1..scales-1 (default: the card's, else scales - 2).
        `generator`: a `torch.Generator` (a CPU one works with a model on any device); `seed`: an int instead.
        """
        check_output_type(output_type)
        method = self.check_method(method)
        n = self.check_draft_scales(method, draft_scales)
        labels = self.resolve_labels(class_labels, prompt, num_images)
        scale = self.default_guidance_scale if guidance_scale is None else guidance_scale
        top_k, top_p = self.filters(top_k, top_p)
        sampling = self.sampling_for(scale, temperature, top_k, top_p)
        generator = self.generator_for(generator, seed, needed=sampling.do_sample)
        with self.progress_bar(total=self.num_scales, desc=f"image ({method})", unit="scale", enabled=progress_bar) as bar:
            on_scale = lambda si, name: bar.update(1)  # noqa: E731
            synchronize(self.device)  # on a GPU the timing covers the queued work
            start = time.perf_counter()
            if method == "code":
                refiner, refiner_name = self.refiner_for(n)
                out = code_generate(self.model, refiner, self.vq, labels, n, sampling, generator, decode=False,
                                    on_scale=on_scale)
                token_maps, f_hat, stats = out.token_maps, out.f_hat, out.stats
            else:
                refiner_name = None
                state = self.model.begin(labels)
                self.model.run_scales(state, self.vq, 0, self.num_scales, sampling, generator, name="model",
                                      on_scale=on_scale)
                token_maps, f_hat = state.token_maps, state.f_hat
                stats = ScaleStats(method=method, target_forwards=state.forwards["model"],
                                   new_tokens=sum(int(t.numel()) for t in token_maps),
                                   scales=scale_records(self.model.patch_nums, token_maps, None))
            synchronize(self.device)
            stats.total_time = time.perf_counter() - start
        pixels = self.vq.fhat_to_img(f_hat.to(self.vq.device, self.vq.dtype))  # stats time token generation only
        settings = {"draft_scales": n, "refiner": refiner_name, "scales": self.num_scales, "cfg": sampling.cfg,
                    "temperature": list(temperature) if isinstance(temperature, (list, tuple)) else temperature,
                    "top_k": top_k, "top_p": top_p}
        return ImageGenerationOutput(images=convert(pixels, output_type), method=method, model=self.model_name,
                                     stats=stats, tokens=torch.cat(list(token_maps), dim=1), class_labels=labels,
                                     settings=settings)


def _finite_at_least_zero(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value < float("inf")
