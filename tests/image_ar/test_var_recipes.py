"""The shapes-var recipes end to end with tiny settings (3 steps each): the VQ-VAE, both VARs, the saved
pipeline they make, its card; and that no recipe writes into the package without --into-zoo."""

from __future__ import annotations

import json

import pytest
import torch

from mmspec.image_ar.recipes import build_shapes_var, shapes_var, train_shapes_var, train_shapes_var_vq
from mmspec.image_ar.var import VAR
from mmspec.image_ar.var_pipeline import VARPipeline


def test_a_three_step_build_makes_a_loadable_var_pipeline(tmp_path):
    out = tmp_path / "shapes-var"
    build_shapes_var.main(["--out", str(out), "--smoke", "--threads", "1"])
    card = json.loads((out / "zoo_card.json").read_text())
    assert set(card["components"]) == {"vq", "model", "refiner"}
    for part in card["components"].values():
        assert part["train_wall_time_s"] > 0 and part["rebuild_command"].startswith("python -m mmspec.image_ar.recipes.")
    assert card["components"]["vq"]["trained_on"].endswith("3 steps x 16")
    assert "class_accuracy" in card["components"]["model"]["quality"]["samples"]["cfg_1.5"]
    assert card["params"] == sum(part["params"] for part in card["components"].values())
    assert "model_class_accuracy_cfg_1.5" in card["quality"] and "vq_reconstruction_class_accuracy" in card["quality"]
    assert json.loads((out / "model_index.json").read_text())["_class_name"] == "VARPipeline"
    pipe = VARPipeline.from_pretrained(out)
    assert pipe.model.patch_nums == shapes_var.PATCH_NUMS and pipe.refiner is not None
    assert pipe.model.dtype == torch.float32  # stored in fp16, loaded as float32
    out_image = pipe(prompt="red circle", method="code", seed=0, progress_bar=False).images[0]
    assert out_image.size == (64, 64)


@pytest.mark.parametrize("recipe, argv", [
    (train_shapes_var_vq, ["--steps", "1"]),
    (train_shapes_var, ["--role", "large", "--steps", "1"]),
    (build_shapes_var, ["--smoke"]),
])
def test_recipes_never_write_into_the_package_without_into_zoo(recipe, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        recipe.main(["--out", str(shapes_var.ZOO_DIR / "vq"), *argv])
    assert exit_info.value.code == 2
    assert "inside the installed mmspec package; pass --into-zoo" in capsys.readouterr().err


def test_init_from_continues_a_saved_var(tmp_path):
    """--init-from starts from the saved weights (a learning rate too small to move them leaves them as they were),
    keeps that model's size whatever the role's, and says so in the card; a VAR of other codes is refused."""
    out = tmp_path / "shapes-var"
    build_shapes_var.main(["--out", str(out), "--smoke", "--threads", "1"])
    saved = tmp_path / "first"
    (out / "refiner").rename(saved)
    train_shapes_var.main(["--out", str(out), "--role", "small", "--steps", "1", "--lr", "1e-12", "--warmup", "0",
                           "--train-n", "32", "--heldout-n", "16", "--sample-n", "0", "--threads", "1",
                           "--init-from", str(saved), "--depth", "3"])
    before = VARPipeline.from_pretrained(out, refiner=str(saved)).refiner.state_dict()
    after = VARPipeline.from_pretrained(out).refiner.state_dict()
    assert before.keys() == after.keys() and all(torch.allclose(before[k], after[k], atol=1e-3) for k in before)
    card = json.loads((out / "zoo_card.json").read_text())["components"]["refiner"]
    assert card["trained_on"].endswith(f"continued from {saved}") and f"--init-from {saved}" in card["rebuild_command"]
    VAR(vocab_size=7, Cvae=4, num_classes=3, depth=1, embed_dim=16, num_heads=2, patch_nums=(1, 2)).save_pretrained(
        tmp_path / "wrong")
    with pytest.raises(SystemExit, match="not a VAR over this VQ-VAE"):
        train_shapes_var.main(["--out", str(tmp_path / "other"), "--vq", str(out / "vq"), "--role", "small",
                               "--steps", "1", "--sample-n", "0", "--train-n", "32", "--heldout-n", "16",
                               "--init-from", str(tmp_path / "wrong")])
