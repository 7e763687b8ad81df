"""The README's quick start: `mmspec caption demos/assets/shapes.mp4` captions the shipped sample right.

The sample is a held-out shapes-world video within the toy captioner's scope (one shape); every
lossless method gives the same caption, so the default method is checked against the scene itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmspec.cli import main
from mmspec.zoo import entries

SAMPLE = Path(__file__).resolve().parents[1] / "demos" / "assets" / "shapes.mp4"
SAMPLE_SEED = 100  # demos/assets/shapes.txt says how the sample was made


@pytest.mark.skipif("shapes-video-captioner" not in {e.name for e in entries()}, reason="needs the zoo captioner")
def test_quick_start_captions_the_sample_video_right(capsys):
    from mmspec.vision.recipes import captioner_data as cd
    from mmspec.world import examples

    scene, _ = examples(1, seed=SAMPLE_SEED, split="heldout", max_shapes=1)[0]
    assert len(scene.shapes) == 1  # within the captioner's scope (trained on one-shape videos)
    assert main(["caption", str(SAMPLE), "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    got, truth = cd.parse_caption(result["text"]), cd.scene_attributes(scene)
    for attribute in ("colours", "kinds", "motions", "directions"):
        assert got[attribute] == truth[attribute], (attribute, result["text"])
    assert result["stats"]["new_tokens"] >= 1 and result["stats"]["mean_accepted_length"] >= 1
    assert "Loading weights" not in captured.err  # transformers' bars stay hidden without --verbose
