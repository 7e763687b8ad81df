"""The `mmspec` command line: a thin face over the pipelines and the bench harness.

One module per verb (`generate`, `caption`, `transcribe`, `generate_image`, `bench_*`, `train_*`,
`zoo`), each with `register(commands, flags)` and `run(args)`; the flags every verb shares live in
`common`. Nothing heavy is imported until a verb runs, so `mmspec --help` is quick.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import MMSpecError
from . import (
    bench_image,
    bench_overhead,
    bench_speech,
    bench_text,
    bench_vision,
    caption,
    common,
    demo,
    generate,
    generate_image,
    train_drafter,
    train_fast_decoder,
    transcribe,
    zoo,
)
from .bench_record import run_verb

VERBS = (generate, caption, transcribe, generate_image, train_fast_decoder, train_drafter, zoo, demo)
BENCHES = (bench_text, bench_vision, bench_speech, bench_overhead, bench_image)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmspec", description="Speculative decoding for multimodal and non-text models.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {common.version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    flags = common.SharedFlags()
    for verb in VERBS[:4]:
        verb.register(commands, flags)
    benches = commands.add_parser("bench", help="side-by-side benchmarks").add_subparsers(dest="modality", required=True)
    for bench in BENCHES:
        bench.register(benches, flags)
    for verb in VERBS[4:]:
        verb.register(commands, flags)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_verb(args, argv)  # a bench also appends its results (mmspec.bench.results)
    except MMSpecError as error:
        print(f"mmspec: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
