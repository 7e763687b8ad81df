"""Every atomically written output gets the mode a plain open() gives (0666 less the umask), not mkstemp's 0600;
a file that exists keeps its own mode."""

from __future__ import annotations

import os

from mmspec.batch_files import write_records
from mmspec.cli.atomic import atomic_write


def test_atomic_outputs_get_a_plain_opens_mode(tmp_path):
    previous = os.umask(0o022)
    try:
        image = atomic_write(tmp_path / "x.png", lambda path: path.write_bytes(b"png"))
        write_records(tmp_path / "r.jsonl", [{"file": "a.mp4", "error": None}])
    finally:
        os.umask(previous)
    assert image.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "r.jsonl").stat().st_mode & 0o777 == 0o644


def test_an_existing_output_keeps_its_mode(tmp_path):
    path = tmp_path / "x.png"
    path.write_bytes(b"old")
    path.chmod(0o640)
    atomic_write(path, lambda temporary: temporary.write_bytes(b"new"))
    assert path.read_bytes() == b"new" and path.stat().st_mode & 0o777 == 0o640
