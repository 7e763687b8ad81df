"""The `--tree` flag shared by the verbs that decode: draft EAGLE-2 trees instead of chains."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

DEFAULT_TREE = (16, 4, 5)  # mmspec.trees.TreeConfig's defaults (a test keeps them equal)


@dataclass(frozen=True)
class TreeSpec:
    """`--tree`'s sizes, checked; `config()` makes the `TreeConfig` (mmspec.trees imports torch: only when used)."""

    num_nodes: int
    top_k: int
    depth: int

    def config(self) -> Any:
        from ..trees import TreeConfig

        return TreeConfig(num_nodes=self.num_nodes, top_k=self.top_k, depth=self.depth)


def add_tree_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tree", nargs="?", const=TreeSpec(*DEFAULT_TREE), default=None, type=tree_spec,
                        metavar="NODES,TOP_K,DEPTH",
                        help="draft a dynamic tree (EAGLE-2) verified in one target forward instead of a chain: "
                             "NODES nodes kept, TOP_K children per expanded node, DEPTH levels (bare --tree: 16,4,5)")


def tree_spec(text: str) -> TreeSpec:
    """`NODES,TOP_K,DEPTH` as a `TreeSpec`; argparse turns an error into one line and exit 2."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3 or not all(part.isascii() and part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected NODES,TOP_K,DEPTH (three integers), got {text!r}")
    nodes, top_k, depth = (int(part) for part in parts)
    for name, value in (("num_nodes", nodes), ("top_k", top_k), ("depth", depth)):
        if value < 1:  # as TreeConfig says it
            raise argparse.ArgumentTypeError(f"tree {name} must be an integer >= 1, got {value!r}")
    return TreeSpec(nodes, top_k, depth)


def tree_config(spec: TreeSpec | None) -> Any:
    """The `TreeConfig` of a parsed `--tree` (None: chains)."""
    return None if spec is None else spec.config()
