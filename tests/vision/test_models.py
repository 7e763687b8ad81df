"""Visual token bookkeeping and loading for the four supported VLM classes."""

import pytest
import torch

from mmspec import MMSpecError, vision
from mmspec.testing import tiny_llama

from .tiny_vlms import IMAGE, VIDEO, VISION_END, VISION_START

EXPECTED_IDS = {
    "llava-image": {IMAGE},
    "onevision-video": {IMAGE, VIDEO},
    "nextvideo-video": {IMAGE, VIDEO},
    "qwen2vl-image": {IMAGE, VIDEO, VISION_START, VISION_END},
    "qwen2vl-video": {IMAGE, VIDEO, VISION_START, VISION_END},
}


@pytest.mark.parametrize("name", sorted(EXPECTED_IDS))
def test_visual_token_ids_come_from_the_config(name, vlm_cases):
    model = vlm_cases[name].model
    assert type(model).__name__ in vision.SUPPORTED_ARCHITECTURES
    assert vision.visual_token_ids(model) == EXPECTED_IDS[name]
    assert vision.visual_token_ids(model.config) == EXPECTED_IDS[name]
    assert vision.feature_token_ids(model) == EXPECTED_IDS[name] - {VISION_START, VISION_END}


@pytest.mark.parametrize("name", sorted(EXPECTED_IDS))
def test_visual_positions_are_the_placeholder_run(name, vlm_cases):
    case = vlm_cases[name]
    ids = case.input_ids
    run = [i for i, t in enumerate(ids[0].tolist()) if t in (IMAGE, VIDEO)]
    assert run == list(range(run[0], run[0] + len(run)))  # one contiguous run in these prompts
    positions = vision.visual_positions(case.model, ids)
    assert positions.dtype == torch.long and positions.tolist() == run
    assert vision.visual_positions(case.model, ids[0]).tolist() == run
    assert torch.equal(vision.visual_mask(case.model, ids).nonzero()[:, 1], positions)


def test_visual_positions_with_markers(vlm_cases):
    case = vlm_cases["qwen2vl-image"]
    positions = vision.visual_positions(case.model, case.input_ids, include_markers=True).tolist()
    plain = vision.visual_positions(case.model, case.input_ids).tolist()
    assert positions == [plain[0] - 1, *plain, plain[-1] + 1]


def test_visual_positions_rejects_batches(vlm_cases):
    case = vlm_cases["llava-image"]
    with pytest.raises(MMSpecError, match="one sequence"):
        vision.visual_positions(case.model, case.input_ids.repeat(2, 1))


def test_modality_token_types_match_qwen2_vl_processor_convention(vlm_cases):
    for name, value in (("qwen2vl-image", 1), ("qwen2vl-video", 2)):
        case = vlm_cases[name]
        assert torch.equal(vision.modality_token_types(case.model, case.input_ids), case.inputs["mm_token_type_ids"])
        assert set(vision.modality_token_types(case.model, case.input_ids).unique().tolist()) == {0, value}


def test_text_only_model_has_no_visual_tokens():
    with pytest.raises(MMSpecError, match="no image or video token"):
        vision.visual_token_ids(tiny_llama())


def test_load_vision_model_round_trip(vlm_cases, tmp_path):
    case = vlm_cases["llava-image"]
    case.model.save_pretrained(tmp_path)
    loaded = vision.load_vision_model(tmp_path)
    assert type(loaded) is type(case.model) and not loaded.training
    with torch.no_grad():
        a = case.model(case.input_ids, **case.inputs).logits
        b = loaded(case.input_ids, **case.inputs).logits
    torch.testing.assert_close(a, b)


def test_load_vision_model_errors(vlm_cases, tmp_path):
    with pytest.raises(MMSpecError, match="not found"):
        vision.load_vision_model(tmp_path / "missing")
    text_dir = tmp_path / "text"
    tiny_llama().save_pretrained(text_dir)
    with pytest.raises(MMSpecError, match="not a vision-language"):
        vision.load_vision_model(text_dir)
    no_weights = tmp_path / "no_weights"
    vlm_cases["llava-image"].model.config.save_pretrained(no_weights)
    with pytest.raises(MMSpecError, match="could not load"):
        vision.load_vision_model(no_weights)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{ not json")
    with pytest.raises(MMSpecError, match="could not load"):
        vision.load_vision_model(tmp_path / "broken")
