"""`mmspec zoo list`: the embedded toy models, with size, training data, quality and rebuild command."""

from __future__ import annotations

import argparse
import json

from ..zoo.distributions import DISTRIBUTIONS
from .common import SharedFlags


def register(commands: argparse._SubParsersAction, flags: SharedFlags) -> None:
    zoo = commands.add_parser("zoo", help="the embedded toy model zoo").add_subparsers(dest="zoo_command", required=True)
    parser = zoo.add_parser("list", parents=[flags.json],
                            help="list zoo models with size, training data, quality and rebuild command")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..zoo import entries

    found = [e.to_dict() for e in entries()]
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    if not found:
        print("the zoo is empty")
    for e in found:
        quality = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in e.get("quality", {}).items())
        size = e.get("weights_size_bytes", e["file_size_bytes"])  # weights installed by a pip package: their size
        print(f"{e['name']}: {e.get('architecture', '?')} ({e.get('role', '?')}), {e.get('params', 0) / 1e6:.1f}M params, "
              f"{size / 1e6:.1f} MB")
        if e.get("source"):
            print(f"    source: {e['source']}")
        part = e.get("derived_from")
        if isinstance(part, dict) and "overlay" in part:  # a few MB of its own, merged into another zoo model's
            print(f"    weights: {part.get('model')}'s (counted there) with its own {part['overlay']} merged in "
                  f"({size / 1e6:.1f} MB)")
        elif isinstance(part, dict):  # no weights of its own: they ship inside another zoo model
            what = f"its {part['folder']}/ folder" if "folder" in part else "its language model"
            print(f"    weights: {what} of {part.get('model')} (counted there)")
        took = f" in {e['train_wall_time_s'] / 60:.1f} min" if "train_wall_time_s" in e else ""
        print(f"    trained on: {e.get('trained_on', '?')}{took}")
        earlier = e.get("earlier_training", [])
        if earlier:  # a continued run: its own line above is only the last stretch
            runs = [*earlier, e]
            minutes = sum(r.get("train_wall_time_s", 0.0) for r in runs) / 60
            print(f"    training runs: {len(runs)} in all, {minutes:.1f} min together (the card's earlier_training)")
        print(f"    quality: {quality}")
        steps = e.get("rebuild_steps")
        if steps:  # built in several runs: every command, in order
            print("    rebuild, in order:")
            for step in steps:
                print(f"      {step}")
        else:
            print(f"    rebuild: {e.get('rebuild_command', '?')}")
    names = {e["name"] for e in found}
    for distribution in DISTRIBUTIONS:  # the zoo's other models, for the asking
        if not names & set(distribution.models):
            print(f"not installed: {', '.join(distribution.models)} (pip install {distribution.name})")
    return 0
