"""The quality judge of generated images: a small timm classifier and two numbers from it.

The zoo's judge (`shapes-image-ar/judge/`) is a timm ResNet trained here to tell the 24 classes of
the shapes world (shape kind x colour) apart. It measures what the project asks of relaxed methods
(LANTERN, GSD): quality against plain AR sampling, with

- **class accuracy**: the share of generated images the judge assigns to the class they were
  asked for (a conditional-fidelity score, like the classification accuracy used for
  class-conditional ImageNet models);
- **Fréchet distance** between two image sets, FID-style (Heusel et al. 2017, "GANs trained by a
  two time-scale update rule converge to a local Nash equilibrium") but on the judge's penultimate
  features (global-average-pooled, before the classifier) instead of Inception's:

      FD = ||mu_a - mu_b||^2 + tr(S_a) + tr(S_b) - 2 tr((S_a^1/2 S_b S_a^1/2)^1/2)

  The last trace equals tr sqrtm(S_a S_b) and is computed from the eigenvalues of the symmetric
  PSD matrix S_a^1/2 S_b S_a^1/2 with numpy alone (no scipy at run time). Like FID it is biased
  upwards for small sets: compare methods at the same number of images, and read it against the
  distance between two real sets of that size (the noise floor the zoo card reports).

Images may be given as
- torch float [B, 3, H, W] in [-1, 1] (what `VQModel.decode` returns),
- torch uint8 [B, 3, H, W],
- numpy uint8 [B, H, W, 3], or numpy float [B, H, W, 3] in [0, 1] (diffusers' `output_type="np"`),
- a PIL image or a list of PIL images.
They must have the judge's size (64 x 64 for the zoo): a judge only means something at the size it
was trained at, so other sizes are an error rather than silently resized.

Use `class_accuracy(images, labels)` and `frechet_distance(images_a, images_b)` (the zoo's judge by
default, loaded once; pass `judge=` a folder, a zoo name or an `ImageJudge`), or hold an
`ImageJudge` from `load_judge(...)`; `frechet_distance_of_features` works on feature arrays.

The judge is saved with timm's `save_for_hf` (config.json + model.safetensors, `label_names` and the
input normalisation in the config) and loaded with `timm.create_model("local-dir:...")`.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from mmspec.errors import MMSpecError
from mmspec.optional import require

Images = Any  # see the module docstring for the accepted forms
DEFAULT_JUDGE = "shapes-image-ar"  # the zoo model whose judge/ folder is used when none is named


def as_unit_tensor(images: Images) -> torch.Tensor:
    """Any accepted image form -> float [B, 3, H, W] in [0, 1]."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - PIL is a dependency
        Image = None
    if Image is not None and isinstance(images, Image.Image):
        images = [images]
    if isinstance(images, (list, tuple)):
        if not images:
            raise MMSpecError("no images given")
        images = np.stack([np.asarray(im.convert("RGB") if Image and isinstance(im, Image.Image) else im) for im in images])
    if isinstance(images, np.ndarray):
        if images.ndim != 4 or images.shape[-1] != 3:
            raise MMSpecError(f"numpy images must be [B, H, W, 3], got shape {images.shape}")
        tensor = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)
        return tensor.float() / 255.0 if tensor.dtype == torch.uint8 else tensor.float().clamp(0, 1)
    if isinstance(images, torch.Tensor):
        if images.dim() != 4 or images.shape[1] != 3:
            raise MMSpecError(f"image tensors must be [B, 3, H, W], got shape {tuple(images.shape)}")
        if images.dtype == torch.uint8:
            return images.float() / 255.0
        return (images.detach().float().clamp(-1, 1) + 1) / 2
    raise MMSpecError(f"cannot read images of type {type(images).__name__}")


