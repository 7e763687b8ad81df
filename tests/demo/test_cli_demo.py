"""`mmspec demo`: refused settings get one line and status 2."""

from __future__ import annotations

from mmspec.cli import main


def test_a_port_out_of_range_is_one_clear_error(capsys):
    assert main(["demo", "--port", "70000"]) == 2
    assert capsys.readouterr().err.strip() == "mmspec: error: --port must be in 1..65535, got 70000"
