"""What the distributions declare: ranges not pins, extras that hold what the code asks for, a code-only
mmspec wheel, and zoo distributions that ship every zoo model once (.ci/check-wheels builds and runs them)."""

import ast
import re
import sys
from pathlib import Path

import pytest

from mmspec.optional import pip_name
from mmspec.zoo import MODELS_DIR, read_card
from mmspec.zoo.distributions import DISTRIBUTIONS

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
CODE = [REPO / folder for folder in ("mmspec", "vision", "speech", "image_ar", "kernels")]
# Import name -> distribution name, where they differ (the rest: "_" -> "-").
DISTRIBUTION_OF = {"PIL": "pillow", "huggingface_hub": "huggingface-hub"}
# torch installs Triton on Linux; mmspec.kernels runs its torch references where Triton is missing.
WITH_TORCH = {"triton"}


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def extra_names(extra: str) -> set[str]:
    """The distributions an extra brings, its references to other extras (`mmspec[vision]`) followed."""
    names = set()
    for requirement in PROJECT["optional-dependencies"][extra]:
        if requirement_name(requirement) == "mmspec":
            for inner in re.search(r"\[(.*)\]", requirement).group(1).split(","):
                names |= extra_names(inner.strip())
        else:
            names.add(requirement_name(requirement))
    return names


CORE = {requirement_name(r) for r in PROJECT["dependencies"]}


def test_no_exact_pins_and_torch_is_a_range():
    every = [*PROJECT["dependencies"], *(r for extra in PROJECT["optional-dependencies"].values() for r in extra)]
    assert not [r for r in every if "==" in r]
    torch = next(r for r in PROJECT["dependencies"] if requirement_name(r) == "torch")
    assert ">=" in torch and "<" in torch.replace("<=", "")


def test_the_extras_a_user_picks_from():
    extras = PROJECT["optional-dependencies"]
    assert {"vision", "speech", "image", "demo", "recipes", "all", "dev"} <= set(extras)
    assert extra_names("all") == set().union(*(extra_names(e) for e in extras if e not in ("all", "dev")))
    assert extra_names("all") <= extra_names("dev")
    # the core pulls no modality's libraries
    assert not CORE & extra_names("all")


def source_files(exclude: tuple[str, ...] = ()) -> list[Path]:
    return [f for folder in CODE for f in folder.rglob("*.py") if not any(part in exclude for part in f.parts)]


def optional_requests() -> list[tuple[Path, str, str]]:
    """(file, module, extra) of every `require(module, extra, ...)` / `ensure(...)` call in mmspec's code."""
    found = []
    for file in source_files():
        for node in ast.walk(ast.parse(file.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("require", "ensure")
                    and len(node.args) >= 2 and all(isinstance(a, ast.Constant) for a in node.args[:2])):
                found.append((file, node.args[0].value, node.args[1].value))
    return found


def test_every_optional_library_is_in_the_extra_its_error_names():
    requests = optional_requests()
    assert {module.split(".")[0] for _, module, _ in requests} >= {"av", "torchvision", "timm", "jiwer", "scipy",
                                                                  "gradio", "hibari", "essential_generators"}
    wrong = [(f.name, module, extra) for f, module, extra in requests if pip_name(module) not in extra_names(extra)]
    assert not wrong


def test_code_outside_the_extras_imports_only_core_libraries():
    """A plain `import` of a library outside the core would be a traceback for a user without its extra: such
    libraries go through mmspec.optional (recipes and the demo, whose extras bring theirs, aside)."""
    outside = {}
    for file in source_files(exclude=("recipes", "demo")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "mmspec" or top in WITH_TORCH:
                    continue
                if DISTRIBUTION_OF.get(top, top.replace("_", "-")).lower() not in CORE:
                    outside.setdefault(str(file.relative_to(REPO)), []).append(name)
    assert not outside


def test_the_mmspec_wheel_holds_code_only():
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert setuptools.get("include-package-data") is False and "package-data" not in setuptools
    assert not any(package.startswith("mmspec.zoo.models") for package in setuptools["packages"])


# --- the zoo's distributions ----------------------------------------------------------------------------


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=lambda d: d.name)
def test_each_zoo_project_builds_its_distribution_from_the_zoo_folders(distribution):
    project = tomllib.loads((REPO / distribution.source / "pyproject.toml").read_text())
    assert project["project"]["name"] == distribution.name
    assert project["project"]["version"] == PROJECT["version"]
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == [distribution.package]
    assert (REPO / distribution.source / distribution.package / "__init__.py").is_file()
    assert wheel["force-include"] == {f"../../mmspec/zoo/models/{name}": f"{distribution.package}/models/{name}"
                                      for name in distribution.models}


def test_every_zoo_model_ships_in_one_distribution_with_the_model_it_comes_from():
    shipped = [name for distribution in DISTRIBUTIONS for name in distribution.models]
    assert len(shipped) == len(set(shipped))
    if not MODELS_DIR.is_dir():
        pytest.skip("an installed mmspec has no source zoo")
    assert set(shipped) == {folder.name for folder in MODELS_DIR.iterdir() if (folder / "zoo_card.json").is_file()}
    for distribution in DISTRIBUTIONS:
        for name in distribution.models:
            parent = read_card(MODELS_DIR / name / "zoo_card.json").get("derived_from", {}).get("model")
            assert parent is None or parent in distribution.models, (name, parent)


def test_each_zoo_distribution_fits_a_package_index():
    """Stored sizes: a wheel compresses them a little, and a package index takes files up to 100 MB."""
    if not MODELS_DIR.is_dir():
        pytest.skip("an installed mmspec has no source zoo")
    for distribution in DISTRIBUTIONS:
        files = [f for name in distribution.models for f in (MODELS_DIR / name).rglob("*") if f.is_file()]
        size = sum(f.stat().st_size for f in files)
        assert size < 95_000_000, (distribution.name, size)
