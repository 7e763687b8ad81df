"""Where the zoo loader finds models: installed zoo distributions first, then a source checkout; a zoo name
that neither has is one error naming the distribution to install."""

import json
from pathlib import Path

import pytest

from mmspec import zoo
from mmspec.cli import main
from mmspec.errors import MMSpecError
from mmspec.zoo import entries, resolve

REPO = Path(__file__).resolve().parents[1]


def fake_distribution(root: Path, package: str, name: str, card: dict) -> Path:
    """An installed zoo distribution as pip lays it out: `<package>/__init__.py`, `<package>/models/<name>/`."""
    folder = root / package / "models" / name
    folder.mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (folder / "zoo_card.json").write_text(json.dumps(card))
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.fixture
def no_source_zoo(tmp_path, monkeypatch):
    """As in an installed mmspec wheel: no `mmspec/zoo/models` beside the code."""
    monkeypatch.setattr(zoo, "MODELS_DIR", tmp_path / "no-source-zoo")


def test_an_installed_distribution_comes_before_the_source_zoo(tmp_path, monkeypatch):
    installed = fake_distribution(tmp_path, "mmspec_zoo_image", "shapes-image-ar", {"installed": True})
    source = tmp_path / "source"
    (source / "shapes-image-ar").mkdir(parents=True)
    (source / "shapes-image-ar" / "zoo_card.json").write_text("{}")
    (source / "only-in-source").mkdir()
    (source / "only-in-source" / "zoo_card.json").write_text("{}")
    monkeypatch.setattr(zoo, "MODELS_DIR", source)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {entry.name: entry for entry in entries()}
    assert set(found) == {"shapes-image-ar", "only-in-source"}
    assert found["shapes-image-ar"].path == installed and found["shapes-image-ar"].card == {"installed": True}
    assert resolve("shapes-image-ar") == str(installed)


def test_installed_distributions_alone_make_the_zoo(tmp_path, monkeypatch, no_source_zoo):
    vision = fake_distribution(tmp_path, "mmspec_zoo_vision", "shapes-video-captioner", {})
    speech = fake_distribution(tmp_path, "mmspec_zoo_speech", "whisper-tiny.en", {})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [(e.name, e.path) for e in entries()] == [("shapes-video-captioner", vision), ("whisper-tiny.en", speech)]


@pytest.mark.parametrize(("name", "distribution", "source"), [
    ("shapes-video-captioner", "mmspec-zoo-vision", "zoo/vision"),
    ("shapes-caption-lm", "mmspec-zoo-vision", "zoo/vision"),
    ("shapes-mar", "mmspec-zoo-image", "zoo/image"),
    ("whisper-tiny.en", "mmspec-zoo-speech", "zoo/speech"),
])
def test_a_zoo_model_not_installed_names_its_distribution(name, distribution, source, no_source_zoo):
    with pytest.raises(MMSpecError) as caught:
        resolve(name)
    assert str(caught.value) == (f"cannot load the model {name!r}: it is a zoo model of the package {distribution}, "
                                 f"which is not installed: pip install {distribution} (in a clone of mmspec: "
                                 f"pip install ./{source})")


def test_a_name_no_distribution_ships_is_still_looked_up_as_a_hub_id(no_source_zoo):
    with pytest.raises(MMSpecError, match="not a zoo model") as caught:
        resolve("shapes-nothing-like-this")
    assert "mmspec-zoo" not in str(caught.value)


@pytest.mark.parametrize(("argv", "distribution"), [
    (["caption", str(REPO / "demos" / "assets" / "shapes.mp4")], "mmspec-zoo-vision"),
    (["transcribe", str(REPO / "demos" / "assets" / "speech-shapes.flac")], "mmspec-zoo-speech"),
    (["generate-image", "red circle"], "mmspec-zoo-image"),
    (["generate-image", "red circle", "--model", "shapes-var"], "mmspec-zoo-image"),
])
def test_the_cli_names_the_missing_distribution_in_one_line(argv, distribution, no_source_zoo, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mmspec: error: ") and f"pip install {distribution}" in err[-1], err


def test_zoo_list_says_which_distributions_are_not_installed(tmp_path, monkeypatch, no_source_zoo, capsys):
    fake_distribution(tmp_path, "mmspec_zoo_speech", "whisper-tiny.en", {"architecture": "Whisper"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("whisper-tiny.en: Whisper")
    assert "not installed: shapes-image-ar, shapes-mar, shapes-var (pip install mmspec-zoo-image)" in out
    assert "mmspec-zoo-vision" in out and "mmspec-zoo-speech" not in out
