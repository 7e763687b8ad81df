"""`mmspec caption X.jsonl --out X.jsonl`: a results file that is also the input is refused in one line before any
model loads, however the two paths are spelt, and the file is left as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mmspec.cli import main

SHAPES = Path(__file__).parents[1] / "demos" / "assets" / "shapes.mp4"


@pytest.mark.parametrize("spelling", ["same", "dotted", "symlink", "hardlink"])
@pytest.mark.parametrize("content", ["video", "results"])
def test_the_input_as_its_own_results_file_is_refused(tmp_path, capsys, spelling, content):
    given = tmp_path / "clip.jsonl"  # a video that PyAV reads whatever its suffix, or lines of an earlier run
    given.write_bytes(SHAPES.read_bytes() if content == "video" else b'{"file": "clip.mp4", "text": "a red circle"}\n')
    before = given.read_bytes()
    (tmp_path / "sub").mkdir()
    out = {"same": given, "dotted": tmp_path / "sub" / ".." / "clip.jsonl", "symlink": tmp_path / "link.jsonl",
           "hardlink": tmp_path / "hard.jsonl"}[spelling]
    if spelling == "symlink":
        out.symlink_to(given)
    elif spelling == "hardlink":
        os.link(given, out)
    code = main(["caption", str(given), "--out", str(out), "--model", str(tmp_path / "no-model")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mmspec: error: --out ") and "is the input file" in lines[0], err
    assert "no-model" not in err  # refused before the model is looked for
    assert given.read_bytes() == before
