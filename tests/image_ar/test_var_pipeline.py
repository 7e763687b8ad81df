"""VARPipeline: the diffusers pipeline of VAR and CoDe (tiny random models, float32, CPU).

Save / load round trip through model_index.json, `.to()`, the progress bar, generators, the output
(a diffusers BaseOutput with `.images` and `.stats`), both methods against the functions they run,
and one clear error for each bad setting.
"""

from __future__ import annotations

import json

import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.image_ar.code import code_generate
from mmspec.image_ar.var import VAR, VARSampling
from mmspec.image_ar.var_pipeline import VARPipeline
from mmspec.image_ar.var_vq import tiny_var_vq
from mmspec.pipelines import SpeculativePipeline
from mmspec.sampling import seeded_generator

from .pipeline_checks import (assert_bad_conditions_refused, assert_images_output, assert_moves_to_bfloat16_and_back,
                              assert_not_a_saved_folder_is_refused, assert_np_images, assert_one_clear_error,
                              assert_same_components)

PATCH_NUMS = (1, 2, 3, 4)
CLASSES = ["red circle", "blue circle", "red square", "blue square", "green star"]


def var_of(seed: int, depth: int) -> VAR:
    torch.manual_seed(seed)
    return VAR(vocab_size=16, Cvae=8, num_classes=5, depth=depth, embed_dim=32, num_heads=2,
               patch_nums=PATCH_NUMS).eval()


@pytest.fixture(scope="module")
def vq():
    return tiny_var_vq(vocab_size=16, z_channels=8, patch_nums=PATCH_NUMS, seed=0)


@pytest.fixture(scope="module")
def pipe(vq):
    return VARPipeline(var_of(0, 3), vq, var_of(1, 1), class_names=CLASSES, model_name="tiny-var",
                       card={"draft_scales": 2, "cfg": 2.0})


def maps_equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_save_and_load_round_trip(pipe, tmp_path):
    pipe.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["_class_name"] == "VARPipeline"
    assert index["model"] == ["mmspec.image_ar.var", "VAR"] and index["vq"] == ["mmspec.image_ar.var_vq", "VQVAE"]
    assert index["card"] == {"draft_scales": 2, "cfg": 2.0} and index["class_names"] == CLASSES
    loaded = VARPipeline.from_pretrained(tmp_path)
    assert SpeculativePipeline.from_pretrained(tmp_path).__class__ is VARPipeline
    assert_same_components(pipe, loaded, ("model", "vq", "refiner"))
    a = pipe(class_labels=[1, 3], method="code", seed=5, progress_bar=False)
    b = loaded(class_labels=[1, 3], method="code", seed=5, progress_bar=False)
    assert maps_equal(a.token_maps, b.token_maps)
    without = VARPipeline.from_pretrained(tmp_path, refiner=False)
    assert without.available_methods == ["ar"] and without.default_method == "ar"


def test_the_output_is_a_base_output_with_images_and_stats(pipe):
    out = pipe(prompt="blue square", method="code", seed=0, progress_bar=False, num_images=2)
    assert_images_output(out, 2, (8, 8))
    assert out.class_labels == [3, 3]
    assert out.stats.target_forwards == 2 and out.stats.drafter_forwards == 2  # the card's draft_scales = 2 of 4
    assert out.stats.new_tokens == 2 * (1 + 4 + 9 + 16)
    assert out.settings["draft_scales"] == 2 and out.settings["cfg"] == 2.0
    assert_np_images(pipe, 8)


def test_ar_is_the_large_model_alone(pipe, vq):
    out = pipe(class_labels=[2, 4], method="ar", generator=torch.Generator().manual_seed(9), progress_bar=False)
    state = pipe.model.begin([2, 4])
    pipe.model.run_scales(state, vq, 0, 4, VARSampling(cfg=2.0), seeded_generator("cpu", 9))
    assert maps_equal(out.token_maps, state.token_maps)
    assert out.stats.target_forwards == 4 and out.stats.drafter_forwards == 0
    other = pipe(class_labels=[2, 4], method="ar", seed=10, progress_bar=False)
    assert not maps_equal(out.token_maps, other.token_maps)  # control: the seed matters


