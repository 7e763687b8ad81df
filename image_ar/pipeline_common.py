"""What the image pipelines share: their output, checkpoint loading and folder resolution, and the
class-conditional part (class names -> ids, labels, saved folders, default method) of the LlamaGen,
VAR and MAR pipelines.

Kept apart from the pipelines so that the class-conditional pipeline (which hands Janus, VAR and MAR
folders to their pipelines) and those pipelines all import it, and not each other.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from mmspec.class_prompts import class_id_from_prompt
from mmspec.drafters import Drafter
from mmspec.errors import MMSpecError, first_line
from mmspec.pipelines import (
    DrafterFactory,
    ImagePipelineOutput,
    RoundReporter,
    _saved_class_name,
    saved_pipeline_folder,
)
from mmspec.zoo import resolve

from .imaging import OUTPUT_TYPES


@dataclass
class ImageGenerationOutput(ImagePipelineOutput):
    """What every image pipeline returns (LlamaGen, Janus, VAR, MAR, every method): the images (PIL list or float
    array [N, H, W, 3] in [0, 1]), their tokens and how they were made.

    A diffusers `BaseOutput` (mmspec's `ImagePipelineOutput`): `out.images`, `out["images"]` and `out[0]` are the
    images. method, model: see `ImagePipelineOutput`; stats: a `SpecStats` (VAR: a `ScaleStats` with one record
    per scale; MAR: a `StepStats` with the schedule and CSpD's windows); tokens: per image, the token grid [N, h, w]
    (LlamaGen, Janus), every scale's token map in scale order [N, sum of side^2] (VAR) or the continuous tokens
    [N, L, C] (MAR); class_labels: the class id of each image (empty for a text-to-image model); prompts: the text
    prompt of each image (text-to-image models only); settings: the options the method ran with, as resolved
    from the call, the model card and the defaults.
    """

    tokens: torch.Tensor
    class_labels: list[int]
    prompts: list[str] | None = None
    settings: dict[str, Any] | None = None


def per_image_rounds(reporter: RoundReporter, tokens_per_image: int) -> Callable[[torch.Tensor, int, int, torch.Tensor], None]:
    """The core loop's `on_round` hook for a call that makes several images one after the other: each
    round is reported with `chunk` = the image's index in the call (and `position` = where in its grid)."""

    def on_round(tokens: torch.Tensor, drafted: int, accepted: int, proposed: torch.Tensor) -> None:
        reporter.chunk = reporter.new_tokens // tokens_per_image
        reporter(tokens, drafted, accepted, proposed)

    return on_round


def load_model(cls: type, path: str, what: str, subfolder: str = "", dtype: torch.dtype = torch.float32, **kwargs: Any):
    try:
        return cls.from_pretrained(path, subfolder=subfolder, dtype=dtype, **kwargs).eval()
    # A config.json that is JSON but no config (a list, strings for sizes) fails in the config class: TypeError,
    # AttributeError.
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        where = f"{path}/{subfolder}" if subfolder else path
        raise MMSpecError(f"cannot load the {what} from {where!r}: {str(error).splitlines()[0]}") from None


def check_output_type(output_type: str) -> None:
    if output_type not in OUTPUT_TYPES:
        raise MMSpecError(f"output_type must be one of {', '.join(OUTPUT_TYPES)}, got {output_type!r}")


def check_guidance_scale(scale: float) -> float:
    """Classifier-free guidance scale: a finite number >= 1 (1 = no guidance, as in transformers)."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale < 1:
        raise MMSpecError(f"guidance_scale must be a finite number >= 1 (1 = no guidance), got {scale!r}")
    return float(scale)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: not JSON, or not UTF-8
        raise MMSpecError(f"cannot read {path}: {error}") from None


def local_folder(name: str) -> Path:
    """A zoo name, a local folder, or a Hub repo id (downloaded, or from the cache when offline) -> a folder."""
    folder = Path(resolve(name))
    if not folder.is_dir() and name.count("/") == 1 and not name.startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(name))
        except Exception:  # noqa: BLE001 - offline, unknown repo, no access: all mean "not available"
            pass
    if not (folder / "config.json").is_file():
        raise MMSpecError(f"{name!r} is not a zoo model, a folder with a config.json (a LlamaGen or Janus checkpoint), "
                          "or a Hub id available here")
    return folder


def load_component(cls: type, folder: Path, subfolder: str, what: str, dtype: torch.dtype):
    """One diffusers component (`ModelMixin`) of a saved pipeline folder, in eval mode."""
    try:
        return cls.from_pretrained(str(folder), subfolder=subfolder, torch_dtype=dtype).eval()
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise MMSpecError(f"cannot load the {what} from {str(folder / subfolder)!r}: {first_line(error)}") from None


def load_optional_component(cls: type, given: Any, folder: Path, subfolder: str, what: str, dtype: torch.dtype):
    """A pipeline's optional second model (draft, refiner): None = the folder's `subfolder/` if present;
    False = none; a folder, or the name of one inside the pipeline's folder (e.g. "refiner-6") = loaded from it;
    an instance of `cls` = that one."""
    if given is None and (folder / subfolder / "config.json").is_file():
        return load_component(cls, folder, subfolder, what, dtype)
    if given is None or given is False:
        return None
    if not isinstance(given, cls):
        path = Path(str(given))
        if not path.exists() and (folder / path / "config.json").is_file():
            path = folder / path
        return load_component(cls, path.parent, path.name, what, dtype)
    return given


def check_class_count(count: int, class_names: Sequence[str] | None, second: str = "",
                      second_count: int | None = None) -> None:
    """The optional second model (`second`: "draft", "refiner") and the class names agree with the model's
    `count` classes."""
    if second_count is not None and second_count != count:
        raise MMSpecError(f"the {second} has {second_count} classes, the model {count}")
    if class_names is not None and len(class_names) != count:
        raise MMSpecError(f"{len(class_names)} class names for a model with {count} classes")


def check_saved_class(cls: type, folder: Path, name: str) -> None:
    """A folder written by `save_pretrained` of another pipeline class is refused by name."""
    saved = _saved_class_name(folder)
    if saved != cls.__name__:
        raise MMSpecError(f"{name!r} holds a saved {saved or 'unknown pipeline'}, not a {cls.__name__}")


def from_saved_folder(cls: type, folder: Path, name: str, dtype: torch.dtype, device: str | torch.device,
                      **components: Any):
    """A pipeline from a `save_pretrained` folder, its components already loaded (diffusers' loader reads
    `model_index.json`: class names, card), on `device`; `pipe.folder` remembers where it came from."""
    pipe = cls._from_saved(folder, name=name, dtype=dtype, model_name=name, **components)
    pipe.folder = folder
    return pipe.to(device)


class ClassConditionalMixin:
    """What the class-conditional pipelines (LlamaGen, VAR, MAR) share, on top of `SpeculativePipeline`:
    class names -> ids, label resolution, benchmark conditions, the default method and the settings
    every one of them registers.

    A pipeline sets `speculative_method` (its default when it can run, else "ar") and `num_classes`.
    """

    speculative_method = "ar"
    speculative_needs = ""  # what the speculative method needs, in the error while it is missing
    class_names_source = "class names"  # where the names come from, in the error when there are none

    @property
    def num_classes(self) -> int:
        raise NotImplementedError

    def _register_parts(self, class_names: Sequence[str] | None, card: dict[str, Any] | None, model_name: str,
                        **components: Any) -> None:
        """Components, class names and card (settings in model_index.json); the folder is set by from_pretrained."""
        self.register_modules(**components)
        self.class_names = list(class_names) if class_names is not None else None
        self.card = dict(card or {})
        self.register_to_config(class_names=self.class_names, card=self.card)
        self.model_name = model_name
        self.folder: Path | None = None  # set by from_pretrained (the benchmark looks for judge/ there)

    @classmethod
    def _load_saved_parts(cls, model_id_or_path: Any, device: str | torch.device, dtype: torch.dtype,
                          parts: dict[str, tuple[type, str]], optional: tuple[str, type, str, Any], not_saved: str):
        """`from_pretrained` for a pipeline whose components all sit in subfolders of a `save_pretrained`
        folder: `parts` = {subfolder: (class, what)}; `optional` = (subfolder, class, what, given) for the
        draft / refiner (`load_optional_component`); `not_saved`: the error ({name!r} filled in) otherwise."""
        name = str(model_id_or_path)
        folder = cls._saved_folder(name, not_saved.format(name=name))
        components = {sub: load_component(kind, folder, sub, what, dtype) for sub, (kind, what) in parts.items()}
        sub, kind, what, given = optional
        components[sub] = load_optional_component(kind, given, folder, sub, what, dtype)
        return from_saved_folder(cls, folder, name, dtype, device, **components)

    @classmethod
    def _saved_folder(cls, name: str, not_saved: str) -> Path:
        """The folder `save_pretrained` wrote for `name` (a zoo name or a path); `not_saved` is the error otherwise."""
        folder = saved_pipeline_folder(name)
        if folder is None:
            raise MMSpecError(not_saved)
        check_saved_class(cls, folder, name)
        return folder

    def drafter_factories(self) -> dict[str, DrafterFactory | None]:
        """ar always; the speculative method once the optional second model (`_optional_components`: draft,
        refiner) is loaded. VAR's and MAR's methods do not run the core token loop (the pipeline runs its models
        scale by scale or step by step), so none has a core-loop drafter: the factory of an available method
        refuses in one line (`make_drafter`); LlamaGen's and Janus' pipelines override this with real drafters."""
        second = getattr(self, self._optional_components[0])
        return {"ar": self._no_core_drafter("ar"),
                self.speculative_method: self._no_core_drafter(self.speculative_method) if second is not None else None}

    def _no_core_drafter(self, method: str) -> DrafterFactory:
        def refuse() -> Drafter:
            raise MMSpecError(f"{type(self).__name__}'s method {method!r} runs its models itself, not through the core "
                              "decoding loop: it has no drafter to make; call the pipeline instead")

        return refuse

    def unavailable_reason(self, method: str) -> str:
        return f"method {method!r} needs {self.speculative_needs}"

    @property
    def default_method(self) -> str:
        """The zoo card's choice if available, else the pipeline's speculative method if it can run, else ar."""
        chosen = self.card.get("default_method")
        available = self.available_methods
        preferred = self.speculative_method
        return chosen if chosen in available else (preferred if preferred in available else "ar")

    def class_id(self, name: str) -> int:
        """A prompt -> its class id: a class name (case and spacing ignored), else free text holding the words of
        exactly one class name in any order ("a big red ball" -> "red circle"), after the model card's
        `class_synonyms` ({"ball": "circle", ...}) are applied to the prompt's words."""
        if self.class_names is None:
            raise MMSpecError(f"{self.model_name!r} has no {self.class_names_source}, so prompts cannot be read; "
                              "pass class_labels")
        return class_id_from_prompt(name, self.class_names, self.card.get("class_synonyms", {}))

    def check_num_images(self, num_images: int) -> None:
        if isinstance(num_images, bool) or not isinstance(num_images, int) or num_images < 1:
            raise MMSpecError(f"num_images must be an integer >= 1, got {num_images!r}")

    def resolve_labels(self, class_labels: int | Sequence[int] | torch.Tensor | None, prompt: str | Sequence[str] | None,
                       num_images: int) -> list[int]:
        """Class ids (or class-name prompts) -> one label per image, each repeated `num_images` times.
        Class names given as `class_labels` (`pipe("red circle")`) are taken as the prompt."""
        if prompt is None and (isinstance(class_labels, str) or (isinstance(class_labels, (list, tuple)) and class_labels
                                                                 and all(isinstance(c, str) for c in class_labels))):
            class_labels, prompt = None, class_labels
        if (class_labels is None) == (prompt is None):
            raise MMSpecError("pass exactly one of class_labels=... (ids) or prompt=... (class names)")
        self.check_num_images(num_images)
        if prompt is not None:
            labels = [self.class_id(p) for p in ([prompt] if isinstance(prompt, str) else prompt)]
        else:
            try:
                labels = torch.as_tensor(class_labels, device="cpu").reshape(-1).tolist()  # host ints
            except (TypeError, ValueError, RuntimeError):
                raise MMSpecError(f"class_labels must be class ids (integers) or class names, got {class_labels!r}") from None
        if not labels:
            raise MMSpecError("no class label or prompt given")
        count = self.num_classes
        bad = [label for label in labels if not (isinstance(label, int) and 0 <= label < count)]
        if bad:
            raise MMSpecError(f"class labels must be integers in [0, {count}), got {bad}")
        return [label for label in labels for _ in range(num_images)]

    def bench_conditions(self, n: int, prompts: Sequence[str] | None = None) -> list[int]:
        """Class labels for n benchmark images, cycling through `prompts` (class names) or all classes."""
        ids = [self.class_id(p) for p in prompts] if prompts else list(range(self.num_classes))
        return [ids[i % len(ids)] for i in range(n)]
