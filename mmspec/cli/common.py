"""What every verb shares: the common flags (one definition each), thread setting, the zoo-default
notice, and the one JSON shape of the stats."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import MMSpecError
from . import checks

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("mmspec")
    except PackageNotFoundError:
        return "unknown"


class SharedFlags:
    """Parent parsers for the flags many verbs take (pass them as `parents=[...]`)."""

    def __init__(self) -> None:
        self.json = self._parser(lambda p: p.add_argument("--json", action="store_true", help="print one JSON object"))
        self.seed = self._parser(lambda p: p.add_argument("--seed", type=checks.seed, default=0,
                                                          help="random seed, 0 to 2**64 - 1"))
        self.threads = self._parser(lambda p: p.add_argument(
            "--threads", type=checks.threads, default=None, help="torch CPU threads (default: torch's choice)"))
        self.repeats = self._parser(lambda p: p.add_argument("--repeats", type=checks.positive_int, default=3,
                                                             help="interleaved repetitions; medians are reported"))
        self.device = self._parser(lambda p: p.add_argument(
            "--device", type=checks.device_name, default=None, metavar="DEVICE",
            help="run the models on this device, e.g. cuda, cuda:1 (default: cpu); the generator stays on the CPU, "
                 "so a seed gives the same draws everywhere"))

    @staticmethod
    def _parser(add: Callable[[argparse.ArgumentParser], Any]) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(add_help=False)
        add(parser)
        return parser


def add_size_flag(parser: argparse.ArgumentParser, default: int, what: str, *old_names: str) -> None:
    """`--num-samples N`, the one name of every bench's size flag (`args.num_samples`); the older per-bench
    names still work, unlisted."""
    parser.add_argument("--num-samples", dest="num_samples", type=checks.positive_int, default=default, metavar="N",
                        help=f"{what} (--num-samples in every bench)")
    for old in old_names:
        parser.add_argument(old, dest="num_samples", type=checks.positive_int, default=argparse.SUPPRESS,
                            help=argparse.SUPPRESS)


def leaf_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser that runs a verb (those without sub-commands of their own), depth first."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield parser
    for action in subcommands:
        for child in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
            yield from leaf_parsers(child)


def quiet_libraries() -> None:
    """Keep stderr for mmspec's own messages: no transformers / hub progress bars, warnings or deprecation notes.

    Environment settings the libraries read when they are imported (nothing heavy is imported yet), plus
    Python's warnings filter; `--verbose` skips this.
    """
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(transformers|diffusers|huggingface_hub|torch)\b")
    if "transformers" in sys.modules:  # imported already (e.g. in-process tests): set it directly
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def set_threads(args: argparse.Namespace) -> None:
    import torch

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)


def check_device(args: argparse.Namespace) -> None:
    """`--device` present on this machine: checked before any weights load."""
    if getattr(args, "device", None) is not None:
        checks.refuse_cuda_without_driver(args.device, "--device")
        from ..devices import usable_device

        usable_device(args.device)


def on_device(pipe: Any, args: argparse.Namespace) -> Any:
    """The loaded pipeline moved to `--device` (as diffusers' `pipe.to("cuda")`), when one is given."""
    if getattr(args, "device", None) is None:
        return pipe
    from ..devices import usable_device

    return pipe.to(usable_device(args.device))


def emit(report: Any, args: argparse.Namespace) -> None:
    print(report.to_json() if args.json else report.to_table())


TOY_WORLD = ("trained only on a synthetic world of coloured shapes, it answers other input (a photo, a test pattern) "
             "with confident nonsense")
_announced: set[str] = set()  # toy models already announced by this process


def is_toy(name: str | None) -> bool:
    """Whether `name` is a zoo model of the synthetic shapes world (the zoo's toys; whisper-tiny.en is OpenAI's)."""
    from ..zoo import entries

    return name is not None and name.startswith("shapes-") and name in {e.name for e in entries()}


def announce_toy(name: str | None, what: str) -> None:
    """Once per process, on stderr: the zoo model named by --model is a toy of the shapes world."""
    if name in _announced or not is_toy(name):
        return
    _announced.add(name)  # type: ignore[arg-type]  # is_toy(None) is False
    print(f"mmspec: using the embedded toy {what} {name!r}: {TOY_WORLD}", file=sys.stderr)


def announce_zoo_default(name: str, what: str, trained_on: str) -> None:
    """With no --model: use the zoo's toy model and say so, or fail clearly if this install lacks it."""
    from ..zoo import entries
    from ..zoo.distributions import not_installed

    if name not in {e.name for e in entries()}:
        missing = not_installed(name, what)
        if missing is not None:
            raise MMSpecError(f"{missing}; or pass --model ID|PATH")
        raise MMSpecError(f"the toy {what} {name!r} is not in this install's zoo; pass --model ID|PATH")
    _announced.add(name)
    print(f"mmspec: using the embedded toy {what} {name!r} (trained on {trained_on}; pass --model for a real checkpoint); "
          f"{TOY_WORLD}", file=sys.stderr)


def stats_json(stats: Any, **extra: Any) -> dict[str, Any]:
    """The stats of every `--json` output, one shape for every verb.

    Keys: new_tokens, rounds, drafted, accepted, target_forwards, drafter_forwards,
    mean_accepted_length (tau), acceptance_rate (alpha), prefill_time_s, draft_time_s,
    verify_time_s, wall_time_s, tokens_per_s, per_position_acceptance; then the verb's own (`extra`).
    """
    return {
        "new_tokens": stats.new_tokens, "rounds": stats.rounds, "drafted": stats.drafted, "accepted": stats.accepted,
        "target_forwards": stats.target_forwards, "drafter_forwards": stats.drafter_forwards,
        "mean_accepted_length": stats.tau, "acceptance_rate": stats.alpha, "prefill_time_s": stats.prefill_time,
        "draft_time_s": stats.draft_time, "verify_time_s": stats.verify_time, "wall_time_s": stats.total_time,
        "tokens_per_s": stats.tokens_per_second, "per_position_acceptance": stats.per_position_acceptance, **extra,
    }
