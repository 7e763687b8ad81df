"""The shapes-image-ar data module: classes, text parsing, seeded examples, renders, plumbing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.image_ar import tiny_vq
from mmspec.image_ar.recipes import (
    build_shapes_image_ar,
    train_shapes_drafter,
    train_shapes_image_ar,
    train_shapes_judge,
    train_shapes_vq,
)
from mmspec.image_ar.recipes import (
    image_ar_data as data,
)
from mmspec.training import warmup_cosine
from mmspec.world import BACKGROUNDS, COLOURS, KINDS
from mmspec.world.scenes import RGB


def test_classes_are_every_kind_times_every_colour_in_id_order():
    names = data.label_names()
    assert len(names) == data.NUM_CLASSES == len(KINDS) * len(COLOURS) == 24
    assert len(set(names)) == 24 and names[0] == "red circle"
    for label, name in enumerate(names):
        kind, colour = data.class_parts(label)
        assert name == f"{colour} {kind}"
        assert data.class_id(kind, colour) == label
    with pytest.raises(MMSpecError):
        data.class_parts(24)


@pytest.mark.parametrize(
    "text, name",
    [
        ("red circle", "red circle"),
        ("a big red ball", "red circle"),
        ("  Circle, RED! ", "red circle"),
        ("two blue boxes", "blue square"),
        ("an orange star on a white background", "orange star"),
        ("purple discs", "purple circle"),
        ("5", "orange circle"),
    ],
)
def test_class_from_text_reads_one_colour_and_one_shape(text, name):
    assert data.label_names()[data.class_from_text(text)] == name


@pytest.mark.parametrize("text", ["circle", "red", "", "a red and blue circle", "red circle and a star", "99", "cat"])
def test_class_from_text_explains_what_is_valid(text):
    with pytest.raises(MMSpecError) as info:
        data.class_from_text(text)
    message = str(info.value)
    assert "red circle" in message and "orange star" in message and "ball" in message


def test_examples_are_seeded_balanced_and_split_apart():
    scene, label = data.example(5, seed=0, split="train")
    assert data.example(5, seed=0, split="train") == (scene, label)
    assert label == 5
    assert data.example(5 + data.NUM_CLASSES)[1] == 5
    assert data.example(5, seed=0, split="heldout")[0] != scene
    assert data.example(5, seed=1, split="train")[0] != scene
    (shape,) = scene.shapes
    assert (shape.kind, shape.colour) == data.class_parts(label)
    assert shape.motion == "still" and scene.background in BACKGROUNDS
    assert 0.15 <= shape.x <= 0.85 and 0.15 <= shape.y <= 0.85


def test_rendered_images_show_the_class_colour_on_the_background():
    batch = data.images(30, seed=0, split="heldout")
    assert batch.images.shape == (30, 3, data.IMAGE_SIZE, data.IMAGE_SIZE) and batch.images.dtype == torch.uint8
    assert batch.labels.tolist() == [i % 24 for i in range(30)]
    for i in range(30):
        scene, label = data.example(i, 0, "heldout")
        pixels = {tuple(p) for p in batch.images[i].permute(1, 2, 0).reshape(-1, 3).tolist()}
        assert RGB[data.class_parts(label)[1]] in pixels and RGB[scene.background] in pixels
    assert len({scene.background for scene, _ in (data.example(i) for i in range(60))}) == len(BACKGROUNDS)
    assert torch.equal(data.Stream(0, "heldout").take(30).images, batch.images)


def test_value_ranges_round_trip():
    x = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    f = data.to_model_range(x)
    assert f.min() >= -1 and f.max() <= 1
    assert torch.equal(data.to_uint8(f), x)


def test_learning_rate_schedule_warms_up_then_decays_to_a_tenth():
    assert warmup_cosine(0, 100, 10, floor=0.1, peak=1.0) == pytest.approx(0.1)
    assert warmup_cosine(10, 100, 10, floor=0.1, peak=1.0) == pytest.approx(1.0)
    assert warmup_cosine(100, 100, 10, floor=0.1, peak=1.0) == pytest.approx(0.1)


@pytest.mark.parametrize("recipe", [train_shapes_vq, train_shapes_judge, train_shapes_image_ar, train_shapes_drafter,
                                    build_shapes_image_ar])
def test_recipes_never_write_into_the_package_without_into_zoo(recipe, capsys):
    files = sorted((p, p.stat().st_mtime_ns) for p in data.ZOO_DIR.rglob("*"))
    for out in (data.ZOO_DIR, data.ZOO_DIR / "vq"):
        with pytest.raises(SystemExit) as exit_info:
            recipe.main(["--out", str(out), "--steps", "1"] if recipe is not build_shapes_image_ar else ["--out", str(out), "--smoke"])
        assert exit_info.value.code == 2
        assert "inside the installed mmspec package; pass --into-zoo" in capsys.readouterr().err
    assert sorted((p, p.stat().st_mtime_ns) for p in data.ZOO_DIR.rglob("*")) == files


def test_build_defaults_are_the_shipped_build():
    card = json.loads((data.ZOO_DIR / "zoo_card.json").read_text())
    shipped = card["rebuild_command"].split()
    assert shipped[:3] == ["python", "-m", "mmspec.image_ar.recipes.build_shapes_image_ar"]
    defaults = build_shapes_image_ar.build_parser().parse_args([])
    for flag, value in zip(shipped[3::2], shipped[4::2]):
        assert float(getattr(defaults, flag[2:].replace("-", "_"))) == float(value), flag


def test_recipe_output_folder_defaults_to_the_working_directory():
    parser = data.recipe_parser("doc", "the model", max_minutes=1.0, batch_size=1, lr=1e-3, warmup=1)
    assert data.parse_recipe_args(parser, []).out == data.NAME  # ./shapes-image-ar
    assert data.parse_recipe_args(parser, ["--out", "/tmp/run"]).out == "/tmp/run"
    assert data.parse_recipe_args(parser, ["--into-zoo"]).out == str(data.ZOO_DIR)  # only when told


def test_card_sections_merge_and_classes_are_written(tmp_path):
    data.update_card(tmp_path, "vq", {"params": 1, "train_wall_time_s": 2.0})
    card = data.update_card(tmp_path, "target", {"params": 5, "guidance_scale": 2.0, "train_wall_time_s": 3.0})
    assert card["pipeline"] == "mmspec.image_ar.SpeculativeImagePipeline" and card["default_method"] == "gsd"
    assert (card["image_size"], card["grid"], card["params"]) == (64, 16, 5)
    assert card["components"]["vq"]["params"] == 1 and card["train_wall_time_total_s"] == 5.0
    assert json.loads((tmp_path / "classes.json").read_text()) == data.label_names()
    assert json.loads((tmp_path / "zoo_card.json").read_text()) == card


def test_codes_are_encoded_once_and_cached(tmp_path):
    vq = tiny_vq(codebook_size=16, embed_dim=4, levels=3, ch=8)  # downsample 4: 64 x 64 -> 16 x 16
    vq.save_pretrained(tmp_path / "vq")
    codes, labels = data.cached_codes(tmp_path / "vq", 6, 0, "train", cache_dir=tmp_path / "cache")
    assert codes.shape == (6, data.GRID * data.GRID) and labels.tolist() == list(range(6))
    assert int(codes.min()) >= 0 and int(codes.max()) < 16
    (cached,) = (tmp_path / "cache").iterdir()
    again, _ = data.cached_codes(tmp_path / "vq", 6, 0, "train", cache_dir=tmp_path / "cache")
    assert torch.equal(again, codes) and list((tmp_path / "cache").iterdir()) == [cached]
    expected = vq.encode(data.to_model_range(data.images(6).images)).flatten(1)
    assert np.array_equal(codes.long().numpy(), expected.numpy())


def test_autocast_state_reports_what_really_ran():
    # Cards must not claim bf16 on a CPU without it: the state follows the request AND the hardware.
    assert data.autocast_state(False) == "off"
    assert data.autocast_state(True) == ("on" if data.bf16_supported() else "off")
