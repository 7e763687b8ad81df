"""The zoo image model (shapes-image-ar) generates offline through the pipeline and the CLI.

Skips when the zoo folder has no weights (rebuild: python -m mmspec.zoo.training.build_shapes_image_ar).
"""

import json

import numpy as np
import pytest
from PIL import Image

from mmspec.cli import main
from mmspec.zoo import MODELS_DIR

FOLDER = MODELS_DIR / "shapes-image-ar"
pytestmark = pytest.mark.skipif(not (FOLDER / "model.safetensors").is_file(), reason=f"no weights in {FOLDER}")


@pytest.fixture(scope="module")
def pipe():
    from mmspec.image_ar import SpeculativeImagePipeline

    return SpeculativeImagePipeline.from_pretrained("shapes-image-ar")


def test_greedy_gsd_and_sd_equal_ar(pipe):
    import torch

    images = {m: pipe(class_labels=0, method=m, temperature=0, output_type="np", progress_bar=False)
              for m in ("ar", "sd", "gsd")}
    for method in ("sd", "gsd"):
        assert np.array_equal(images[method].images, images["ar"].images), method
    assert images["sd"].stats.target_forwards < images["ar"].stats.target_forwards
    del torch


def test_generate_image_cli_writes_a_red_picture(tmp_path, capsys):
    """Most seeds draw a red shape (the toy still draws an empty canvas now and then)."""
    red_pictures = 0
    for seed in range(4):
        out = tmp_path / f"x{seed}.png"
        assert main(["generate-image", "red circle", "--method", "gsd", "--seed", str(seed), "--out", str(out), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["stats"]["step_compression"] > 1.0
        pixels = np.asarray(Image.open(out).convert("RGB")).reshape(-1, 3).astype(int)
        reddish = (pixels[:, 0] > 150) & (pixels[:, 1] < 90) & (pixels[:, 2] < 90)
        red_pictures += int(reddish.sum() > 20)
    assert red_pictures >= 3
