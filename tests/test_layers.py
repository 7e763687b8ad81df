"""The layering the design card draws, read from the source's imports:

- the core (`mmspec/`) imports no adapter; only the CLI, a thin face over the pipelines, may;
- adapters (`vision/`, `speech/`, `image_ar/`) import the core and kernels, never each other;
- kernels import neither the core's loop nor any adapter;
- no import cycles between modules (imports inside functions count: they hide a cycle, not break it).

A planted violation must be caught, or the test proves nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = {"vision": "mmspec.vision", "speech": "mmspec.speech", "image_ar": "mmspec.image_ar"}
FOLDERS = {"mmspec": "mmspec", "kernels": "mmspec.kernels", **ADAPTERS}
CLI = ("mmspec.cli", "mmspec.__main__")
CORE_LOOP = ("mmspec.decoding", "mmspec.targets", "mmspec.drafters")


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [FOLDERS[folder], *rest]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool) -> set[str]:
    """Every `mmspec...` module `source` imports (relative imports resolved against `module`)."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name == "mmspec" or name.startswith("mmspec.")}


def all_modules() -> dict[str, set[str]]:
    graph = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = module_name(path)
            graph[name] = imports_of(path.read_text(), name, path.name == "__init__.py")
    known = set(graph)
    # Keep only edges to modules (an imported name may be a function: fall back to its module).
    return {m: {i if i in known else i.rpartition(".")[0] for i in imps} & known for m, imps in graph.items()}


def layer_of(module: str) -> str:
    for folder, package in ADAPTERS.items():
        if module == package or module.startswith(package + "."):
            return folder
    if module == "mmspec.kernels" or module.startswith("mmspec.kernels."):
        return "kernels"
    return "cli" if module.startswith(CLI) else "core"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, imports in graph.items():
        mine = layer_of(module)
        for imported in imports:
            theirs = layer_of(imported)
            if mine == "core" and theirs in ADAPTERS:
                bad.append(f"{module} (core) imports the adapter module {imported}")
            elif mine in ADAPTERS and theirs in ADAPTERS and theirs != mine:
                bad.append(f"{module} ({mine}) imports another adapter's module {imported}")
            elif mine == "kernels" and (theirs in ADAPTERS or imported.startswith(CORE_LOOP)):
                bad.append(f"{module} (kernels) imports {imported}")
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            # A package's __init__ re-exporting its own modules is not a cycle of design.
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def without_package_reexports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Drop edges from a package's `__init__` into its own submodules (re-exports)."""
    return {m: {i for i in imps if not i.startswith(m + ".")} for m, imps in graph.items()}


def test_layers_hold():
    assert layer_violations(all_modules()) == []


def test_no_import_cycles():
    assert cycles(without_package_reexports(all_modules())) == []


def test_planted_violations_are_caught():
    graph = {
        "mmspec.decoding": {"mmspec.vision.models"},
        "mmspec.vision.models": {"mmspec.speech.target", "mmspec.targets"},
        "mmspec.speech.target": {"mmspec.targets"},
        "mmspec.targets": set(),
        "mmspec.kernels.fast": {"mmspec.decoding"},
        "mmspec.cli": {"mmspec.vision.models"},
    }
    assert layer_violations(graph) == [
        "mmspec.decoding (core) imports the adapter module mmspec.vision.models",
        "mmspec.kernels.fast (kernels) imports mmspec.decoding",
        "mmspec.vision.models (vision) imports another adapter's module mmspec.speech.target",
    ]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert imports_of("from ..targets import Target\nfrom . import x\n", "mmspec.vision.target", False) == {
        "mmspec.targets", "mmspec.targets.Target", "mmspec.vision", "mmspec.vision.x"}
