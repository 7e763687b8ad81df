"""Checks on where a verb writes, run before any model loads: an output is never one of the inputs, can be
written at all (not /proc, not a read-only mount), and outputs of one run never share a name."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import MMSpecError
from . import checks


def same_file(first: Path, second: Path) -> bool:
    """Whether two paths name one file: the same inode (hard links, symlinks, `..`), or one resolved path."""
    try:
        return os.path.samefile(first, second)
    except OSError:  # one of them does not exist yet
        return first.resolve() == second.resolve()


def refuse_inputs(output: str | os.PathLike, inputs: Iterable[Path], flag: str = "--out") -> None:
    """One line if `output` is one of `inputs`: writing it would replace the input with its own result."""
    out = Path(output)
    for source in inputs:
        if same_file(out, source):
            raise MMSpecError(f"{flag} {os.fsdecode(out)!r} is the input file {os.fsdecode(source)!r}; writing it "
                              "would destroy the input: name another output")


def check_file(output: str, flag: str = "--out") -> None:
    """An output file that can be written (its folder exists and takes a new file)."""
    try:
        checks.output_file()(output)
    except argparse.ArgumentTypeError as error:
        raise MMSpecError(f"{flag}: {error}") from None


def check_folder(output: str, flag: str = "--out") -> None:
    """An output folder that exists and takes new files, or can be made."""
    try:
        checks.output_folder(output)
    except argparse.ArgumentTypeError as error:
        raise MMSpecError(f"{flag}: {error}") from None


def distinct_names(files: list[Path], suffix: str) -> dict[Path, str]:
    """The output name of each input in one folder: STEM.SUFFIX, or NAME.SUFFIX where stems collide
    (talk.wav, talk.flac -> talk.wav.SUFFIX, talk.flac.SUFFIX), so no output replaces another."""
    stems: dict[str, int] = {}
    for path in files:
        stems[path.stem.lower()] = stems.get(path.stem.lower(), 0) + 1  # case-insensitive filesystems collide too
    names = {path: f"{path.stem if stems[path.stem.lower()] == 1 else path.name}.{suffix}" for path in files}
    taken: dict[str, Path] = {}
    for path, name in names.items():  # a stem that equals another file's full name (a.wav.wav, a.wav): still unique
        if name.lower() in taken:
            names[path] = f"{path.name}.{suffix}" if names[path] != f"{path.name}.{suffix}" else f"{path.name}.1.{suffix}"
        taken[names[path].lower()] = path
    return names


def printable(name: str | os.PathLike) -> str:
    """A file name safe to print or write as UTF-8: bytes that are not UTF-8 (kept as surrogates by `os.fsdecode`)
    shown as \\xNN escapes, so a message about the file never fails."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")
