"""VARPipeline: the diffusers pipeline of VAR and CoDe (tiny random models, float32, CPU).

Save / load round trip through model_index.json, the output (a diffusers BaseOutput with `.images` and
`.stats`), both methods against the functions they run, a mismatched VQ-VAE, and the CLI on a saved
folder. Seeds, the progress bar, `.to()` and bad settings: test_class_conditional_pipelines.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.image_ar import ImageGenerationOutput, ScaleStats
from mmspec.image_ar.code import code_generate
from mmspec.image_ar.var import VAR, VARSampling
from mmspec.image_ar.var_pipeline import VARPipeline
from mmspec.pipelines import SpeculativePipeline
from mmspec.sampling import seeded_generator

from .pipeline_checks import assert_images_output, assert_np_images, assert_same_components
from .tiny_class_conditional import VAR_CLASSES as CLASSES
from .tiny_class_conditional import tiny_vq, var_of, var_pipeline


@pytest.fixture(scope="module")
def pipe():
    return var_pipeline()


@pytest.fixture(scope="module")
def vq(pipe):
    return pipe.vq


def maps(x) -> list[torch.Tensor]:
    """Per-scale token maps: a pipeline output's tokens cut at its stats' scale records, else a state's or
    code_generate's own list."""
    if hasattr(x, "token_maps"):
        return x.token_maps
    return list(x.tokens.split([record.side**2 for record in x.stats.scales], dim=1))


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
    assert maps_equal(maps(a), maps(b))
    pipe.refiner.save_pretrained(tmp_path / "refiner-2")  # a fine-tuned refiner beside the pipeline's own
    named = VARPipeline.from_pretrained(tmp_path, refiner="refiner-2")
    assert_same_components(pipe, named, ("refiner",))
    with pytest.raises(MMSpecError, match="refiner-9"):
        VARPipeline.from_pretrained(tmp_path, refiner="refiner-9")
    without = VARPipeline.from_pretrained(tmp_path, refiner=False)
    assert without.available_methods == ["ar"] and without.default_method == "ar"


def test_the_output_is_a_base_output_with_images_and_stats(pipe):
    out = pipe(prompt="blue square", method="code", seed=0, progress_bar=False, num_images=2)
    assert_images_output(out, 2, (8, 8))
    assert out.class_labels == [3, 3]
    assert out.stats.target_forwards == 2 and out.stats.drafter_forwards == 2  # the card's draft_scales = 2 of 4
    assert out.stats.new_tokens == 2 * (1 + 4 + 9 + 16)
    assert out.settings["draft_scales"] == 2 and out.settings["cfg"] == 2.0
    # one output family: every scale's tokens in scale order, typed per-scale records in the stats
    assert isinstance(out, ImageGenerationOutput) and isinstance(out.stats, ScaleStats)
    assert out.tokens.shape == (2, 1 + 4 + 9 + 16) and out.stats.draft_scales == 2
    assert [(r.scale, r.side, r.tokens, r.by, r.prefill) for r in out.stats.scales] == [
        (0, 1, 2, "model", False), (1, 2, 8, "model", False), (2, 3, 18, "refiner", True), (3, 4, 32, "refiner", False)]
    assert out.stats.scales_by("model") == 2 and out.stats.scales_by("refiner") == 2
    assert_np_images(pipe, 8)


def test_ar_is_the_large_model_alone(pipe, vq):
    out = pipe(class_labels=[2, 4], method="ar", generator=torch.Generator().manual_seed(9), progress_bar=False)
    state = pipe.model.begin([2, 4])
    pipe.model.run_scales(state, vq, 0, 4, VARSampling(cfg=2.0), seeded_generator("cpu", 9))
    assert maps_equal(maps(out), maps(state))
    assert out.stats.target_forwards == 4 and out.stats.drafter_forwards == 0
    other = pipe(class_labels=[2, 4], method="ar", seed=10, progress_bar=False)
    assert not maps_equal(maps(out), maps(other))  # control: the seed matters


@pytest.mark.parametrize("draft_scales", [1, 3])
def test_code_runs_code_generate_with_the_draft_scales(pipe, vq, draft_scales):
    out = pipe(class_labels=[0, 1], method="code", draft_scales=draft_scales, seed=4, progress_bar=False)
    direct = code_generate(pipe.model, pipe.refiner, vq, [0, 1], draft_scales, VARSampling(cfg=2.0),
                           seeded_generator("cpu", 4))
    assert maps_equal(maps(out), maps(direct))
    assert out.stats.target_forwards == draft_scales and out.stats.drafter_forwards == 4 - draft_scales


def test_greedy_code_with_the_large_models_weights_as_refiner_equals_ar(pipe, vq):
    twin = var_of(0, 3)
    same = VARPipeline(pipe.model, vq, twin, class_names=CLASSES)
    ar = same(class_labels=[1, 2], method="ar", temperature=0, progress_bar=False)
    code = same(class_labels=[1, 2], method="code", draft_scales=2, temperature=0, progress_bar=False)
    assert maps_equal(maps(ar), maps(code))
    other = pipe(class_labels=[1, 2], method="code", draft_scales=2, temperature=0, guidance_scale=1.5,
                 progress_bar=False)
    assert not maps_equal(maps(ar), maps(other))  # control: another refiner changes the last scales


