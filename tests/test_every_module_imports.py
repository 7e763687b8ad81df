"""Every module of the package imports, recipes and the demo included, so the fast tier touches each one
(modules that only a slow test or a subprocess runs would otherwise break unseen)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import pytest

import mmspec

# `python -m mmspec` runs the CLI when imported; the CLI's own tests cover it.
NOT_IMPORTED = {"mmspec.__main__"}
# Modules that need an optional extra: skipped, not failed, when it is not installed.
EXTRAS = {"mmspec.demo.app": "gradio", "mmspec.demo.bench_tab": "gradio"}


def package_modules() -> list[str]:
    names = {mmspec.__name__}
    for package in ("mmspec", "mmspec.vision", "mmspec.speech", "mmspec.image_ar", "mmspec.kernels"):
        module = importlib.import_module(package)
        names.add(package)
        names.update(info.name for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}."))
    return sorted(names - NOT_IMPORTED)


def test_the_walk_finds_the_adapters_and_the_recipes():
    names = package_modules()
    assert {"mmspec.vision.recipes.measure_pair", "mmspec.speech.recipes.fast_decoder_agreement",
            "mmspec.image_ar.pipeline", "mmspec.cli"} <= set(names)


@pytest.mark.parametrize("name", package_modules())
def test_module_imports(name):
    extra = EXTRAS.get(name)
    if extra is not None and importlib.util.find_spec(extra) is None:
        pytest.skip(f"needs {extra} (an optional extra)")
    importlib.import_module(name)
