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
    with pytest.raises(MMSpecError, match="without 'folder', 'language_model' or 'overlay'"):
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


def overlay_entry(tmp_path: Path, parent_sha256: str | None = None, bad: bool = False):
    """A tiny captioner in `vlm/`, and in `long/` an overlay entry on it: YaRN rotary positions and low-rank
    updates of its language model's q/v projections plus a new projector; returns the entry's folder and spec
    and the model that the overlay should merge into (trained weights, rounded to fp16 as the zoo ships them)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from mmspec.low_rank import LowRankDelta, add_low_rank, apply_overlay, overlay_of, remove_low_rank
    from mmspec.zoo.derived import file_digest

    tiny_video_llm(tmp_path / "vlm")
    trained = LlavaNextVideoForConditionalGeneration.from_pretrained(tmp_path / "vlm", dtype=torch.float32)
    trained.requires_grad_(False)
    add_low_rank(trained, "model.language_model.", ("q_proj", "v_proj"), rank=2, alpha=4.0)
    torch.manual_seed(1)
    for module in trained.modules():
        if isinstance(module, LowRankDelta):
            torch.nn.init.normal_(module.lora_B, std=0.2)
    with torch.no_grad():
        trained.model.multi_modal_projector.linear_1.weight.mul_(1.5)
    overlay = overlay_of(trained, [n for n, _ in trained.named_parameters() if "multi_modal_projector" in n])
    remove_low_rank(trained)
    apply_overlay(trained, overlay)
    if bad:
        overlay["model.multi_modal_projector.linear_1.weight"] = torch.zeros(3, 3, dtype=torch.float16)
    entry = tmp_path / "long"
    entry.mkdir()
    config = AutoConfig.from_pretrained(tmp_path / "vlm")
    config.text_config.rope_parameters = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                          "original_max_position_embeddings": 64}
    config.save_pretrained(entry)
    save_file(overlay, str(entry / "overlay.safetensors"))
    spec = {"model": "vlm", "overlay": "overlay.safetensors",
            "parent_sha256": parent_sha256 or file_digest(tmp_path / "vlm" / WEIGHTS).hexdigest()}
    return entry, spec, trained.half().float()


def test_an_overlay_entry_is_its_parent_with_the_overlay_and_config(tmp_path):
    entry, spec, expected = overlay_entry(tmp_path)
    folder = derived_folder("tiny-long", entry, spec, tmp_path / "vlm")
    assert folder.is_relative_to(tmp_path / "cache" / "zoo")
    merged = LlavaNextVideoForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    assert merged.config.text_config.rope_parameters["rope_type"] == "yarn"
    parent = dict(LlavaNextVideoForConditionalGeneration.from_pretrained(tmp_path / "vlm", dtype=torch.float32)
                  .named_parameters())
    changed = set()
    for name, weight in merged.named_parameters():
        torch.testing.assert_close(weight, dict(expected.named_parameters())[name], rtol=0, atol=0)
        if not torch.equal(weight, parent[name].half().float()):
            changed.add(name.rsplit(".", 2)[-2])
    assert changed == {"q_proj", "v_proj", "linear_1"}  # control: the overlay did change those, and only those
    again = derived_folder("tiny-long", entry, spec, tmp_path / "vlm")
    assert again == folder and len(list(folder.parent.iterdir())) == 1  # written once, no scratch left


def test_an_overlay_on_other_parent_weights_is_refused(tmp_path):
    entry, spec, _ = overlay_entry(tmp_path, parent_sha256="0" * 64)
    with pytest.raises(MMSpecError, match="overlay trained on other weights of 'vlm'"):
        derived_folder("tiny-long", entry, spec, tmp_path / "vlm")


def test_an_overlay_that_does_not_fit_its_parent_is_refused(tmp_path):
    entry, spec, _ = overlay_entry(tmp_path, bad=True)
    with pytest.raises(MMSpecError, match="the overlay does not fit the model"):
        derived_folder("tiny-long", entry, spec, tmp_path / "vlm")
    assert not any((tmp_path / "cache" / "zoo").iterdir())  # nothing half-written is left


def test_a_derived_folder_outside_the_zoo_resolves(tmp_path, monkeypatch):
    from mmspec import zoo

    entry, spec, _ = overlay_entry(tmp_path)
    (entry / "zoo_card.json").write_text(json.dumps({"name": "long", "derived_from": spec}))
    monkeypatch.setattr(zoo, "entries", lambda: [zoo.ZooEntry("vlm", tmp_path / "vlm", {})])
    folder = Path(resolve(str(entry)))
    assert folder.is_relative_to(tmp_path / "cache" / "zoo") and (folder / WEIGHTS).is_file()


def test_an_overlay_brings_the_parents_drafter_folders(tmp_path):
    entry, spec, _ = overlay_entry(tmp_path)
    drafter = text_folder(tmp_path / "vlm" / "text", {"hidden_size": 16, "num_hidden_layers": 1,
                                                      "num_attention_heads": 2, "intermediate_size": 32}, 190)
    AutoModelForCausalLM.from_config(LlamaConfig.from_pretrained(drafter)).save_pretrained(drafter)
    with pytest.raises(MMSpecError, match="brings the folders \\['msd'\\]"):
        derived_folder("tiny-long", entry, {**spec, "folders": ["text", "msd"]}, tmp_path / "vlm")
    folder = derived_folder("tiny-long", entry, {**spec, "folders": ["text"]}, tmp_path / "vlm")
    assert (folder / "text" / WEIGHTS).is_file() and not (folder / "msd").exists()
