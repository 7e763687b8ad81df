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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_low_rank_run_writes_an_overlay_on_the_zoo_captioner(tmp_path, capsys, monkeypatch):
    """--rope/--lora: a few MB of overlay and a card deriving from the zoo captioner; loaded through the zoo it is
    the captioner with YaRN positions, its vision tower untouched and its language model moved."""
    monkeypatch.setenv("MMSPEC_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "long"
    recipe.main(["--frames", "2", "--rope", "yarn:2", "--lora", "2", "--text-steps", "0", "--steps", "2",
                 "--batch-size", "1", "--eval-n", "1", "--max-new-tokens", "4", "--lm-lr", "0.05", "--threads", "1",
                 "--out", str(out)])
    assert "saved" in capsys.readouterr().out
    assert not (out / "model.safetensors").exists() and (out / recipe.OVERLAY).stat().st_size < 2_000_000
    card = json.loads((out / "zoo_card.json").read_text())
    assert card["derived_from"]["model"] == "shapes-video-captioner" and card["frames"] == 2
    assert set(card["derived_from"]["folders"]) >= {"text"}
    assert card["rope_parameters"]["rope_type"] == "yarn" and card["overlay"]["low_rank"]["rank"] == 2
    from transformers import LlavaNextVideoForConditionalGeneration

    from mmspec.zoo import resolve

    merged = LlavaNextVideoForConditionalGeneration.from_pretrained(resolve(str(out)), dtype=torch.float32)
    parent = LlavaNextVideoForConditionalGeneration.from_pretrained(recipe.OUT_DIR, dtype=torch.float32)
    assert merged.config.text_config.rope_parameters["factor"] == 2.0
    mine, theirs = dict(merged.named_parameters()), dict(parent.named_parameters())
    moved = {n for n in mine if not torch.equal(mine[n], theirs[n])}
    assert moved and all(".language_model." in n or "multi_modal_projector" in n for n in moved)
    assert any("q_proj" in n for n in moved)


@pytest.mark.parametrize("argv, message", [
    (["--rope", "yarn"], "expected KIND:FACTOR"),
    (["--rope", "ntk:4"], "expected KIND:FACTOR"),
    (["--rope", "yarn:8", "--init-from", "none"], "extends a trained captioner"),
    (["--lora", "-1"], "--lora must be >= 0"),
    (["--lora", "4", "--into-zoo"], "give it its own --out"),
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


@pytest.mark.slow
@pytest.mark.parametrize("steps, resumed_at, runs", [(2, "stage B, step 0", "B step 1"), (1, "stage T, step 1", "B step 0")])
def test_a_killed_run_resumes_to_the_same_captioner(tmp_path, capsys, monkeypatch, steps, resumed_at, runs):
    """Checkpoints every step; a run stopped after training keeps its two newest, and loses the newest of
    them as a run killed one step earlier would; ``--resume`` goes on from there to the same weights."""
    from safetensors.torch import load_file

    common = ["--text-steps", "2", "--steps", str(steps), "--batch-size", "2", "--eval-n", "1",
              "--max-new-tokens", "4", "--threads", "1", "--checkpoint-every", "1"]
    whole = tmp_path / "whole"
    recipe.main([*common, "--out", str(whole), "--checkpoint-dir", str(tmp_path / "ck-whole")])
    assert not (tmp_path / "ck-whole").exists()  # a finished run clears its checkpoints

    ck, real_evaluate = tmp_path / "ck", recipe.evaluate

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe, "evaluate", killed)
    with pytest.raises(KeyboardInterrupt):
        recipe.main([*common, "--out", str(tmp_path / "part"), "--checkpoint-dir", str(ck)])
    kept = sorted(ck.glob("step-*.pt"))  # numbered T 0, 1 then B 0, ...
    assert [p.name for p in kept] == [f"step-{n:08d}.pt" for n in (steps, steps + 1)]
    kept[-1].unlink()
    monkeypatch.setattr(recipe, "evaluate", real_evaluate)
    capsys.readouterr()
    recipe.main([*common, "--out", str(tmp_path / "part"), "--checkpoint-dir", str(ck), "--resume"])
    log = capsys.readouterr().out
    assert f"({resumed_at})" in log and "T step" not in log and f"{runs} caption_loss" in log
    mine, theirs = load_file(tmp_path / "part" / "model.safetensors"), load_file(whole / "model.safetensors")
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    card = json.loads((tmp_path / "part" / "zoo_card.json").read_text())
    assert "--resume" not in card["rebuild_command"] and "checkpoint" not in card["rebuild_command"]


def test_an_overlay_needs_a_zoo_captioner_to_start_from(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(recipe, "train", lambda args: pytest.fail("must not train"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as info:
        recipe.main(["--lora", "4", "--init-from", str(tmp_path)])
    assert info.value.code == 2 and "--init-from must be one" in capsys.readouterr().err
