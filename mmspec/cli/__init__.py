"""The `mmspec` command line: a thin face over the pipelines and the bench harness.

One module per verb (`generate`, `caption`, `transcribe`, `generate_image`, `bench_*`, `train_*`,
`zoo`), each with `register(commands, flags)` and `run(args)`; the flags every verb shares live in
`common`. Nothing heavy is imported until a verb runs, so `mmspec --help` is quick.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import MMSpecError
from . import (
    bench_image,
    bench_overhead,
    bench_speech,
    bench_text,
    bench_vision,
    caption,
    collector,
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


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors, `mmspec: error: ...` like every other error, and exit status 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--device` must not be read as `--device-map`
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"mmspec: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mmspec", description="Speculative decoding for multimodal and non-text models.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {common.version()}")
    parser.add_argument("--verbose", action="store_true", help="also show transformers' progress bars and warnings")
    commands = parser.add_subparsers(dest="command", required=True)
    flags = common.SharedFlags()
    for verb in VERBS[:4]:
        verb.register(commands, flags)
    benches = commands.add_parser("bench", help="side-by-side benchmarks").add_subparsers(dest="modality", required=True)
    for bench in BENCHES:
        bench.register(benches, flags)
    for verb in VERBS[4:]:
        verb.register(commands, flags)
    for leaf in common.leaf_parsers(parser):  # `--verbose` after the verb too
        leaf.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                          help="also show transformers' progress bars and warnings")
    return parser


@contextmanager
def noted_interrupts() -> Iterator[list[int]]:
    """Ctrl-C raises KeyboardInterrupt as usual and is also noted: a lazy importer (transformers') can turn an
    interrupt that lands mid-import into an ImportError, which is still the user's Ctrl-C, not a bug."""
    noted: list[int] = []
    # Off the main thread no handler can be set; an ignored SIGINT (a background job of a script) stays ignored.
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield noted
        return

    def interrupt(signum: int, frame: object) -> None:
        if _importing(frame):
            # Raised inside a module's import, the interrupt can unwind through C++ extension code (torch's own
            # initialisation), which aborts the process with a C++ traceback: deliver it again once that is over.
            later = threading.Timer(0.1, os.kill, (os.getpid(), signum))
            later.daemon = True
            later.start()
            return
        noted.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def _importing(frame: object) -> bool:
    """Whether `frame` runs inside an import (the import system's frames are below it)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):  # type: ignore[attr-defined]
            return True
        frame = frame.f_back  # type: ignore[attr-defined]
    return False


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the program itself (the console script, `python -m mmspec`): one command, then exit
        collector.mark_one_off()
    collector.skip_walks_at_exit()  # the exit need not walk the libraries' objects
    with noted_interrupts() as interrupts:
        try:
            return _main(argv)
        except Exception:
            if not interrupts:
                raise
            print("mmspec: interrupted", file=sys.stderr)
            return 130


def _main(argv: list[str] | None) -> int:
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exit_:  # argparse's one-line errors (2), --help and --version (0): a status, like a verb's
            return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
        if not args.verbose:
            common.quiet_libraries()
        return run_verb(args, argv)  # a bench also appends its results (mmspec.bench.results)
    except MMSpecError as error:
        print(f"mmspec: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mmspec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `mmspec ... | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
