"""Naming a toy model of the zoo (the synthetic shapes world) says so once on stderr: other input gets
confident nonsense. Real models (whisper-tiny.en) and folders get no such line."""

from __future__ import annotations

import pytest

from mmspec.cli import common, main
from mmspec.zoo import entries

needs_zoo = pytest.mark.skipif(not {"shapes-image-ar", "whisper-tiny.en"} <= {e.name for e in entries()},
                               reason="needs the zoo")


@needs_zoo
def test_a_toy_model_named_on_the_command_line_is_announced_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(common, "_announced", set())
    argv = ["generate-image", "9999", "--model", "shapes-image-ar", "--out", str(tmp_path / "x.png")]
    assert main(argv) == 2  # no such class: nothing is generated, after the model is named
    err = capsys.readouterr().err
    notices = [line for line in err.splitlines() if "synthetic world of coloured shapes" in line]
    assert len(notices) == 1 and "'shapes-image-ar'" in notices[0] and "confident nonsense" in notices[0], err
    assert main(argv) == 2
    assert "synthetic world" not in capsys.readouterr().err  # once per process


@needs_zoo
def test_the_default_toy_says_it_too_and_a_real_model_does_not(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(common, "_announced", set())
    assert main(["generate-image", "9999", "--out", str(tmp_path / "x.png")]) == 2
    assert "synthetic world of coloured shapes" in capsys.readouterr().err
    assert not common.is_toy("whisper-tiny.en") and not common.is_toy(str(tmp_path)) and common.is_toy("shapes-var")