@pytest.mark.parametrize("draft_scales", [1, 3])
def test_code_runs_code_generate_with_the_draft_scales(pipe, vq, draft_scales):
    out = pipe(class_labels=[0, 1], method="code", draft_scales=draft_scales, seed=4, progress_bar=False)
    direct = code_generate(pipe.model, pipe.refiner, vq, [0, 1], draft_scales, VARSampling(cfg=2.0),
                           seeded_generator("cpu", 4))
    assert maps_equal(out.token_maps, direct.token_maps)
    assert out.stats.target_forwards == draft_scales and out.stats.drafter_forwards == 4 - draft_scales


def test_greedy_code_with_the_large_models_weights_as_refiner_equals_ar(pipe, vq):
    twin = var_of(0, 3)
    same = VARPipeline(pipe.model, vq, twin, class_names=CLASSES)
    ar = same(class_labels=[1, 2], method="ar", temperature=0, progress_bar=False)
    code = same(class_labels=[1, 2], method="code", draft_scales=2, temperature=0, progress_bar=False)
    assert maps_equal(ar.token_maps, code.token_maps)
    other = pipe(class_labels=[1, 2], method="code", draft_scales=2, temperature=0, guidance_scale=1.5,
                 progress_bar=False)
    assert not maps_equal(ar.token_maps, other.token_maps)  # control: another refiner changes the last scales


def test_to_moves_every_component_and_it_still_generates(vq):
    pipe = VARPipeline(var_of(0, 2), tiny_var_vq(vocab_size=16, z_channels=8, patch_nums=PATCH_NUMS), var_of(1, 1))
    assert_moves_to_bfloat16_and_back(pipe, ("model", "vq", "refiner"), "code")


def test_a_seed_is_a_cpu_generator_and_none_follows_torch_manual_seed(pipe):
    a = pipe(class_labels=3, method="code", seed=7, progress_bar=False)
    b = pipe(class_labels=3, method="code", generator=torch.Generator("cpu").manual_seed(7), progress_bar=False)
    assert maps_equal(a.token_maps, b.token_maps)
    torch.manual_seed(1)
    c = pipe(class_labels=3, method="code", progress_bar=False)
    torch.manual_seed(1)
    d = pipe(class_labels=3, method="code", progress_bar=False)
    assert maps_equal(c.token_maps, d.token_maps)


def test_the_progress_bar_counts_scales_and_can_be_hidden(pipe, capsys):
    pipe(class_labels=0, method="code", seed=0)
    assert "image (code)" in capsys.readouterr().err
    pipe(class_labels=0, method="code", seed=0, progress_bar=False)
    assert "image (code)" not in capsys.readouterr().err
    pipe.set_progress_bar_config(disable=True)
    try:
        pipe(class_labels=0, method="ar", seed=0)
        assert "image (ar)" not in capsys.readouterr().err
    finally:
        pipe.set_progress_bar_config(disable=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "code", "draft_scales": 0}, "draft_scales must be an integer in 1..3"),
    ({"method": "code", "draft_scales": 4}, "draft_scales must be an integer in 1..3"),
    ({"method": "code", "draft_scales": True}, "draft_scales must be an integer in 1..3"),
    ({"method": "code", "draft_scales": "2"}, "draft_scales must be an integer in 1..3"),
    ({"method": "ar", "draft_scales": 2}, "draft_scales applies to method 'code' only"),
    ({"method": "sjd"}, "unknown method 'sjd'; choose from ar, code"),
    ({"method": "code", "guidance_scale": -1.0}, "guidance_scale must be a finite number >= 0"),
    ({"method": "code", "temperature": float("nan")}, "temperature must be a finite number >= 0"),
    ({"method": "code", "top_k": 0}, "top_k must be an integer >= 1"),
    ({"method": "ar", "output_type": "pt"}, "output_type must be one of pil, np"),
])
def test_bad_settings_are_one_clear_error(pipe, kwargs, message):
    assert_one_clear_error(pipe, kwargs, message)


