"""Fast tests of the shapes world (scenes, renders, captions, datasets)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from mmspec.world import (
    COLOURS,
    KINDS,
    MOTIONS,
    Scene,
    Shape,
    caption,
    caption_corpus,
    describe,
    example_seed,
    heldout_prompts,
    render_image,
    render_video,
    sample_scene,
    shape_state,
    write_prompts_file,
    write_video,
)


def test_scene_is_deterministic_for_a_seed():
    assert sample_scene(123) == sample_scene(123)
    assert sample_scene(random.Random(7)) == sample_scene(random.Random(7))
    assert any(sample_scene(s) != sample_scene(123) for s in range(5))


def test_every_kind_colour_and_motion_appears():
    scenes = [sample_scene(s) for s in range(400)]
    shapes = [sh for sc in scenes for sh in sc.shapes]
    assert {s.kind for s in shapes} == set(KINDS)
    assert {s.colour for s in shapes} == set(COLOURS)
    assert {s.motion for s in shapes} == set(MOTIONS)
    assert {len(sc.shapes) for sc in scenes} == {1, 2, 3}


def test_bad_shape_is_rejected():
    with pytest.raises(ValueError, match="kind"):
        Shape("hexagon", "red", "small", 0.5, 0.5)
    with pytest.raises(ValueError, match="direction"):
        Shape("circle", "red", "small", 0.5, 0.5, motion="moving")


@pytest.mark.parametrize("size,expected", [(32, (32, 32)), ((24, 40), (24, 40)), ((37, 11), (37, 11))])
def test_image_has_requested_size(size, expected):
    img = render_image(sample_scene(3), size=size, t=0.3)
    assert img.mode == "RGB"
    assert (img.height, img.width) == expected


def test_video_shape_and_motion():
    moving = Shape("square", "red", "medium", 0.2, 0.5, motion="moving", direction="right",
                   velocity=(0.45, 0.0))
    video = render_video(Scene([moving], "white"), num_frames=8, size=(32, 48))
    assert video.shape == (8, 32, 48, 3) and video.dtype == np.uint8
    assert not np.array_equal(video[0], video[-1])
    # The red mass moves right: its mean column grows.
    red = lambda f: np.argwhere((f[..., 0] > 180) & (f[..., 1] < 100))[:, 1].mean()  # noqa: E731
    assert red(video[-1]) > red(video[0]) + 10


def test_motions_change_state_over_time():
    still = Shape("circle", "blue", "small", 0.5, 0.5)
    assert shape_state(still, 0.0) == shape_state(still, 1.0)
    grow = Shape("circle", "blue", "small", 0.5, 0.5, motion="growing")
    assert shape_state(grow, 1.0)[2] > shape_state(grow, 0.0)[2]
    change = Shape("star", "blue", "large", 0.5, 0.5, motion="changing", to_colour="green")
    assert shape_state(change, 0.4)[3] == "blue" and shape_state(change, 0.6)[3] == "green"
    bounce = Shape("circle", "red", "small", 0.5, 0.5, motion="bouncing", velocity=(1.7, 1.1))
    for t in np.linspace(0, 1, 21):
        x, y, r, _ = shape_state(bounce, t)
        assert r <= x <= 1 - r and r <= y <= 1 - r


def test_caption_is_fixed_for_a_seed_and_varies_across_seeds():
    scene = sample_scene(11)
    assert caption(scene, 5) == caption(scene, 5)
    assert len({caption(scene, s) for s in range(30)}) > 5  # same scene, different wording
    corpus = caption_corpus(300, seed=0)
    assert corpus == caption_corpus(300, seed=0)
    assert len(set(corpus)) > 250
    for c in corpus:
        assert c == c.lower() and c.endswith(".")
        assert 10 <= len(c.split()) <= 35


def test_caption_mentions_scene_content():
    scene = Scene([Shape("triangle", "purple", "large", 0.1, 0.1, motion="moving", direction="down",
                         velocity=(0.0, 0.45))], "black")
    for s in range(10):
        c = caption(scene, s)
        assert "purple" in c and "triangle" in c and ("down" in c)


def test_counts_for_identical_shapes():
    a = Shape("circle", "red", "small", 0.2, 0.2)
    b = Shape("circle", "red", "small", 0.8, 0.8)
    caps = [caption(Scene([a, b]), s) for s in range(20)]
    assert all("two" in c for c in caps)


def test_describe_is_json_able():
    d = describe(sample_scene(5))
    assert json.loads(json.dumps(d)) == d
    assert d["num_shapes"] == len(d["shapes"]) >= 1


def test_heldout_is_disjoint_from_train():
    train = {example_seed("train", 0, i) for i in range(2000)}
    held = {example_seed("heldout", 0, i) for i in range(2000)}
    assert not train & held
    assert caption_corpus(50, 0, "heldout") != caption_corpus(50, 0, "train")


def test_prompts_are_prefixes_of_heldout_captions(tmp_path):
    prompts = heldout_prompts(40, seed=0)
    full = caption_corpus(40, 0, "heldout")
    for p, c in zip(prompts, full):
        assert c.startswith(p) and len(p) < len(c)
    path = write_prompts_file(tmp_path / "prompts.txt", n=40, seed=0)
    assert path.read_text().splitlines() == prompts


def test_detailed_prompts_are_prefixes_of_heldout_detailed_captions():
    from mmspec.world import detailed_examples

    prompts = heldout_prompts(20, seed=0, scenes="detailed")
    for p, (_, c) in zip(prompts, detailed_examples(20, 0, "heldout")):
        assert c.startswith(p) and len(p) < len(c)
    assert prompts != heldout_prompts(20, seed=0)
    with pytest.raises(ValueError, match="scenes must be one of"):
        heldout_prompts(2, scenes="three-shape")


def test_write_video_round_trips(tmp_path):
    av = pytest.importorskip("av")
    frames = render_video(sample_scene(2), num_frames=10, size=(33, 45))  # odd sides on purpose
    path = write_video(tmp_path / "video.mp4", frames, fps=8)
    with av.open(str(path)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == 10
    assert decoded[0].shape[:2] == (34, 46)