def frechet_distance_of_features(features_a: np.ndarray, features_b: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to two feature sets [N_a, F] and [N_b, F]."""
    a, b = np.asarray(features_a, dtype=np.float64), np.asarray(features_b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise MMSpecError(f"feature sets must be [N, F] with the same F, got {a.shape} and {b.shape}")
    if len(a) < 2 or len(b) < 2:
        raise MMSpecError("a Fréchet distance needs at least 2 images in each set")
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root_a = _sqrt_psd(cov_a)
    middle = root_a @ cov_b @ root_a
    eigenvalues = np.linalg.eigvalsh((middle + middle.T) / 2)
    trace_sqrt = np.sqrt(np.clip(eigenvalues, 0, None)).sum()
    diff = mu_a - mu_b
    value = diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2 * trace_sqrt
    return float(max(value, 0.0))  # rounding can push an exact 0 slightly below


def _sqrt_psd(matrix: np.ndarray) -> np.ndarray:
    """Symmetric square root of a covariance matrix (negative rounding noise clipped)."""
    w, v = np.linalg.eigh((matrix + matrix.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


class ImageJudge:
    """A timm classifier seen as a judge: `class_accuracy`, `features`, `frechet_distance`."""

    def __init__(self, model: torch.nn.Module, class_names: Sequence[str] | None = None, batch_size: int = 256) -> None:
        self.model = model.eval()
        cfg = getattr(model, "pretrained_cfg", {}) or {}
        self.image_size = tuple(cfg.get("input_size", (3, 64, 64))[1:])
        self.mean = torch.tensor(cfg.get("mean", (0.5, 0.5, 0.5)), dtype=torch.float32, device="cpu").view(1, 3, 1, 1)
        self.std = torch.tensor(cfg.get("std", (0.5, 0.5, 0.5)), dtype=torch.float32, device="cpu").view(1, 3, 1, 1)
        names = class_names if class_names is not None else cfg.get("label_names")
        self.class_names = list(names) if names is not None else [str(i) for i in range(model.num_classes)]
        self.batch_size = batch_size

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, **kwargs: Any) -> "ImageJudge":
        return load_judge(name_or_path, **kwargs)

    def _batches(self, images: Images):
        x = as_unit_tensor(images)
        if tuple(x.shape[-2:]) != self.image_size:
            raise MMSpecError(
                f"the judge takes {self.image_size[0]}x{self.image_size[1]} images, got {x.shape[-2]}x{x.shape[-1]}"
            )
        x = (x.cpu() - self.mean) / self.std  # images arrive on the host (PIL / numpy); the judge may live elsewhere
        device = next(self.model.parameters()).device
        for i in range(0, x.shape[0], self.batch_size):
            yield x[i : i + self.batch_size].to(device)

    @torch.no_grad()
    def logits(self, images: Images) -> torch.Tensor:
        """Class logits [B, num_classes]."""
        return torch.cat([self.model(x) for x in self._batches(images)])

    def predict(self, images: Images) -> torch.LongTensor:
        """Predicted class ids [B]."""
        return self.logits(images).argmax(-1).cpu()

    @torch.no_grad()
    def features(self, images: Images) -> np.ndarray:
        """Penultimate features [B, F]: the pooled features the classifier layer reads."""
        out = [self.model.forward_head(self.model.forward_features(x), pre_logits=True) for x in self._batches(images)]
        return torch.cat(out).double().cpu().numpy()

    def class_accuracy(self, images: Images, labels: Sequence[int] | torch.Tensor) -> float:
        """Share of `images` the judge assigns to their intended class `labels`."""
        labels = torch.as_tensor(labels, dtype=torch.long, device="cpu").reshape(-1)
        predicted = self.predict(images)
        if predicted.shape != labels.shape:
            raise MMSpecError(f"{predicted.shape[0]} images but {labels.shape[0]} labels")
        return float((predicted == labels).float().mean())

    def frechet_distance(self, images_a: Images, images_b: Images) -> float:
        """Fréchet distance between the judge's features of two image sets (lower = more alike)."""
        return frechet_distance_of_features(self.features(images_a), self.features(images_b))


def judge_folder(name_or_path: str | os.PathLike) -> Path:
    """A judge folder, a zoo model folder holding `judge/`, or a zoo name (e.g. "shapes-image-ar")."""
    from mmspec.zoo import resolve

    path = Path(resolve(name_or_path))
    if (path / "judge" / "config.json").is_file():
        path = path / "judge"
    if not (path / "config.json").is_file():
        raise MMSpecError(f"no judge in {str(name_or_path)!r}: expected a folder with a timm config.json + model.safetensors")
    return path


def load_judge(name_or_path: str | os.PathLike = DEFAULT_JUDGE, batch_size: int = 256) -> ImageJudge:
    """Load a judge saved with `timm.models.save_for_hf` (fp16 weights are loaded into fp32)."""
    timm = require("timm", "image", "the image judge")

    path = judge_folder(name_or_path)
    try:
        model = timm.create_model(f"local-dir:{path}", pretrained=True)
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        raise MMSpecError(f"cannot load the judge in {path}: {type(error).__name__}: {error}") from None
    return ImageJudge(model.float().eval(), batch_size=batch_size)


@lru_cache(maxsize=4)
def _cached_judge(folder: str, modified: float) -> ImageJudge:
    return load_judge(folder)


def get_judge(judge: "ImageJudge | str | os.PathLike" = DEFAULT_JUDGE) -> ImageJudge:
    """An ImageJudge as is, or the judge of a folder / zoo name, loaded once and kept."""
    if isinstance(judge, ImageJudge):
        return judge
    folder = judge_folder(judge)
    return _cached_judge(str(folder.resolve()), (folder / "config.json").stat().st_mtime)


def class_accuracy(images: Images, labels: Sequence[int] | torch.Tensor,
                   judge: "ImageJudge | str | os.PathLike" = DEFAULT_JUDGE) -> float:
    """Share of `images` that `judge` (default: the zoo's) assigns to their intended class `labels`."""
    return get_judge(judge).class_accuracy(images, labels)


def frechet_distance(images_a: Images, images_b: Images, judge: "ImageJudge | str | os.PathLike" = DEFAULT_JUDGE) -> float:
    """Fréchet distance between two image sets on `judge`'s penultimate features (default: the zoo's judge)."""
    return get_judge(judge).frechet_distance(images_a, images_b)
