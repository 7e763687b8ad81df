"""The detailed-captioner recipe: a 3-step run writes a loadable captioner with its card; bad
options are refused with one line and exit 2; the detailed auxiliary targets are right."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmspec.vision.recipes import captioner_data as cd
from mmspec.vision.recipes import train_detailed_captioner as recipe
from mmspec.world import DetailedScene, Shape, sample_detailed_example


def test_three_step_run_writes_a_captioner(tmp_path, capsys):
    out = tmp_path / "run"
    recipe.main(["--text-steps", "1", "--steps", "3", "--batch-size", "2", "--eval-n", "2",
                 "--max-new-tokens", "6", "--threads", "1", "--out", str(out)])
    log = capsys.readouterr().out
    assert "B step 2 caption_loss" in log and "seconds per step on" in log
    card = json.loads((out / "zoo_card.json").read_text())
    assert card["architecture"] == "LlavaNextVideoForConditionalGeneration"
    assert card["frames"] == 8 and card["visual_tokens_per_video"] == 288
    assert set(card["quality"]["attribute_accuracy"]) >= {"background", "size", "motion", "order"}
    assert "wrong_video_control_accuracy" in card["quality"]
    from transformers import AutoProcessor, LlavaNextVideoForConditionalGeneration

    model = LlavaNextVideoForConditionalGeneration.from_pretrained(out, dtype=torch.float32)
    assert model.config.text_config.max_position_embeddings >= 288 + 150
    scene, _ = sample_detailed_example(1)
    from mmspec.world import render_video

    inputs = AutoProcessor.from_pretrained(out)(text="<video>describe the video.",
                                               videos=render_video(scene, 8, 96), return_tensors="pt")
    assert int((inputs["input_ids"] == model.config.video_token_index).sum()) == cd.VISUAL_TOKENS


@pytest.mark.parametrize("argv, message", [
    (["--init-from", "/nonexistent/captioner"], "not a saved captioner folder"),
    (["--frames", "0"], "must be >= 1"),
    (["--workers", "-1"], "--workers must be >= 0"),
    (["--device", "cuda:99"], "CUDA GPU"),
    (["--device", "gpu0"], "is not a device"),
])
def test_bad_options_are_one_line_and_exit_2(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(recipe, "train", lambda args: pytest.fail("must not train"))
    with pytest.raises(SystemExit) as info:
        recipe.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_aux_targets_mark_interactions_and_turns():
    mover = Shape("circle", "red", "small", 0.2, 0.5, motion="moving", direction="right", velocity=(0.45, 0.0))
    block = Shape("square", "blue", "large", 0.45, 0.5)
    scene = DetailedScene((mover, block), "white")
    target = recipe.aux_targets(scene)
    assert target.shape == (recipe.AUX_OUT,)
    relations, turns = target[cd.AUX_DIM:cd.AUX_DIM + 3], target[cd.AUX_DIM + 3:]
    assert relations.tolist() == [1.0, 0.0, 0.0]  # the circle passes behind the square
    assert np.argmax(turns) == 1  # one turn


def test_worker_processes_prepare_the_same_batches_in_order(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(recipe.OUT_DIR)
    batches = recipe.CaptioningBatches(tok, cd.prompt_ids(tok), seed=0, first=5, size=2, steps=3, frames=2)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=2)
    for b, got in enumerate(loader):
        for mine, theirs in zip(batches[b], got):
            assert torch.equal(mine, theirs)
    # batch 1 starts at train example first + size
    scene, caption = sample_detailed_example(recipe.example_seed("train", 0, 7))
    ids = batches[1][1][0]
    assert tok.decode(ids[ids != tok.pad_token_id][len(cd.prompt_ids(tok)):], skip_special_tokens=True).strip() == caption
