"""More bad input on the command line, each refused in one line (exit 2, no traceback) before any model loads:
placement flags, odd files (a symlink loop, a device file), flags abbreviated into other flags, a resume with
nothing to resume."""

from __future__ import annotations

import os

import pytest
import torch

from .test_bad_inputs import check, fields, run_in_process  # noqa: F401 - fields is a fixture

ROWS = [
    (["caption", "{video}", "--max-memory", "cpu=1e999GB"], "argument --max-memory: max_memory['cpu']: '1e999GB' is not a size"),
    (["caption", "{video}", "--max-memory", "cpu=1GB,cpu=2GB"], "argument --max-memory: cpu is given twice"),
    (["caption", "{video}", "--device-map", "auto", "--drafter-device", "meta"], "--drafter-device meta: "),
    (["transcribe", "{video}", "--device-map", "auto", "--drafter-device", "meta"], "--drafter-device meta: "),
    (["transcribe", "{video}", "--device", "cuda"], "unrecognized arguments: --device cuda"),
    (["caption", "{tmp}/loop.mp4"], "symbolic links"),
    (["transcribe", "{tmp}/loop.wav"], "symbolic links"),
    (["caption", "/dev/zero"], "not a regular file"),
    (["transcribe", "/dev/zero"], "not a regular file"),
    (["train-drafter", "--target", "x", "--data", "{good_data}", "--out", "{tmp}/d", "--resume"], "nothing to resume"),
]
NO_GPU = [
    (["caption", "{video}", "--device-map", "auto", "--drafter-device", "cuda"], "--drafter-device cuda: this machine has no CUDA GPU"),
]


@pytest.fixture
def more_fields(fields, tmp_path):  # noqa: F811
    for name in ("loop.mp4", "loop.wav"):
        os.symlink(tmp_path / name, tmp_path / name)
    (tmp_path / "good-data").mkdir()
    (tmp_path / "good-data" / "metadata.json").write_text("{}")
    return {**fields, "good_data": str(tmp_path / "good-data")}


@pytest.mark.parametrize("argv, expected", ROWS)
def test_refused_in_one_line(argv, expected, more_fields, capsys):
    code, err = run_in_process(argv, more_fields, capsys)
    check(code, err, expected, more_fields)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a CUDA GPU")
@pytest.mark.parametrize("argv, expected", NO_GPU)
def test_a_drafter_device_the_machine_lacks_is_refused(argv, expected, more_fields, capsys):
    code, err = run_in_process(argv, more_fields, capsys)
    check(code, err, expected, more_fields)
