"""The zoo's shapes-var: it loads by name as a VARPipeline, CoDe and ar make 64x64 images, the CLI writes one,
and the card states what the judge measured. Skips when the zoo has no shapes-var
(rebuild: python -m mmspec.image_ar.recipes.build_shapes_var --into-zoo)."""

from __future__ import annotations

import json

import pytest

from mmspec.image_ar.recipes import shapes_var
from mmspec.image_ar.var_pipeline import VARPipeline

pytestmark = pytest.mark.skipif(not (shapes_var.ZOO_DIR / "model_index.json").is_file(), reason="no shapes-var in the zoo")


@pytest.fixture(scope="module")
def pipe():
    return VARPipeline.from_pretrained("shapes-var")


def test_it_loads_by_name_with_both_methods(pipe):
    assert pipe.available_methods == ["ar", "code"] and pipe.default_method == "code"
    assert pipe.model.patch_nums == shapes_var.PATCH_NUMS and pipe.class_names[0] == "red circle"
    out = pipe(prompt="blue square", method="code", seed=0, progress_bar=False, num_images=2)
    assert [image.size for image in out.images] == [(64, 64)] * 2
    assert out.stats.target_forwards == pipe.default_draft_scales


def test_code_runs_the_refiner_fine_tuned_for_the_split_asked(pipe):
    """The card's default 6/2 runs refiner-6; a split without its own fine-tune runs the training-free refiner/."""
    assert pipe.default_draft_scales == 6 and sorted(pipe.fine_tuned_refiners) == [4, 6]
    for n, name in ((None, "refiner-6"), (4, "refiner-4"), (7, "refiner")):
        out = pipe(class_labels=0, method="code", draft_scales=n, seed=0, progress_bar=False)
        assert out.settings["refiner"] == name


def test_the_cli_writes_a_code_image(tmp_path, capsys):
    from mmspec.cli import main

    out = tmp_path / "red.png"
    assert main(["generate-image", "red circle", "--model", "shapes-var", "--method", "code", "--draft-scales", "6",
                 "--out", str(out), "--json", "--threads", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stats"]["target_forwards"] == 6 and report["stats"]["drafter_forwards"] == 2 and out.is_file()


def test_the_card_states_the_measured_judge_accuracy():
    card = json.loads((shapes_var.ZOO_DIR / "zoo_card.json").read_text())
    assert card["quality"]["vq_reconstruction_class_accuracy"] > 0.5
    assert any(key.startswith("model_class_accuracy") for key in card["quality"])
    assert card["train_wall_time_s"] > 0 and card["rebuild_command"].startswith("python -m mmspec.image_ar.recipes.")