def test_the_card_s_top_k_and_top_p_filter_every_scale_unless_given(pipe, vq):
    """CoDe's sampler filters each scale (top-k, top-p); a card may set them, a call overrides or turns them off."""
    filtered = VARPipeline(pipe.model, vq, pipe.refiner, class_names=CLASSES, card={**pipe.card, "top_k": 1, "top_p": 0.9})
    greedy = pipe(class_labels=[1, 2], method="code", temperature=0, progress_bar=False)
    out = filtered(class_labels=[1, 2], method="code", seed=3, progress_bar=False)
    assert maps_equal(maps(out), maps(greedy))  # top-1 of every scale: sampling is the argmax
    assert out.settings["top_k"] == 1 and out.settings["top_p"] == 0.9
    direct = code_generate(pipe.model, pipe.refiner, vq, [1, 2], 2, VARSampling(cfg=2.0, top_k=3, top_p=0.5),
                           seeded_generator("cpu", 3))
    given = filtered(class_labels=[1, 2], method="code", top_k=3, top_p=0.5, seed=3, progress_bar=False)
    assert maps_equal(maps(given), maps(direct))
    off = filtered(class_labels=[1, 2], method="code", top_k=0, top_p=1.0, seed=3, progress_bar=False)
    unfiltered = pipe(class_labels=[1, 2], method="code", seed=3, progress_bar=False)
    assert maps_equal(maps(off), maps(unfiltered))
    assert not maps_equal(maps(off), maps(out))  # control: the filters change the draws


def test_per_scale_temperatures_as_code_s_sampler(pipe, vq):
    """A list of temperatures applies one per scale (CoDe's official sampler: [1.1] * 7 + [1.0] * 3)."""
    scales = pipe.num_scales
    scalar = pipe(class_labels=[1, 2], method="code", temperature=0.7, seed=3, progress_bar=False)
    listed = pipe(class_labels=[1, 2], method="code", temperature=[0.7] * scales, seed=3, progress_bar=False)
    assert maps_equal(maps(listed), maps(scalar)) and listed.settings["temperature"] == [0.7] * scales
    direct = code_generate(pipe.model, pipe.refiner, vq, [1, 2], 2,
                           VARSampling(cfg=pipe.default_guidance_scale, temperature=[1.1] * (scales - 1) + [0.5]),
                           seeded_generator("cpu", 3))
    schedule = pipe(class_labels=[1, 2], method="code", temperature=[1.1] * (scales - 1) + [0.5], seed=3,
                    progress_bar=False)
    assert maps_equal(maps(schedule), maps(direct))
    hot_last = pipe(class_labels=[1, 2], method="code", temperature=[0.7] * (scales - 1) + [50.0], seed=3,
                    progress_bar=False)
    assert maps_equal(maps(hot_last)[:-1], maps(scalar)[:-1])  # the same draws up to the last scale
    assert not torch.equal(maps(hot_last)[-1], maps(scalar)[-1])  # control: the last scale's changed


def test_a_fine_tuned_refiner_runs_at_its_own_split_and_travels_with_the_pipeline(pipe, vq, tmp_path):
    """CoDe's specialised mode: a refiner fine-tuned for N runs when a call asks for N; the plain refiner elsewhere.
    Saved as refiner-N/ and listed in the card; loaded back by default, not when a refiner is named."""
    tuned = var_of(7, 3)
    both = VARPipeline(pipe.model, vq, pipe.refiner, class_names=CLASSES, card=pipe.card, fine_tuned_refiners={3: tuned})
    assert both.card["fine_tuned_refiners"] == [3]
    for n, refiner, name in ((3, tuned, "refiner-3"), (2, pipe.refiner, "refiner")):
        out = both(class_labels=[0, 2], method="code", draft_scales=n, seed=6, progress_bar=False)
        direct = code_generate(pipe.model, refiner, vq, [0, 2], n, VARSampling(cfg=2.0), seeded_generator("cpu", 6))
        assert maps_equal(maps(out), maps(direct)) and out.settings["refiner"] == name
    plain = pipe(class_labels=[0, 2], method="code", draft_scales=3, seed=6, progress_bar=False)
    assert not maps_equal(maps(plain), maps(both(class_labels=[0, 2], method="code", draft_scales=3, seed=6,
                                                 progress_bar=False)))  # control: the refiner matters
    both.save_pretrained(tmp_path)
    assert (tmp_path / "refiner-3" / "config.json").is_file()
    assert json.loads((tmp_path / "model_index.json").read_text())["card"]["fine_tuned_refiners"] == [3]
    loaded = VARPipeline.from_pretrained(tmp_path)
    assert list(loaded.fine_tuned_refiners) == [3]
    assert all(torch.equal(a, b) for a, b in zip(tuned.state_dict().values(),
                                                  loaded.fine_tuned_refiners[3].state_dict().values(), strict=True))
    assert loaded.to(torch.float64).fine_tuned_refiners[3].dtype == torch.float64  # moves with .to()
    named = VARPipeline.from_pretrained(tmp_path, refiner="refiner-3")
    assert named.fine_tuned_refiners == {} and named.card["fine_tuned_refiners"] == []
    assert named(class_labels=[0], method="code", draft_scales=2, seed=0, progress_bar=False).settings["refiner"] == "refiner-3"
    with pytest.raises(MMSpecError, match="draft_scales must be an integer in 1..3"):
        VARPipeline(pipe.model, vq, pipe.refiner, fine_tuned_refiners={4: tuned})
    other = VAR(vocab_size=16, Cvae=8, num_classes=4, depth=1, embed_dim=32, num_heads=2, patch_nums=pipe.model.patch_nums)
    with pytest.raises(MMSpecError, match="refiner for draft_scales 2 has 4 classes, the model 5"):
        VARPipeline(pipe.model, vq, pipe.refiner, fine_tuned_refiners={2: other})


