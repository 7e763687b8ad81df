"""The `--tree` flag shared by the verbs that decode: draft EAGLE-2 trees instead of chains."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT = "default"


def add_tree_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tree", nargs="?", const=DEFAULT, default=None, type=tree_spec, metavar="NODES,TOP_K,DEPTH",
                        help="draft a dynamic tree (EAGLE-2) verified in one target forward instead of a chain: "
                             "NODES nodes kept, TOP_K children per expanded node, DEPTH levels (bare --tree: 16,4,5)")


def tree_spec(text: str) -> Any:
    """`NODES,TOP_K,DEPTH` (or the bare flag) as a `TreeConfig`; argparse turns an error into one line and exit 2."""
    from ..errors import MMSpecError
    from ..trees import TreeConfig

    if text == DEFAULT:
        return TreeConfig()
    parts = text.split(",")
    if len(parts) != 3 or not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected NODES,TOP_K,DEPTH (three integers), got {text!r}")
    nodes, top_k, depth = (int(part) for part in parts)
    try:
        return TreeConfig(num_nodes=nodes, top_k=top_k, depth=depth)
    except MMSpecError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
