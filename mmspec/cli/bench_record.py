"""Run a verb; a bench's measured speed-ups also go to the results file (`mmspec.bench.results`)."""

from __future__ import annotations

import argparse
import shlex
import sys


def run_verb(args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.command != "bench":
        return args.func(args)
    from ..bench.results import recording

    words = argv if argv is not None else sys.argv[1:]
    with recording(args.modality, shlex.join(["mmspec", *words])):
        return args.func(args)
