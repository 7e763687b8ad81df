"""The toy MAR recipe runs 3 steps of each stage, and what it saves loads into a working CSpD pair."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import AutoencoderKL

from mmspec.image_ar.cspd import cspd_generate
from mmspec.image_ar.mar import MAR
from mmspec.image_ar.recipes import train_toy_mar
from mmspec.sampling import seeded_generator

SMOKE = ["--steps", "3", "--batch-size", "4", "--width-mult", "0.25", "--vae-ch", "8", "--sampling-steps", "5",
         "--diffusion-batch-mul", "1", "--threads", "1", "--train-n", "16", "--sample-n", "0"]


@pytest.mark.slow
def test_three_steps_of_each_stage_save_a_loadable_pair(tmp_path):
    out = tmp_path / "shapes-mar"
    info = train_toy_mar.main(["--stage", "all", "--out", str(out), *SMOKE])
    assert [info[s]["steps"] for s in ("vae", "target", "draft")] == [3, 3, 3]
    assert json.loads((out / "model" / "training.json").read_text())["steps"] == 3
    vae = AutoencoderKL.from_pretrained(out / "vae", torch_dtype=torch.float32).eval()
    target = MAR.from_pretrained(out / "model", torch_dtype=torch.float32).eval()
    draft = MAR.from_pretrained(out / "draft", torch_dtype=torch.float32).eval()
    assert target.seq_len == 16 and target.token_embed_dim == 64 and vae.config.scaling_factor != 1.0
    assert sum(p.numel() for p in draft.parameters()) < sum(p.numel() for p in target.parameters())
    result = cspd_generate(draft, target, 1, labels=torch.tensor([3]), num_iter=4, num_draft=2,
                           generator=seeded_generator("cpu", 0))
    with torch.no_grad():
        image = vae.decode(target.unpatchify(result.tokens) / vae.config.scaling_factor).sample
    assert image.shape == (1, 3, 64, 64) and torch.isfinite(image).all()


def test_a_model_stage_without_a_vae_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        train_toy_mar.main(["--stage", "target", "--out", str(tmp_path / "x"), *SMOKE])
    assert info.value.code == 2 and "run --stage vae first" in capsys.readouterr().err


@pytest.mark.slow
def test_the_three_stages_make_a_saved_pipeline(tmp_path):
    from mmspec.image_ar.mar_pipeline import MARPipeline

    out = tmp_path / "shapes-mar"
    train_toy_mar.main(["--stage", "all", "--out", str(out), *SMOKE])
    assert json.loads((out / "model_index.json").read_text())["_class_name"] == "MARPipeline"
    pipe = MARPipeline.from_pretrained(out)
    assert pipe.draft is not None and pipe.class_names[3] == train_toy_mar.data.label_names()[3]
    image = pipe(prompt=pipe.class_names[3], method="cspd", num_iter=4, seed=0, progress_bar=False).images[0]
    assert image.size == (64, 64)


@pytest.mark.slow
def test_init_from_continues_a_saved_mar(tmp_path, capsys):
    out = tmp_path / "shapes-mar"
    train_toy_mar.main(["--stage", "all", "--out", str(out), *SMOKE])
    saved = tmp_path / "first"
    (out / "model").rename(saved)
    info = train_toy_mar.main(["--stage", "target", "--out", str(out), "--init-from", str(saved), *SMOKE,
                               "--steps", "1", "--lr", "1e-12", "--warmup", "0"])
    assert info["target"]["continued_from"] == str(saved) and info["target"]["earlier_training"]["steps"] == 3
    before = MAR.from_pretrained(saved).state_dict()
    after = MAR.from_pretrained(out / "model").state_dict()
    assert before.keys() == after.keys() and all(torch.allclose(before[k], after[k], atol=1e-3) for k in before)
    with pytest.raises(SystemExit) as usage:
        train_toy_mar.main(["--stage", "all", "--out", str(out), "--init-from", str(saved), *SMOKE])
    assert usage.value.code == 2 and "--stage vae, target or draft" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="cannot load the MAR in"):
        train_toy_mar.main(["--stage", "draft", "--out", str(out), "--init-from", str(tmp_path / "none"), *SMOKE])


@pytest.mark.slow
def test_the_card_stage_judges_every_part_and_sets_the_best_cfg(tmp_path):
    out = tmp_path / "shapes-mar"
    info = train_toy_mar.main(["--stage", "all", "--out", str(out), *SMOKE, "--sample-n", "2", "--eval-cfgs", "1", "2"])
    card = json.loads((out / "zoo_card.json").read_text())
    assert card == info["card"] and card["name"] == "shapes-mar" and card["default_method"] == "cspd"
    parts = card["components"]
    assert set(parts) == {"model", "vae", "draft"} and parts["model"]["steps"] == 3
    assert 0 <= parts["vae"]["quality"]["judge_accuracy_reconstructions"] <= 1
    accuracy = {cfg: parts["model"]["quality"][f"cfg_{cfg}"]["class_accuracy"] for cfg in ("1", "2")}
    best = max((a, float(c)) for c, a in accuracy.items())[1]
    assert card["pipeline_defaults"]["cfg"] == best == json.loads((out / "model_index.json").read_text())["card"]["cfg"]
    assert list(parts["draft"]["quality"]) == ["images_per_cfg", "method", "num_iter", f"cfg_{best:g}"]
    assert card["total_size_bytes"] > parts["model"]["file_size_bytes"] > 0 and card["train_wall_time_s"] > 0
    assert {"name", "params", "trained_on", "quality", "rebuild_command", "role"} <= set(card)
    with pytest.raises(SystemExit):
        train_toy_mar.main(["--stage", "card", "--out", str(tmp_path / "empty"), *SMOKE])


def test_the_card_headline_is_what_zoo_list_shows():
    from mmspec.image_ar.recipes.shapes_mar_card import headline_quality, part_walls

    parts = {"vae": {"quality": {"heldout_psnr_db": 26.0, "judge_accuracy_reconstructions": 0.8, "heldout_images": 480}},
             "model": {"quality": {"images_per_cfg": 96, "cfg_3": {"class_accuracy": 0.5, "sampling_seconds": 9}}}}
    assert headline_quality(parts) == {"vae_heldout_psnr_db": 26.0, "vae_judge_accuracy_reconstructions": 0.8,
                                       "model_class_accuracy_cfg_3": 0.5}
    assert part_walls({"train_wall_time_s": 5, "earlier_training": {"train_wall_time_s": 7}}) == [5, 7]
