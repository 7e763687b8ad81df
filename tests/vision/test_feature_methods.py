"""The msd / flash caption methods: pipeline, `mmspec caption`, bench rows and the drafter build script,
on a tiny random LLaVA-NeXT-Video (the zoo captioner's processor) with tiny untrained drafters.

Untrained drafters are enough here: losslessness must hold whatever the drafter proposes; trained
drafters are tested in test_msd.py / test_flash.py.
"""

import json
import shutil

import pytest
import torch
from transformers import AutoConfig, LlamaConfig

from mmspec import MMSpecError
from mmspec.cli import main
from mmspec.vision.feature_methods import check_compatible, load_feature_drafter, parse_drafter_spec
from mmspec.vision.flash import FlashDrafterModel
from mmspec.vision.msd import MSDDrafterModel
from mmspec.vision.pipeline import CaptionPipeline
from mmspec.vision.recipes import train_captioner_drafters as build

from .test_pipeline import frames, tiny_captioner_folder  # noqa: F401 (fixtures)

MAX_NEW = 12


def tiny_drafter(kind, text_config, seed=0, **options):
    torch.manual_seed(seed)
    if kind == "msd":
        return MSDDrafterModel.from_target_config(text_config, **options).eval()
    options = {"num_queries": 4, "semi_ar_tokens": 2, **options}
    return FlashDrafterModel.from_target_config(text_config, **options).eval()


@pytest.fixture(scope="module")
def drafters(tiny_captioner_folder, tmp_path_factory):
    """Saved drafter folders: msd, flash, a FLASH ablation without compression, and a wrong-size MSD."""
    root = tmp_path_factory.mktemp("drafters")
    text_config = AutoConfig.from_pretrained(tiny_captioner_folder).get_text_config()
    folders = {}
    for name, kind, options in [("msd", "msd", {}), ("flash", "flash", {}), ("flash-nc", "flash", {"compress": False})]:
        tiny_drafter(kind, text_config, **options).save_pretrained(root / name)
        folders[name] = root / name
    wrong = LlamaConfig(**{**text_config.to_dict(), "hidden_size": 32, "num_attention_heads": 2, "head_dim": 16})
    tiny_drafter("msd", wrong).save_pretrained(root / "wrong-size")
    folders["wrong-size"] = root / "wrong-size"
    return folders


@pytest.fixture(scope="module")
def zoo_like_folder(tiny_captioner_folder, drafters, tmp_path_factory):
    """The tiny captioner with msd/ and flash/ subfolders, as the build script leaves a zoo model."""
    folder = tmp_path_factory.mktemp("zoo") / "captioner"
    shutil.copytree(tiny_captioner_folder, folder)
    for kind in ("msd", "flash"):
        shutil.copytree(drafters[kind], folder / kind)
    return folder


@pytest.fixture(scope="module")
def pipe(zoo_like_folder):
    return CaptionPipeline.from_pretrained(zoo_like_folder)


@pytest.mark.parametrize("method", ["msd", "flash"])
def test_feature_methods_give_the_ar_caption(pipe, frames, method):
    reference = pipe(video=frames, max_new_tokens=MAX_NEW, method="ar", progress_bar=False)
    out = pipe(video=frames, max_new_tokens=MAX_NEW, method=method, progress_bar=False)
    assert out.sequences.tolist() == reference.sequences.tolist() and out.text == reference.text
    assert out.method == method and out.stats.drafted > 0 and out.stats.drafter_forwards > 0


def test_zoo_subfolders_are_found_and_listed(pipe):
    assert pipe.available_methods == ["ar", "std", "msd", "flash"]  # no text drafter in this folder
    # no measured fastest method on the card: the trained drafters come first (FLASH, then MSD), not Sparse-to-Dense
    assert pipe.default_method == "flash"
    pipe.card["fastest_lossless_method"] = "msd"  # a card that names one decides
    try:
        assert pipe.default_method == "msd"
    finally:
        del pipe.card["fastest_lossless_method"]


def test_explicit_drafter_and_missing_one(tiny_captioner_folder, drafters):
    pipe = CaptionPipeline.from_pretrained(tiny_captioner_folder, feature_drafters={"flash": drafters["flash"]})
    assert "flash" in pipe.available_methods and "msd" not in pipe.available_methods
    with pytest.raises(MMSpecError, match=r"needs a trained MSD drafter .*--method msd --drafter FOLDER"):
        pipe.make_drafter("msd")


def test_incompatible_or_foreign_drafters(tiny_captioner_folder, drafters):
    with pytest.raises(MMSpecError, match="hidden size 32"):
        CaptionPipeline.from_pretrained(tiny_captioner_folder, feature_drafters={"msd": drafters["wrong-size"]})
    with pytest.raises(MMSpecError, match="holds a FLASH drafter, expected MSD"):
        load_feature_drafter("msd", drafters["flash"])
    with pytest.raises(MMSpecError, match="no FLASH drafter"):
        load_feature_drafter("flash", drafters["msd"].parent / "nowhere")
    pipe = CaptionPipeline.from_pretrained(tiny_captioner_folder)
    other_vocab = load_feature_drafter("msd", drafters["msd"])
    other_vocab.config.target_vocab_size += 1
    with pytest.raises(MMSpecError, match="vocabulary"):
        check_compatible(other_vocab, pipe.model)
    with pytest.raises(MMSpecError, match="unknown feature drafter kind"):
        CaptionPipeline.from_pretrained(tiny_captioner_folder, feature_drafters={"eagle": drafters["msd"]})


