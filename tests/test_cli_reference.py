"""docs/cli.md is the generated CLI reference: it must be what `python -m mmspec.cli.reference` prints now."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from mmspec.cli import build_parser, reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


@pytest.fixture(scope="module")
def current() -> str:
    return reference.reference()


def test_cli_reference_is_current(current: str) -> None:
    assert DOC.read_text(encoding="utf-8") == current, (
        "docs/cli.md is out of date: run `python -m mmspec.cli.reference > docs/cli.md`"
    )


def test_reference_lists_every_leaf_flag(current: str) -> None:
    from mmspec.cli.common import leaf_parsers

    for leaf in leaf_parsers(build_parser()):
        for action in leaf._actions:
            for option in action.option_strings:
                if action.help is not argparse.SUPPRESS:
                    assert option in current, f"{leaf.prog}: {option} missing from the reference"


def test_a_new_flag_makes_the_reference_stale(monkeypatch: pytest.MonkeyPatch, current: str) -> None:
    def with_new_flag():
        parser = build_parser()
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        caption = commands.choices["caption"]
        caption.add_argument("--brand-new-flag", help="a flag added without regenerating the reference")
        return parser

    monkeypatch.setattr(reference, "build_parser", with_new_flag)
    changed = reference.reference()
    assert "--brand-new-flag" in changed and changed != DOC.read_text(encoding="utf-8")
