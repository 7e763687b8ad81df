"""The zoo image model (shapes-image-ar) generates offline through the pipeline and the CLI.

Skips when the zoo folder has no weights (rebuild: python -m mmspec.image_ar.recipes.build_shapes_image_ar).
"""

import json

import numpy as np
import pytest
from PIL import Image

from mmspec.cli import main
from mmspec.zoo import MODELS_DIR

FOLDER = MODELS_DIR / "shapes-image-ar"
pytestmark = [
    pytest.mark.skipif(not (FOLDER / "model.safetensors").is_file(), reason=f"no weights in {FOLDER}"),
    pytest.mark.slow,  # runs the shipped zoo model end to end
]


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


def test_generate_image_lantern_takes_its_neighbourhood_from_the_card(tmp_path, capsys):
    """The toy's 512-code codebook: LANTERN uses the card's k = 16 (not the authors' 1000, meant for 16384 codes)."""
    out = str(tmp_path / "x.png")
    assert main(["generate-image", "red circle", "--method", "lantern", "--out", out, "--json"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert (settings["lantern_k"], settings["lantern_delta"]) == (16, 0.1)
    assert main(["generate-image", "red circle", "--method", "lantern", "--lantern-k", "64", "--lantern-delta", "0.25",
                 "--out", out, "--json"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert (settings["lantern_k"], settings["lantern_delta"]) == (64, 0.25)
    assert main(["generate-image", "red circle", "--method", "lantern", "--lantern-k", "1000", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "lantern_k=1000 does not fit this 512-code codebook" in err.strip().splitlines()[-1]


def test_gsd_card_settings_use_the_input_token_embeddings(pipe):
    settings = pipe.gsd_settings()
    assert settings["gsd_latents"] == "embeddings" and settings["gsd_window"] == 7
    out = pipe(class_labels=3, method="gsd", output_type="np", progress_bar=False)
    assert out.settings["gsd_distance_threshold"] == settings["gsd_distance_threshold"]
