"""Zoo models that are a part of another: the text pair is the detailed captioner's language model and its text
drafter, so the package holds their weights once.

The derived language model must compute exactly what the captioner's own language model computes on text
(its logits over the ids it keeps), for the shipped checkpoint layout and for the layout transformers writes
today; a config that does not match the stored tensors is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlavaNextVideoForConditionalGeneration

from mmspec.errors import MMSpecError
from mmspec.zoo import MODELS_DIR, entries, resolve
from mmspec.zoo.derived import WEIGHTS, derived_folder

CAPTIONER = MODELS_DIR / "shapes-video-captioner"
needs_captioner = pytest.mark.skipif(not (CAPTIONER / WEIGHTS).is_file(), reason="the zoo captioner has no weights")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMSPEC_CACHE", str(tmp_path / "cache"))


def language_model_logits(vlm, ids: torch.LongTensor) -> torch.Tensor:
    """The vision-language model's logits for a text-only prompt: its language model and head, nothing visual."""
    hidden = vlm.model.language_model(input_ids=ids).last_hidden_state
    return vlm.lm_head(hidden)


@needs_captioner
def test_caption_lm_is_the_captioners_language_model(tmp_path):
    folder = Path(resolve("shapes-caption-lm"))
    assert folder.is_relative_to(tmp_path / "cache" / "zoo") and (folder / WEIGHTS).is_file()
    lm = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    vlm = LlavaNextVideoForConditionalGeneration.from_pretrained(CAPTIONER, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 40, 77, 120, 300, 9, 522, 14]])
    with torch.no_grad():
        own, whole = lm(ids).logits, language_model_logits(vlm, ids)
    assert own.shape[-1] == 523 and whole.shape[-1] == 525
    torch.testing.assert_close(own, whole[..., :523], rtol=0, atol=1e-5)
    # Control: the same ids through another text model (the drafter) are far from it.
    drafter = AutoModelForCausalLM.from_pretrained(resolve("shapes-caption-drafter"), dtype=torch.float32).eval()
    with torch.no_grad():
        assert (drafter(ids).logits - own).abs().max() > 1.0


@needs_captioner
def test_the_cached_model_is_written_once():
    first = Path(resolve("shapes-caption-lm"))
    stamp = (first / WEIGHTS).stat().st_mtime_ns
    assert Path(resolve("shapes-caption-lm")) == first and (first / WEIGHTS).stat().st_mtime_ns == stamp
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no scratch folder left behind


def test_the_drafter_is_the_captioners_text_folder():
    assert Path(resolve("shapes-caption-drafter")) == CAPTIONER / "text"


def test_the_pair_ships_no_weights_of_its_own():
    sizes = {e.name: e.file_size_bytes for e in entries()}
    assert sizes["shapes-caption-lm"] < 100_000 and sizes["shapes-caption-drafter"] < 100_000


def tiny_video_llm(folder: Path, layout: str = "saved") -> LlavaNextVideoForConditionalGeneration:
    """A tiny LLaVA-NeXT-Video in `folder`: as `save_pretrained` writes it (`language_model.model.*`, the layout
    of published checkpoints), or under its in-memory names (`model.language_model.*`, `lm_head.*`)."""
    from safetensors.torch import save_file

    from tests.vision.tiny_vlms import next_video

    model = next_video().model
    model.save_pretrained(folder)
    if layout == "in-memory":
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / WEIGHTS))
    return model


def text_folder(folder: Path, text_config: dict, vocab_size: int) -> Path:
    folder.mkdir()
    LlamaConfig(**{**text_config, "vocab_size": vocab_size}).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("layout, prefix", [("saved", "language_model.model."), ("in-memory", "model.language_model.")])
def test_both_checkpoint_layouts(tmp_path, layout, prefix):
    from safetensors import safe_open

    vlm = tiny_video_llm(tmp_path / "vlm", layout).eval()
    with safe_open(str(tmp_path / "vlm" / WEIGHTS), "pt") as stored:
        assert any(k.startswith(prefix) for k in stored.keys())  # the layout this case is for
    text = text_folder(tmp_path / "text", vlm.config.text_config.to_dict(), 190)
    spec = {"model": "vlm", "language_model": True, "vocab_size": 190}
    lm = AutoModelForCausalLM.from_pretrained(derived_folder("tiny-lm", text, spec, tmp_path / "vlm")).eval()
    ids = torch.tensor([[1, 31, 32, 33, 150, 189]])
    with torch.no_grad():
        torch.testing.assert_close(lm(ids).logits, language_model_logits(vlm, ids)[..., :190], rtol=0, atol=1e-5)


def test_a_config_that_does_not_match_the_weights_is_refused(tmp_path):
    vlm = tiny_video_llm(tmp_path / "vlm")
    wider = {**vlm.config.text_config.to_dict(), "intermediate_size": 256}
    text = text_folder(tmp_path / "text", wider, 190)
    spec = {"model": "vlm", "language_model": True, "vocab_size": 190}
    with pytest.raises(MMSpecError, match="does not match the config"):
        derived_folder("tiny-lm", text, spec, tmp_path / "vlm")
    assert not any((tmp_path / "cache" / "zoo").iterdir())  # nothing half-written is left


def test_a_card_without_a_part_is_refused(tmp_path):
    with pytest.raises(MMSpecError, match="without 'folder' or 'language_model'"):
        derived_folder("odd", tmp_path, {"model": "vlm"}, tmp_path)
    with pytest.raises(MMSpecError, match="has no weights"):
        derived_folder("odd", tmp_path, {"model": "vlm", "folder": "missing"}, tmp_path)


def test_zoo_cards_say_where_the_pair_comes_from():
    for name in ("shapes-caption-lm", "shapes-caption-drafter"):
        card = json.loads((MODELS_DIR / name / "zoo_card.json").read_text())
        assert card["derived_from"]["model"] == "shapes-video-captioner"
        assert card["quality"]["measured_on"].startswith("mmspec.world.detailed_examples")


def test_zoo_list_says_where_the_weights_are(capsys):
    from mmspec.cli import main

    assert main(["zoo", "list"]) == 0
    shown = capsys.readouterr().out
    assert "weights: its language model of shapes-video-captioner (counted there)" in shown
    assert "weights: its text/ folder of shapes-video-captioner (counted there)" in shown


@needs_captioner
def test_a_cache_that_cannot_be_written_gives_one_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MMSPEC_CACHE", str(blocker))
    with pytest.raises(MMSpecError, match="cannot write zoo model 'shapes-caption-lm' to .*: set MMSPEC_CACHE"):
        resolve("shapes-caption-lm")
