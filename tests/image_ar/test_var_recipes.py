"""The shapes-var recipes end to end with tiny settings (3 steps each): the VQ-VAE, both VARs, the saved
pipeline they make, its card, CoDe's fine-tune; and that no recipe writes into the package without --into-zoo."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mmspec.image_ar.recipes import (
    build_shapes_var,
    shapes_var,
    train_shapes_var,
    train_shapes_var_code,
    train_shapes_var_vq,
)
from mmspec.image_ar.var import VAR
from mmspec.image_ar.var_pipeline import VARPipeline


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.fixture(scope="module")
def smoke_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "shapes-var"
    build_shapes_var.main(["--out", str(out), "--smoke", "--threads", "1"])
    return out


@pytest.fixture
def built(smoke_build, tmp_path):
    """A copy of one three-step build, for a test to write into."""
    return Path(shutil.copytree(smoke_build, tmp_path / "shapes-var"))


def code_recipe(out, *argv):
    return train_shapes_var_code.main(["--out", str(out), "--steps", "2", "--train-n", "32", "--heldout-n", "16",
                                       "--sample-n", "24", "--threads", "1", "--cache-dir", str(out / "smoke-cache"),
                                       *argv])


@pytest.mark.slow
def test_code_fine_tune_writes_a_refiner_and_a_drafter_for_one_n(built):
    """Each stage writes STAGE-N/ (a VAR the pipeline takes as its refiner or as a model) and a card section with
    the quality before and after; the refiner's before/after KL is to the large VAR on the scales it generates."""
    out = built
    assert VARPipeline.from_pretrained(out).default_draft_scales == 7  # no fine-tuned refiner yet: 7/1
    info = code_recipe(out, "--stage", "refiner", "--draft-scales", "6")
    listed = VARPipeline.from_pretrained(out)  # the saved pipeline now runs refiner-6 at 6/2, its new default
    assert list(listed.fine_tuned_refiners) == [6] and listed.default_draft_scales == 6
    assert listed(class_labels=0, method="code", seed=0, progress_bar=False).settings["refiner"] == "refiner-6"
    for when in ("before", "after"):
        quality = info["quality"][when]
        assert quality["heldout_kl_to_large_on_refined_scales"] >= 0 and 0 <= quality["code_6_class_accuracy_cfg_1.5"] <= 1
    info = code_recipe(out, "--stage", "drafter", "--draft-scales", "5", "--sample-n", "0")
    assert set(info["quality"]["after"]) == {"heldout_token_loss_on_drafted_scales"}
    card = json.loads((out / "zoo_card.json").read_text())["components"]
    assert {"refiner-6", "drafter-5"} <= set(card) and "--stage refiner --draft-scales 6" in card["refiner-6"]["rebuild_command"]
    pipe = VARPipeline.from_pretrained(out, refiner=str(out / "refiner-6"))
    assert pipe(class_labels=0, method="code", draft_scales=6, seed=0, progress_bar=False).images[0].size == (64, 64)
    assert VAR.from_pretrained(out / "drafter-5").patch_nums == shapes_var.PATCH_NUMS


@pytest.mark.slow
def test_code_refiner_distils_on_the_large_var_s_own_samples_too(built):
    """--large-samples M: M sequences the large VAR samples itself (classes in turn) join the real ones, a share of
    every batch; the card and the rebuild command say so, and the samples are cached for the next run."""
    out = built
    info = code_recipe(out, "--stage", "refiner", "--draft-scales", "6", "--sample-n", "0", "--large-samples", "12",
                       "--sample-share", "0.25")
    assert "12 of the large VAR's own samples" in info["trained_on"] and "8 of every batch" in info["trained_on"]
    assert "--large-samples 12 --sample-share 0.25" in info["rebuild_command"]
    cached = list((out / "smoke-cache").glob("var-large-samples-*.pt"))
    assert len(cached) == 1
    saved = torch.load(cached[0], weights_only=True)
    large = VAR.from_pretrained(out / "model")
    assert saved["codes"].shape == (12, large.L) and saved["labels"].tolist() == [i % large.num_classes for i in range(12)]
    assert int(saved["codes"].max()) < large.V


