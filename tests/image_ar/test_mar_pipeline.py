"""MARPipeline: the diffusers pipeline of MAR and CSpD (tiny random MARs + a tiny AutoencoderKL, float32, CPU).

Save / load round trip through model_index.json, the output (a diffusers BaseOutput with `.images` and
`.stats`), both methods against the functions they run (cspd with draft == target against ar, with a
failing control), mismatched parts, and the CLI (generate-image, bench image) on a saved folder. Seeds,
the progress bar, `.to()` and bad settings: test_class_conditional_pipelines.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.image_ar import ImageGenerationOutput, SpeculativeImagePipeline, StepStats
from mmspec.image_ar.mar import tiny_mar
from mmspec.image_ar.mar_pipeline import MARPipeline
from mmspec.image_ar.masked_decode import target_generate
from mmspec.pipelines import SpeculativePipeline
from mmspec.sampling import seeded_generator

from .pipeline_checks import assert_images_output, assert_np_images, assert_same_components
from .tiny_class_conditional import MAR_CARD as CARD
from .tiny_class_conditional import MAR_CLASSES as CLASSES
from .tiny_class_conditional import mar_pipeline

EXACT = dict(num_draft=1, prefill_ratio=0.0)  # where cspd_generate with draft == target gives the ar output


@pytest.fixture(scope="module")
def pipe():
    return mar_pipeline()


def test_save_and_load_round_trip(pipe, tmp_path):
    pipe.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["_class_name"] == "MARPipeline"
    assert index["model"] == ["mmspec.image_ar.mar", "MAR"] and index["draft"] == ["mmspec.image_ar.mar", "MAR"]
    assert index["vae"] == ["diffusers", "AutoencoderKL"] and index["card"] == CARD and index["class_names"] == CLASSES
    loaded = MARPipeline.from_pretrained(tmp_path)
    assert SpeculativePipeline.from_pretrained(tmp_path).__class__ is MARPipeline
    assert SpeculativeImagePipeline.from_pretrained(tmp_path).__class__ is MARPipeline
    assert_same_components(pipe, loaded, ("model", "vae", "draft"))
    a = pipe(class_labels=[1, 3], method="cspd", seed=5, progress_bar=False)
    b = loaded(class_labels=[1, 3], method="cspd", seed=5, progress_bar=False)
    assert torch.equal(a.tokens, b.tokens) and np.array_equal(np.asarray(a.images[0]), np.asarray(b.images[0]))
    without = MARPipeline.from_pretrained(tmp_path, draft=False)
    assert without.available_methods == ["ar"] and without.default_method == "ar"
    assert loaded.default_method == "cspd"


def test_the_output_is_a_base_output_with_images_and_stats(pipe):
    out = pipe(prompt="shape 3", method="cspd", seed=0, progress_bar=False, num_images=2)
    assert_images_output(out, 2, (16, 16))
    assert out.class_labels == [3, 3] and out.tokens.shape == (2, 16, 4)
    assert out.stats.method == "cspd" and out.stats.new_tokens == 2 * 16
    assert out.stats.drafter_forwards > 0 and out.stats.drafted > 0 and out.stats.rounds > 0
    assert out.settings["num_iter"] == 6 and out.settings["num_draft"] == 2  # the card's
    # one output family: typed per-window records in the stats, not settings or a dict
    assert isinstance(out, ImageGenerationOutput) and isinstance(out.stats, StepStats)
    assert len(out.stats.windows) == out.stats.rounds and out.stats.residual_fallbacks == 0
    assert sum(w.drafted for w in out.stats.windows) == out.stats.drafted and out.stats.schedule[-1] == 0
    assert "residual_fallbacks" not in out.settings
    assert_np_images(pipe, 16)


def test_ar_is_the_target_alone_and_the_images_are_its_decoded_latents(pipe):
    out = pipe(class_labels=[2, 4], method="ar", num_iter=5, guidance_scale=2.0, seed=9, progress_bar=False,
               output_type="np")
    tokens, stats = target_generate(pipe.model, 2, num_iter=5, cfg=2.0, labels=torch.tensor([2, 4]),
                                    generator=seeded_generator("cpu", 9))
    assert torch.equal(out.tokens, tokens)
    assert out.stats.target_forwards == stats.target_forwards == 5 and out.stats.drafter_forwards == 0
    assert out.stats.schedule == stats.schedule and len(stats.schedule) == 5 and out.stats.windows == []
    latents = pipe.model.unpatchify(tokens) / pipe.vae.config.scaling_factor
    pixels = ((pipe.vae.decode(latents).sample.clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).detach().numpy()
    assert np.allclose(out.images, pixels)


@pytest.mark.parametrize("cfg", [1.0, 2.0])
def test_cspd_with_the_target_as_draft_reproduces_ar(pipe, cfg):
    same = MARPipeline(pipe.model, pipe.vae, pipe.model, class_names=CLASSES)
    ar = same(class_labels=[1, 5], method="ar", num_iter=6, guidance_scale=cfg, seed=3, progress_bar=False)
    spec = same(class_labels=[1, 5], method="cspd", num_iter=6, guidance_scale=cfg, seed=3, progress_bar=False, **EXACT)
    assert spec.stats.accepted == spec.stats.drafted > 0
    assert torch.equal(ar.tokens, spec.tokens)
    # control: the real (different) draft gets some tokens rejected and redrawn, so the output changes
    other = pipe(class_labels=[1, 5], method="cspd", num_iter=6, guidance_scale=cfg, seed=3, progress_bar=False, **EXACT)
    assert other.stats.accepted < other.stats.drafted and not torch.equal(ar.tokens, other.tokens)


def test_mismatched_parts_are_refused(pipe):
    with pytest.raises(MMSpecError, match="latent channels"):
        MARPipeline(tiny_mar(0, vae_embed_dim=8), pipe.vae)
    with pytest.raises(MMSpecError, match="the draft makes"):
        MARPipeline(pipe.model, pipe.vae, tiny_mar(1, img_size=32, vae_stride=4))
    with pytest.raises(MMSpecError, match="denoises on other timesteps"):
        MARPipeline(pipe.model, pipe.vae, tiny_mar(1, encoder_embed_dim=16, decoder_embed_dim=16,
                                                   timestep_spacing="leading"))


# ---- the CLI: generate-image and bench image on a saved MAR pipeline ------------------------------

@pytest.fixture(scope="module")
def saved(pipe, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-mar")
    pipe.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("method", ["cspd", "ar"])
def test_generate_image_runs_each_method(saved, tmp_path, capsys, method):
    from mmspec.cli import main

    out = tmp_path / "x.png"
    assert main(["generate-image", "shape 2", "--model", str(saved), "--method", method, "--seed", "2",
                 "--guidance-scale", "1.5", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["method"] == method and report["class_id"] == 2 and report["settings"]["cfg"] == 1.5
    assert report["settings"]["num_iter"] == 6 and report["stats"]["target_forwards"] > 0
    assert (report["stats"]["drafter_forwards"] > 0) == (method == "cspd")
    stats = report["stats"]
    assert stats["schedule"][-1] == 0 and len(stats["windows"]) == stats["rounds"] and stats["residual_fallbacks"] == 0
    assert sum(w["drafted"] for w in stats["windows"]) == stats["drafted"]
    assert out.is_file()
    assert main(["generate-image", "4", "--model", str(saved), "--method", method, "--out", str(out)]) == 0
    assert f"{method}: 16 tokens in 6 steps" in capsys.readouterr().err
    steps = ["--draft-steps", "3"] if method == "cspd" else []
    assert main(["generate-image", "4", "--model", str(saved), "--method", method, "--num-iter", "8", *steps,
                 "--out", str(out), "--json"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert settings["num_iter"] == 8 and settings.get("num_draft") == (3 if method == "cspd" else None)


@pytest.mark.parametrize("argv, message", [
    (["--method", "sjd"], "unknown method 'sjd'; choose from ar, cspd"),
    (["--draft-scales", "2"], "--draft-scales: not options of MAR"),
    (["--lantern-k", "4"], "--lantern-k: not options of MAR"),
    (["--temperature", "0"], "temperature must be a finite number > 0"),
    (["--top-k", "3"], "top_k does not apply to MAR"),
    (["--top-p", "0.9"], "--top-p: not options of MAR"),
    (["--method", "ar", "--draft-steps", "2"], "--draft-steps applies to method cspd, not 'ar'"),
    (["--num-iter", "17"], "num_iter must be an integer in 1..16"),
    (["--temperature", "1,1"], "--temperature takes one value per scale for VAR models only"),
])
def test_generate_image_refuses_what_mar_does_not_take(saved, tmp_path, capsys, argv, message):
    from mmspec.cli import main

    assert main(["generate-image", "shape 1", "--model", str(saved), "--out", str(tmp_path / "x.png"), *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()  # an "mmspec: method ..." notice, then the one error
    assert lines[-1].startswith("mmspec: error:") and message in lines[-1]
    assert all(line.startswith("mmspec: ") for line in lines) and len(lines) <= 2


@pytest.mark.slow
def test_bench_image_gives_ar_and_cspd_rows(saved, tmp_path, capsys):
    from mmspec.cli import main

    grid = tmp_path / "grid.png"
    assert main(["bench", "image", "--model", str(saved), "--n", "2", "--threads", "1", "--json",
                 "--grid-out", str(grid)]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["method"]: r for r in report["methods"]}
    assert list(rows) == ["ar", "cspd k=2", "ar 4 steps"]  # 1 pre-filled step + 5 drafted in windows of 2
    assert rows["ar"]["target_forwards"] == 2 * 6 and rows["ar"]["drafter_forwards"] == 0
    assert rows["ar 4 steps"]["target_forwards"] == rows["cspd k=2"]["target_forwards"] == 2 * 4
    assert rows["ar 4 steps"]["num_iter"] == 4 and rows["cspd k=2"]["num_draft"] == 2
    assert rows["cspd k=2"]["drafter_forwards"] > 0 and rows["cspd k=2"]["drafted"] > 0
    assert rows["ar"]["speed_up"] == pytest.approx(1.0) and rows["cspd k=2"]["speed_up"] > 0
    assert report["settings"]["num_iter"] == 6 and grid.is_file()
    for row in rows.values():  # token generation alone: the pipeline call without its VAE decoding
        assert 0 < row["generation_time_median_s"] < row["wall_time_median_s"]
    assert rows["ar"]["generation_speed_up"] == 1.0 and rows["cspd k=2"]["generation_speed_up"] > 0
    assert main(["bench", "image", "--model", str(saved), "--n", "1", "--threads", "1"]) == 0
    table = capsys.readouterr().out
    assert "cspd k=2" in table and "target fwd" in table and "speed-up" in table and "gen x" in table
    assert main(["bench", "image", "--model", str(saved), "--n", "1", "--threads", "1", "-k", "3", "--json"]) == 0
    assert [r["method"] for r in json.loads(capsys.readouterr().out)["methods"]] == ["ar", "cspd k=3", "ar 3 steps"]
    for flags in (["--lantern", "0.1,4"], ["--window", "8"], ["--top-k", "5"]):
        assert main(["bench", "image", "--model", str(saved), *flags]) == 2
        assert "not options of MAR rows" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_image_batches_the_mar_rows(saved, capsys):
    """--batch-size B: B images per call in every row; --inner-temperature is stated as leaving the target's law."""
    from mmspec.cli import main

    assert main(["bench", "image", "--model", str(saved), "--n", "3", "--threads", "1", "--batch-size", "2",
                 "--inner-temperature", "42", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["method"]: r for r in report["methods"]}
    assert report["settings"]["batch_size"] == 2 and report["settings"]["images"] == 3
    assert rows["ar"]["target_forwards"] == 2 * 6  # two calls (2 + 1 images), six steps each
    assert report["settings"]["inner_temperature"] == 42 and rows["cspd k=2"]["inner_temperature"] == 42
    assert any("NOT the target's distribution" in note for note in report["notes"])


def test_bench_mar_judges_every_row(pipe):
    """With a judge: class accuracy and FD vs an independent ar run per row, and ar's own spread."""
    import timm

    from mmspec.image_ar.judge import ImageJudge
    from mmspec.image_ar.mar_bench import bench_mar

    torch.manual_seed(0)
    model = timm.create_model("resnet10t", pretrained=False, num_classes=len(CLASSES), channels=(4, 8, 8, 8))
    model.pretrained_cfg = {"input_size": (3, 16, 16), "mean": (0.5,) * 3, "std": (0.5,) * 3}
    judge = ImageJudge(model, CLASSES)
    report = bench_mar(pipe, [0, 1, 2], judge=judge, batch_size=2, progress=False, warmup=0)
    for row in report.rows:
        assert 0 <= row["class_accuracy"] <= 1 and row["fd_vs_ar"] >= 0
    assert any(note.startswith("ar's own spread") for note in report.notes)
    assert "class acc" in report.to_table() and "FD vs AR" in report.to_table()


def test_mar_flags_on_another_family_are_refused(tmp_path, capsys):
    from mmspec.cli import main

    from .tiny_image_folder import build_tiny_folder

    folder = build_tiny_folder(tmp_path / "llamagen")
    assert main(["generate-image", "red circle", "--model", str(folder), "--num-iter", "4",
                 "--out", str(tmp_path / "x.png")]) == 2
    assert "--num-iter: options of MAR models" in capsys.readouterr().err


def test_family_flags_are_refused_before_any_weights_load(saved, tmp_path, capsys, monkeypatch):
    from mmspec.cli import main
    from mmspec.image_ar.pipeline import SpeculativeImagePipeline, image_family

    from .tiny_image_folder import build_tiny_folder

    llamagen = build_tiny_folder(tmp_path / "llamagen")
    assert image_family(saved) == "mar" and image_family(llamagen) == "llamagen"
    assert image_family("shapes-image-ar") == "llamagen" and image_family("someone/not-here") is None

    def no_loading(*args, **kwargs):
        raise AssertionError("weights loaded before the flags were checked")

    monkeypatch.setattr(SpeculativeImagePipeline, "from_pretrained", classmethod(no_loading))
    for model, flags, message in ((saved, ["--lantern-k", "4"], "not options of MAR"),
                                  (llamagen, ["--num-iter", "4"], "options of MAR models"),
                                  (llamagen, ["--draft-scales", "2"], "applies to VAR models")):
        assert main(["generate-image", "shape 1", "--model", str(model), "--out", str(tmp_path / "x.png"), *flags]) == 2
        assert message in capsys.readouterr().err
    assert main(["bench", "image", "--model", str(llamagen), "--top-p", "0.9"]) == 2
    assert "--top-p applies to VAR models" in capsys.readouterr().err
    assert main(["bench", "image", "--model", str(saved), "--window", "8"]) == 2
    assert "not options of MAR rows" in capsys.readouterr().err