def test_a_vq_of_another_vocabulary_is_refused(pipe):
    with pytest.raises(MMSpecError, match="does not match the VAR"):
        VARPipeline(pipe.model, tiny_vq(vocab_size=12))


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
    assert report["stats"]["draft_scales"] == 3
    assert [(s["scale"], s["by"]) for s in report["stats"]["scales"]] == [(0, "model"), (1, "model"), (2, "model"),
                                                                          (3, "refiner")]
    assert out.is_file()


def test_generate_image_takes_one_temperature_per_scale(saved, tmp_path, capsys):
    from mmspec.cli import main

    assert main(["generate-image", "red square", "--model", str(saved), "--method", "code", "--temperature",
                 "1.1,1.1,1.0,0.5", "--out", str(tmp_path / "x.png"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["temperature"] == [1.1, 1.1, 1.0, 0.5]


@pytest.mark.parametrize("argv, message", [
    (["--method", "code", "--draft-scales", "4"], "draft_scales must be an integer in 1..3"),
    (["--method", "sjd"], "unknown method 'sjd'; choose from ar, code"),
    (["--method", "ar", "--draft-scales", "2"], "draft_scales applies to method 'code' only"),
    (["--method", "code", "--lantern-k", "4"], "--lantern-k: options of LlamaGen-style methods"),
    (["--method", "code", "--top-p", "0"], "expected a number in (0, 1]"),
    (["--method", "code", "--temperature", "1.1,0,1"], "numbers > 0 separated by commas (one per scale)"),
    (["--method", "code", "--temperature", "1.1,1.0"], "2 temperatures for 4 scales"),
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
    for row in rows.values():  # token generation alone: the pipeline call without its VQ-VAE decoding
        assert 0 < row["generation_time_median_s"] < row["wall_time_median_s"]
    assert rows["ar"]["generation_speed_up"] == 1.0 and rows["code 1/3"]["generation_speed_up"] > 0


def test_bench_image_batches_the_var_rows(saved, capsys):
    """--batch-size B: B images per call in every row; every image is still made and judged once."""
    from mmspec.cli import main

    assert main(["bench", "image", "--model", str(saved), "--num-samples", "3", "--draft-scales", "2",
                 "--batch-size", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {row["method"]: row for row in report["methods"]}
    assert report["settings"]["batch_size"] == 2 and report["settings"]["images"] == 3
    assert rows["ar"]["target_forwards"] == 2 * 4  # two calls (2 + 1 images), four scales each
    assert rows["code 2/2"]["target_forwards"] == 2 * 2 and rows["code 2/2"]["drafter_forwards"] == 2 * 2


@pytest.mark.parametrize("flags, named", [
    (["--methods", "sjd"], "--methods"),
    (["--window", "8", "-k", "3"], "--window, --num-draft-tokens"),  # were ignored silently
])
def test_bench_image_refuses_llamagen_rows_for_a_var_model(saved, capsys, flags, named):
    from mmspec.cli import main

    assert main(["bench", "image", "--model", str(saved), "--num-samples", "1", *flags]) == 2
    assert f"{named}: options of LlamaGen-style rows" in capsys.readouterr().err


def test_bench_image_samples_every_var_row_with_the_given_filters(saved, capsys):
    from mmspec.cli import main

    assert main(["bench", "image", "--model", str(saved), "--num-samples", "1", "--draft-scales", "2", "--top-k", "1",
                 "--top-p", "0.5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["top_k"] == 1 and report["settings"]["top_p"] == 0.5
    assert main(["bench", "image", "--model", str(saved), "--num-samples", "1", "--draft-scales", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["top_k"] is None and report["settings"]["top_p"] is None  # the tiny card sets none


def test_the_bench_states_ar_s_own_spread_as_a_wilson_interval():
    from mmspec.image_ar.bench_report import ar_spread_note, wilson_interval

    low, high = wilson_interval(0.5, 100)
    assert (round(low, 3), round(high, 3)) == (0.404, 0.596)  # the textbook value
    assert wilson_interval(0.0, 10)[0] == 0.0 and wilson_interval(1.0, 10)[1] == 1.0
    note = ar_spread_note(0.5, 0.45, 100)
    assert "0.450 on the FD reference run" in note and "0.404-0.596" in note
