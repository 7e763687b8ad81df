"""`mmspec demo`: refused settings get one line and status 2."""

from __future__ import annotations

from mmspec.cli import main


def test_a_port_out_of_range_is_one_clear_error(capsys):
    assert main(["demo", "--port", "70000"]) == 2
    assert capsys.readouterr().err.strip() == "mmspec: error: --port must be in 1..65535, got 70000"


def test_without_gradio_the_demo_says_how_to_install_it(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gradio" else real(name, *a))
    assert main(["demo", "--port", "7861"]) == 2
    assert capsys.readouterr().err.strip() == ("mmspec: error: the demo needs gradio, which is not installed: "
                                               "pip install 'mmspec[demo]'")