def test_drafter_spec_parsing():
    assert parse_drafter_spec("nc=flash:/a/b:c") == ("nc", "flash", "/a/b:c", None)
    assert parse_drafter_spec("half=msd:/a/b@bfloat16") == ("half", "msd", "/a/b", torch.bfloat16)
    assert parse_drafter_spec("odd=msd:/a/me@home") == ("odd", "msd", "/a/me@home", None)  # not a dtype: part of the path
    for bad in ("flash:/x", "x=/path", "x=medusa:/p", "=msd:/p"):
        with pytest.raises(MMSpecError):
            parse_drafter_spec(bad)


def test_cli_caption_with_an_explicit_drafter(tiny_captioner_folder, drafters, frames, tmp_path, capsys):
    from mmspec.vision import write_video

    video = write_video(tmp_path / "clip.mp4", frames)
    code = main(["caption", str(video), "--model", str(tiny_captioner_folder), "--method", "msd", "--drafter",
                 str(drafters["msd"]), "--max-new-tokens", "8", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["method"] == "msd"
    stats = result["stats"]
    assert stats["drafter_forwards"] > 0 and stats["drafted"] > 0
    assert {"mean_accepted_length", "acceptance_rate", "target_forwards", "wall_time_s"} <= set(stats)


@pytest.mark.parametrize("extra", [[], ["--drafter", "/nonexistent/flash"]], ids=["zoo-folder", "bad-path"])
def test_cli_caption_missing_drafter_is_one_clear_error(tiny_captioner_folder, frames, tmp_path, capsys, extra):
    from mmspec.vision import write_video

    video = write_video(tmp_path / "clip.mp4", frames)
    code = main(["caption", str(video), "--model", str(tiny_captioner_folder), "--method", "flash", *extra])
    err = capsys.readouterr().err
    assert code == 2 and "mmspec: error:" in err and "FLASH drafter" in err and "Traceback" not in err


def test_cli_bench_vision_with_extra_drafters(zoo_like_folder, drafters, capsys):
    code = main(["bench", "vision", "--model", str(zoo_like_folder), "--num-videos", "1", "--max-new-tokens", "6",
                 "--repeats", "1", "--std", "16,3", "-k", "3", "--extra-drafter", f"flash-nc=flash:{drafters['flash-nc']}",
                 "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    rows = {row["method"]: row for row in result["methods"]}
    assert set(rows) == {"plain-greedy", "greedy-loop", "std K=16 gamma=3", "msd k=3", "flash k=3", "flash-nc k=3"}
    assert all(row["identical_to_reference"] for row in rows.values())
    assert result["extras"]["feature_drafters"]["flash-nc k=3"]["compress"] is False
    assert set(result["extras"]["modelled_memory_bound_speed_up"]) == set(rows)


def test_cli_bench_vision_bad_extra_drafter(zoo_like_folder, drafters, capsys):
    code = main(["bench", "vision", "--model", str(zoo_like_folder), "--extra-drafter", f"msd=msd:{drafters['msd']}"])
    err = capsys.readouterr().err
    assert code == 2 and "used twice" in err


def test_build_script_argument_validation(tmp_path, capsys):
    assert build.main(["--videos", "0"]) == 2
    assert "--videos must be >= 1" in capsys.readouterr().err
    assert build.main(["--captioner", str(tmp_path / "none")]) == 2
    assert "no captioner in" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build.main(["--kinds", "medusa"])


def test_build_script_smoke(tiny_captioner_folder, tmp_path):
    """The whole build on the tiny captioner: data, both drafters shipped, the card updated, an ablation kept aside."""
    folder = tmp_path / "captioner"
    shutil.copytree(tiny_captioner_folder, folder)
    code = build.main(["--captioner", str(folder), "--out", str(folder), "--out-root", str(tmp_path / "out"),
                       "--videos", "2", "--steps", "2",
                       "--max-new-tokens", "4", "--flash-queries", "4", "--flash-semi-ar", "2", "--threads", "1",
                       "--checkpoint-every", "0"])
    assert code == 0
    card = json.loads((folder / "zoo_card.json").read_text())
    assert set(card["drafters"]) >= {"msd", "flash", "data", "rebuild_command", "build_wall_time_s"}
    assert card["drafters"]["data"]["traces"] == 4  # 2 videos + their text-only traces
    for kind in ("msd", "flash"):
        report = json.loads((folder / kind / "training.json").read_text())
        assert report["steps"] == 2 and report["machine"] == "2 CPU cores" and report["data"]["videos"] == 2
    pipe = CaptionPipeline.from_pretrained(folder)
    assert {"msd", "flash"} <= set(pipe.available_methods)
    assert pipe.feature_drafters["flash"].config.num_queries == 4
