"""`mmspec demo`: refused settings get one line and status 2."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mmspec.cli import main

APP = Path(__file__).resolve().parents[2] / "demos" / "app.py"


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


def test_demos_app_py_is_the_same_command():
    done = subprocess.run([sys.executable, str(APP), "--port", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "mmspec: error: --port must be in 1..65535, got 0"


@pytest.mark.slow
def test_a_port_in_use_is_one_clear_error(capsys):
    pytest.importorskip("gradio")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--port", str(port), "--threads", "1"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"mmspec: error: cannot serve on 127.0.0.1:{port}: ") and "\n" not in error
