"""The README's quick start: `mmspec caption demos/assets/shapes.mp4` captions the shipped sample right.

The sample is a held-out detailed shapes-world video (two shapes that meet or pass each other); every
lossless method gives the same caption, so the default method is checked against the scene's facts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmspec.cli import main
from mmspec.zoo import entries

SAMPLE = Path(__file__).resolve().parents[1] / "demos" / "assets" / "shapes.mp4"
SAMPLE_INDEX = 161  # held-out example index; demos/assets/shapes.txt says how the sample was made and chosen


@pytest.mark.skipif("shapes-video-captioner" not in {e.name for e in entries()}, reason="needs the zoo captioner")
def test_quick_start_captions_the_sample_video_right(capsys):
    from mmspec.world import check_caption, example_seed, sample_detailed_example

    scene, _ = sample_detailed_example(example_seed("heldout", 0, SAMPLE_INDEX))
    assert len(scene.shapes) == 2
    assert main(["caption", str(SAMPLE), "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    scores = check_caption(result["text"], scene)
    for attribute in ("count", "background", "shapes", "size", "motion", "direction", "interactions"):
        assert scores[attribute][0] == scores[attribute][1], (attribute, scores, result["text"])
    assert result["stats"]["new_tokens"] >= 1 and result["stats"]["mean_accepted_length"] >= 1
    assert "Loading weights" not in captured.err  # transformers' bars stay hidden without --verbose


@pytest.mark.slow
@pytest.mark.skipif("shapes-video-captioner" not in {e.name for e in entries()}, reason="needs the zoo captioner")
def test_temperature_zero_is_greedy_and_lengths_past_the_context_are_cut(capsys, monkeypatch):
    from mmspec.vision.pipeline import CaptionPipeline

    calls = []
    real_call = CaptionPipeline.__call__

    def spy(self, *args, **kwargs):
        calls.append(kwargs)
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(CaptionPipeline, "__call__", spy)
    code = main(["caption", str(SAMPLE), "--json", "--temperature", "0", "--max-new-tokens", "1000000000",
                 "--num-draft-tokens", "1000"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert calls[0]["do_sample"] is False  # temperature 0 = greedy, not sampling at 1.0
    notes = json.loads(captured.out)["notes"]
    assert any(note.startswith("max_new_tokens cut from 1000000000 to 214") for note in notes), notes
    assert any("drafts of 1000 tokens are cut" in note for note in notes), notes
    assert all(f"mmspec: {note}" in captured.err for note in notes)


@pytest.mark.skipif("shapes-video-captioner" not in {e.name for e in entries()}, reason="needs the zoo captioner")
def test_a_prompt_holding_the_placeholder_is_used_as_is(capsys):
    assert main(["caption", str(SAMPLE), "--prompt", "Describe <video> in detail", "--max-new-tokens", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["new_tokens"] >= 1
    code = main(["caption", str(SAMPLE), "--prompt", "<video> and <video>", "--max-new-tokens", "4"])
    assert code == 2 and "the prompt holds 2 <video> placeholders; one video is given" in capsys.readouterr().err
