"""The zoo's shapes-mar: it loads by name as a MARPipeline, ar and cspd make 64x64 images, the CLI writes one,
and the card states what the judge measured. Skips when the zoo has no shapes-mar
(rebuild: the card's rebuild_command)."""

from __future__ import annotations

import json

import pytest

from mmspec.image_ar.mar_pipeline import MARPipeline
from mmspec.image_ar.recipes import train_toy_mar

pytestmark = pytest.mark.skipif(not (train_toy_mar.ZOO_DIR / "model_index.json").is_file(),
                                reason="no shapes-mar in the zoo")


@pytest.fixture(scope="module")
def pipe():
    return MARPipeline.from_pretrained("shapes-mar")


def test_it_loads_by_name_with_both_methods(pipe):
    assert pipe.available_methods == ["ar", "cspd"] and pipe.default_method == "cspd" and pipe.card["num_iter"] == 16
    assert pipe.model.seq_len == 16 and pipe.class_names[0] == "red circle" and pipe.draft is not None
    out = pipe(prompt="blue square", method="cspd", num_iter=8, num_draft=2, seed=0, progress_bar=False, num_images=2)
    assert [image.size for image in out.images] == [(64, 64)] * 2
    assert out.stats.drafter_forwards > 0 and out.stats.drafted > 0


def test_the_cli_writes_a_cspd_image(tmp_path, capsys):
    from mmspec.cli import main

    out = tmp_path / "red.png"
    assert main(["generate-image", "red circle", "--model", "shapes-mar", "--method", "cspd", "--num-iter", "8",
                 "--draft-steps", "2", "--out", str(out), "--json", "--threads", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stats"]["drafter_forwards"] > 0 and out.is_file()


def test_the_card_states_the_measured_judge_accuracy():
    card = json.loads((train_toy_mar.ZOO_DIR / "zoo_card.json").read_text())
    assert card["quality"]["vae_judge_accuracy_reconstructions"] > 0.5
    assert any(key.startswith("model_class_accuracy_cfg") for key in card["quality"])
    assert card["pipeline_defaults"]["judge"] == "shapes-image-ar"
    assert card["train_wall_time_s"] > 0 and card["rebuild_command"].startswith("python -m mmspec.image_ar.recipes.")