def test_bad_conditions_and_a_missing_refiner_are_refused(pipe, vq):
    assert_bad_conditions_refused(pipe, 5)
    with pytest.raises(MMSpecError, match="needs a refiner"):
        VARPipeline(pipe.model, vq)(class_labels=0, method="code", progress_bar=False)
    with pytest.raises(MMSpecError, match="does not match the VAR"):
        VARPipeline(pipe.model, tiny_var_vq(vocab_size=12, z_channels=8, patch_nums=PATCH_NUMS))


def test_a_folder_that_is_no_saved_var_pipeline_is_one_error(tmp_path):
    assert_not_a_saved_folder_is_refused(VARPipeline, tmp_path, "is not a zoo VAR model", "SpeculativeImagePipeline")


# ---- the CLI: generate-image and bench image on a saved VAR pipeline ------------------------------

@pytest.fixture(scope="module")
def saved(pipe, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-var")
    pipe.save_pretrained(folder)
    return folder


def test_generate_image_runs_code_with_the_draft_scales(saved, tmp_path, capsys):
    from mmspec.cli import main

    out = tmp_path / "x.png"
    assert main(["generate-image", "red square", "--model", str(saved), "--method", "code", "--draft-scales", "3",
                 "--seed", "2", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["method"] == "code" and report["class_id"] == 2 and report["settings"]["draft_scales"] == 3
    assert report["stats"]["target_forwards"] == 3 and report["stats"]["drafter_forwards"] == 1
    assert out.is_file()


@pytest.mark.parametrize("argv, message", [
    (["--method", "code", "--draft-scales", "4"], "draft_scales must be an integer in 1..3"),
    (["--method", "sjd"], "unknown method 'sjd'; choose from ar, code"),
    (["--method", "ar", "--draft-scales", "2"], "draft_scales applies to method 'code' only"),
    (["--method", "code", "--lantern-k", "4"], "--lantern-k: options of LlamaGen-style methods"),
])
def test_generate_image_bad_settings_are_one_line_and_exit_2(saved, tmp_path, capsys, argv, message):
    from mmspec.cli import main

    code = main(["generate-image", "red circle", "--model", str(saved), "--out", str(tmp_path / "x.png"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("mmspec: error:") and message in err[-1]
    assert not (tmp_path / "x.png").exists()


def test_bench_image_has_the_ar_and_code_rows(saved, capsys):
    from mmspec.cli import main

    assert main(["bench", "image", "--model", str(saved), "--num-samples", "2", "--draft-scales", "3", "1",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {row["method"]: row for row in report["methods"]}
    assert list(rows) == ["ar", "code 3/1", "code 1/3"]
    assert rows["ar"]["target_forwards"] == 2 * 4 and rows["ar"]["drafter_forwards"] == 0
    assert rows["code 1/3"]["target_forwards"] == 2 and rows["code 1/3"]["drafter_forwards"] == 2 * 3
    assert rows["code 3/1"]["memory_mb"] > rows["ar"]["memory_mb"] > 0
    assert any("the model card names no judge" in note for note in report["notes"])


@pytest.mark.parametrize("flags, named", [
    (["--methods", "sjd"], "--methods"),
    (["--window", "8", "-k", "3"], "--window, --num-draft-tokens"),  # were ignored silently
])
def test_bench_image_refuses_llamagen_rows_for_a_var_model(saved, capsys, flags, named):
    from mmspec.cli import main

    assert main(["bench", "image", "--model", str(saved), "--num-samples", "1", *flags]) == 2
    assert f"{named}: options of LlamaGen-style rows" in capsys.readouterr().err
