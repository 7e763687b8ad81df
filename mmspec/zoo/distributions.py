"""Which distribution ships which zoo model, and where the installed ones are.

The mmspec wheel holds code only. The toy models ship in zoo distributions, each built from this
repository by `zoo/<group>/pyproject.toml` out of the same `mmspec/zoo/models/<name>` folders a source
checkout reads, and installing a package `mmspec_zoo_<group>` whose `models/` folder holds them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..errors import MMSpecError


@dataclass(frozen=True)
class ZooDistribution:
    name: str  # what pip installs: "mmspec-zoo-vision"
    package: str  # what it installs: "mmspec_zoo_vision", with the models in its `models/` folder
    models: tuple[str, ...]

    @property
    def source(self) -> str:
        """Its project folder in a clone of mmspec (`pip install ./zoo/vision`)."""
        return f"zoo/{self.name.removeprefix('mmspec-zoo-')}"


# Grouped by modality; each wheel stays under the 100 MB a package index accepts for one file. A model that is
# a part of another (its card's `derived_from`) ships beside it.
DISTRIBUTIONS = (
    ZooDistribution("mmspec-zoo-vision", "mmspec_zoo_vision", (
        "shapes-caption-drafter", "shapes-caption-lm", "shapes-video-captioner", "shapes-video-captioner-long")),
    ZooDistribution("mmspec-zoo-image", "mmspec_zoo_image", ("shapes-image-ar", "shapes-mar", "shapes-var")),
    ZooDistribution("mmspec-zoo-speech", "mmspec_zoo_speech", ("whisper-tiny.en",)),
)


def installed_model_dirs() -> list[Path]:
    """The `models/` folders of the zoo distributions installed in this environment."""
    found = []
    for distribution in DISTRIBUTIONS:
        spec = importlib.util.find_spec(distribution.package)
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            models = Path(location) / "models"
            if models.is_dir():
                found.append(models)
    return found


def distribution_of(model: str) -> ZooDistribution | None:
    return next((d for d in DISTRIBUTIONS if model in d.models), None)


def not_installed(model: str, role: str = "model") -> MMSpecError | None:
    """The one-line error for a zoo model whose distribution is not installed (None for a name no zoo
    distribution ships); `role` says what it was to be ("captioner", "drafter")."""
    distribution = distribution_of(model)
    if distribution is None:
        return None
    return MMSpecError(f"cannot load the {role} {model!r}: it is a zoo model of the package {distribution.name}, which "
                       f"is not installed: pip install {distribution.name} (in a clone of mmspec: pip install "
                       f"./{distribution.source})")
