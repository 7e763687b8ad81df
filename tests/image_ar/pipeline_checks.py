"""What the class-conditional and the Janus pipeline tests check alike: seeded generators, method options
that fit the tiny VQ, `mmspec generate-image` runs, and what the VAR and MAR pipeline tests assert alike
about outputs and saved folders (what both pipelines must do alike is tested once for each in
test_class_conditional_pipelines.py)."""

import json
import re

import numpy as np
import pytest
import torch
from diffusers.utils import BaseOutput
from PIL import Image

from mmspec.cli import main

# LANTERN's default k (the authors' 1000, for a 16384-code codebook) does not fit the tiny 12-code VQ.
OPTIONS = {"lantern": {"lantern_k": 4}}
# Stats every image method reports in `generate-image --json`.
STATS = {"new_tokens", "target_forwards", "step_compression", "mean_accepted_length", "wall_time_s"}


def seeded(seed=0):
    return torch.Generator().manual_seed(seed)


def generate_image_json(folder, prompt, method, seed, out, capsys, size):
    """`generate-image ... --json` at guidance 2: exit 0, the method, the out path, the stats of 16 tokens and an
    image of `size`; returns the JSON."""
    code = main(["generate-image", prompt, "--model", str(folder), "--method", method, "--seed", str(seed),
                 "--guidance-scale", "2", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(captured.out)
    assert data["method"] == method and data["out"] == str(out)
    stats = data["stats"]
    assert STATS <= set(stats)
    assert stats["new_tokens"] == 16 and stats["step_compression"] == pytest.approx(16 / stats["target_forwards"])
    assert Image.open(out).size == size
    return data


def generate_image_default_out(folder, prompt, file_name, tmp_path, capsys, monkeypatch):
    """Greedy `generate-image` without --out in `tmp_path`: prints and writes `file_name`, reports on stderr."""
    monkeypatch.chdir(tmp_path)
    assert main(["generate-image", prompt, "--model", str(folder), "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == file_name and (tmp_path / file_name).is_file()
    assert "method 'sjd'" in captured.err and "step compression" in captured.err


def generate_image_fails(folder, capsys, argv, message):
    """`generate-image *argv`: exit 2 and one error line matching `message`, no traceback."""
    code = main(["generate-image", *argv, "--model", str(folder)])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after transformers' weight-loading bars, if the model was loaded
    assert code == 2 and last.startswith("mmspec: error:") and "Traceback" not in err
    assert re.search(message, last)


# ---- the class-conditional pipelines (VAR, MAR) alike ------------------------------------------------

def assert_same_components(pipe, loaded, names):
    """Every named component of `loaded` has `pipe`'s weights, to the bit."""
    for name in names:
        ours, theirs = getattr(pipe, name).state_dict(), getattr(loaded, name).state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def assert_images_output(out, count, size):
    """A diffusers `BaseOutput` whose images (`out.images`, `out["images"]`, `out[0]`) are `count` PIL images of `size`."""
    assert isinstance(out, BaseOutput)
    assert out[0] is out.images and out["images"] is out.images and len(out.images) == count
    assert out.images[0].size == size


def assert_np_images(pipe, side):
    """output_type="np": one float array [1, side, side, 3] in [0, 1]."""
    arrays = pipe(class_labels=0, method="ar", seed=0, output_type="np", progress_bar=False).images
    assert isinstance(arrays, np.ndarray) and arrays.shape == (1, side, side, 3) and 0 <= arrays.min() <= arrays.max() <= 1