@pytest.mark.slow
@pytest.mark.parametrize("argv, message", [
    (["--stage", "drafter", "--large-samples", "4"], "use it with --stage refiner"),
    (["--stage", "refiner", "--large-samples", "-1"], "--large-samples must be >= 0"),
])
def test_code_recipe_refuses_bad_sample_settings(built, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        code_recipe(built, "--draft-scales", "6", *argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_code_refiner_fine_tune_moves_towards_the_large_var_on_its_scales(built, tmp_path):
    """Eight steps of stage two (its own scales only) lower the refiner's KL to the large VAR on those scales; the
    control, a learning rate too small to move the weights, leaves it where it was."""
    out = built
    start = VAR.from_pretrained(out / "refiner")  # three smoke steps leave both near uniform: make this one far from it
    with torch.no_grad():
        start.head.weight.mul_(200.0)
    start.save_pretrained(tmp_path / "start")
    common = ("--stage", "refiner", "--draft-scales", "6", "--sample-n", "0", "--warmup", "0", "--all-scales-share", "0",
              "--steps", "8", "--init-from", str(tmp_path / "start"))

    def kl(info):
        return [info["quality"][w]["heldout_kl_to_large_on_refined_scales"] for w in ("before", "after")]

    before, after = kl(code_recipe(out, *common, "--lr", "0.01"))
    assert after < 0.95 * before
    before, after = kl(code_recipe(out, *common, "--lr", "1e-12"))
    assert after == pytest.approx(before, rel=1e-3)  # only the fp16 rounding of the saved weights


@pytest.mark.slow
def test_continuing_a_fine_tuned_refiner_keeps_its_earlier_runs_in_the_card(built):
    """--init-from OUT/refiner-N continues that refiner: the card keeps each earlier run, sums the training time and
    chains the rebuild commands, so the section still says how to remake what ships."""
    out = built
    first = code_recipe(out, "--stage", "refiner", "--draft-scales", "6", "--sample-n", "0")
    assert "earlier_runs" not in first and "--init-from" not in first["rebuild_command"]
    second = code_recipe(out, "--stage", "refiner", "--draft-scales", "6", "--sample-n", "0", "--all-scales-share", "0",
                         "--init-from", str(out / "refiner-6"))
    third = code_recipe(out, "--stage", "refiner", "--draft-scales", "6", "--sample-n", "0", "--all-scales-share", "0",
                        "--init-from", str(out / "refiner-6"))
    card = json.loads((out / "zoo_card.json").read_text())["components"]["refiner-6"]
    assert card == json.loads(json.dumps(third))
    assert [run["rebuild_command"] for run in card["earlier_runs"]] == [
        first["rebuild_command"], f"{first['rebuild_command']} && {second['rebuild_command'].split(' && ')[-1]}"]
    commands = card["rebuild_command"].split(" && ")
    assert len(commands) == 3 and all(c.endswith("--init-from shapes-var/refiner-6 --all-scales-share 0")
                                      for c in commands[1:])
    runs = card["earlier_runs"]  # each run's own time; a section's total counts every run
    assert runs[0]["train_wall_time_s"] == first["train_wall_time_s"]
    assert runs[1]["train_wall_time_s"] == pytest.approx(second["train_wall_time_s"] - first["train_wall_time_s"], abs=0.2)
    assert card["train_wall_time_s"] > second["train_wall_time_s"] > first["train_wall_time_s"] > 0
    assert "continued from its own earlier runs" in card["trained_on"] and "scales 6..7 only" in card["trained_on"]
    other = code_recipe(out, "--stage", "refiner", "--draft-scales", "4", "--sample-n", "0",
                        "--init-from", str(out / "refiner-6"))  # another section's weights: a fresh start, named
    assert "earlier_runs" not in other and f"--init-from {out / 'refiner-6'}" in other["rebuild_command"]


@pytest.mark.slow
@pytest.mark.parametrize("argv, message", [
    (["--draft-scales", "8"], "draft_steps must be in 1..7"),
    (["--draft-scales", "0"], "draft_steps must be in 1..7"),
])
def test_code_fine_tune_refuses_a_draft_scale_count_outside_the_scales(built, argv, message):
    out = built
    with pytest.raises(SystemExit, match=message):
        code_recipe(out, "--stage", "refiner", *argv)
