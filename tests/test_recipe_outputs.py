"""The vision and speech recipes write to --out (default ./<model name>) and never into the installed
package unless told with --into-zoo (the image-AR recipes: tests/image_ar/test_image_ar_data.py)."""

from pathlib import Path

import pytest

from mmspec.speech.recipes import train_whisper_asr
from mmspec.vision.recipes import (
    captioner_data,
    train_caption_lm,
    train_captioner_drafters,
    train_detailed_captioner,
    train_video_captioner,
)
from mmspec.zoo import MODELS_DIR

ASR = ["--train", "clips", "--heldout", "clips"]
# recipe, its entry point's argv without --out, the zoo folder it would replace, the function that does the work
RECIPES = [
    (train_caption_lm, ["--which", "target"], MODELS_DIR / "shapes-caption-lm", "train"),
    (train_caption_lm, ["--which", "drafter"], MODELS_DIR / "shapes-caption-drafter", "train"),
    (train_video_captioner, [], MODELS_DIR / "shapes-video-captioner", "train"),
    (train_detailed_captioner, [], MODELS_DIR / "shapes-video-captioner", "train"),
    (train_captioner_drafters, [], captioner_data.zoo_folder(), "run"),
    (train_whisper_asr, ASR, MODELS_DIR / "shapes-whisper-asr", "train"),
]
IDS = ["caption-lm", "caption-drafter", "video-captioner", "detailed-captioner", "captioner-drafters", "whisper-asr"]


def snapshot():
    return sorted((p, p.stat().st_mtime_ns) for p in MODELS_DIR.rglob("*"))


def out_of(recipe, call):
    """The output folder a recipe's worker was handed."""
    if recipe is train_caption_lm:
        return Path(call.args[-1])
    return Path(call.args[0].out)


@pytest.mark.parametrize("recipe, argv, zoo, worker", RECIPES, ids=IDS)
def test_out_inside_the_package_is_refused_before_any_work(recipe, argv, zoo, worker, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(recipe, worker, lambda *a, **k: calls.append(a))
    before = snapshot()
    for out in (zoo, zoo / "sub", MODELS_DIR):
        with pytest.raises(SystemExit) as exit_info:
            recipe.main(argv + ["--out", str(out)])
        assert exit_info.value.code == 2
        assert "inside the installed mmspec package; pass --into-zoo" in capsys.readouterr().err
    assert calls == [] and snapshot() == before


@pytest.mark.parametrize("recipe, argv, zoo, worker", RECIPES, ids=IDS)
def test_default_out_is_the_working_directory_and_into_zoo_the_package(recipe, argv, zoo, worker, tmp_path, monkeypatch):
    class Call:
        def __init__(self, args):
            self.args = args

    calls = []
    monkeypatch.setattr(recipe, worker, lambda *a, **k: calls.append(Call(a)))
    monkeypatch.chdir(tmp_path)
    recipe.main(argv)
    recipe.main(argv + ["--out", str(tmp_path / "run")])
    recipe.main(argv + ["--into-zoo"])
    assert [out_of(recipe, c) for c in calls] == [Path(zoo.name), tmp_path / "run", zoo]


def test_tokenizer_goes_to_out_or_into_both_zoo_folders(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(train_caption_lm, "build_tokenizer",
                        lambda seed: type("Tok", (), {"save_pretrained": lambda self, f: saved.append(Path(f)),
                                                      "__len__": lambda self: 1})())
    monkeypatch.chdir(tmp_path)
    train_caption_lm.main(["--which", "tokenizer"])
    train_caption_lm.main(["--which", "tokenizer", "--into-zoo"])
    assert saved == [Path("shapes-caption-lm"), train_caption_lm.TARGET_DIR, train_caption_lm.DRAFTER_DIR]


def test_captioner_drafter_defaults_are_the_shipped_build():
    import json

    from mmspec.world import caption_token_cap

    card = json.loads((captioner_data.zoo_folder() / "zoo_card.json").read_text())
    shipped = card["drafters"]["rebuild_command"].split()
    args = train_captioner_drafters.build_parser().parse_args([])
    args.max_new_tokens = caption_token_cap(card)  # the default follows the card
    for flag, value in zip(shipped, shipped[1:]):
        if flag.startswith("--") and not value.startswith("--") and flag not in ("--kinds", "--threads"):
            assert str(getattr(args, flag[2:].replace("-", "_"))) == value, flag
    assert card["drafters"]["data"]["videos"] == args.videos == 600 and args.steps == 3000


def test_caption_lm_detailed_scenes_train_a_text_drafter_only(tmp_path, monkeypatch, capsys):
    for argv in (["--which", "target"], ["--which", "drafter", "--distil"]):
        with pytest.raises(SystemExit) as exit_info:
            train_caption_lm.main(argv + ["--scenes", "detailed", "--out", str(tmp_path / "x")])
        assert exit_info.value.code == 2
        assert "--scenes detailed trains a text drafter" in capsys.readouterr().err


@pytest.mark.slow
def test_caption_lm_detailed_drafter_learns_the_detailed_grammar(tmp_path, monkeypatch):
    import json

    captions = train_caption_lm.corpus("detailed", 3, 0, "heldout")
    assert all(len(c.split()) > 25 for c in captions)  # detailed captions, not one-shape ones (~10 words)
    assert train_caption_lm.corpus("one-shape", 3, 0, "heldout") != captions
    monkeypatch.setitem(train_caption_lm.DETAILED, "data_size", 8)
    monkeypatch.setattr(train_caption_lm, "HELDOUT_N", 4)
    train_caption_lm.main(["--which", "drafter", "--scenes", "detailed", "--steps", "2", "--out", str(tmp_path / "d")])
    card = json.loads((tmp_path / "d" / "zoo_card.json").read_text())
    assert card["scenes"] == "detailed" and card["data_size"] == 8 and card["steps"] == 2
    assert "detailed_examples(n=8" in card["trained_on"] and "detailed_examples(n=4" in card["quality"]["measured_on"]
    assert card["rebuild_command"].endswith("--which drafter --scenes detailed")
