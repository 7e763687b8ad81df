"""Detailed shapes world: multi-shape scenes with turns and interactions, long captions, the
fact checker (round trip and corrupted-caption controls) and the long-video mode."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

from mmspec.world import (
    LONG_FRAMES,
    DetailedScene,
    Shape,
    all_correct,
    check_caption,
    detailed_caption,
    detailed_examples,
    estimate_tokens,
    event_slots,
    interactions,
    parse_facts,
    render_video,
    sample_detailed_example,
    sample_detailed_scene,
    scene_facts,
)
from mmspec.world.detailed_captions import MAX_TOKENS, MIN_TOKENS

N = 200


@pytest.fixture(scope="module")
def corpus():
    return detailed_examples(N, seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from mmspec.zoo import MODELS_DIR

    return AutoTokenizer.from_pretrained(MODELS_DIR / "shapes-caption-lm")


def test_scene_and_caption_are_fixed_for_a_seed():
    assert sample_detailed_scene(5) == sample_detailed_scene(5)
    assert sample_detailed_example(17) == sample_detailed_example(17)
    assert sample_detailed_scene(5) != sample_detailed_scene(6)
    scene = sample_detailed_scene(3)
    assert detailed_caption(scene, 9) == detailed_caption(scene, 9)


def test_scenes_cover_counts_turns_and_interactions(corpus):
    scenes = [s for s, _ in corpus]
    assert {len(s.shapes) for s in scenes} == {1, 2, 3, 4}
    assert {len(event_slots(s)) for s in scenes} >= {0, 1, 2, 3}
    relations = Counter(it.relation for s in scenes for it in interactions(s))
    assert relations["behind"] > 10 and relations["in front of"] > 10 and relations["meets"] >= 1
    for s in scenes:  # colour + kind names one shape
        assert len({(sh.colour, sh.kind) for sh in s.shapes}) == len(s.shapes)


def test_bad_detailed_scenes_are_rejected():
    a = Shape("circle", "red", "small", 0.2, 0.2)
    with pytest.raises(ValueError, match="colour and kind"):
        DetailedScene((a, Shape("circle", "red", "large", 0.8, 0.8)))
    with pytest.raises(ValueError, match="window"):
        DetailedScene((a,), windows=((0.6, 0.4),))
    with pytest.raises(ValueError, match="motions"):
        DetailedScene((Shape("circle", "red", "small", 0.5, 0.5, motion="bouncing", velocity=(1.2, 0.7)),))


def test_tokens_per_caption_with_the_shipped_tokenizer(corpus, tokenizer):
    counts = [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for _, c in corpus]
    assert MIN_TOKENS <= min(counts) and max(counts) <= MAX_TOKENS, (min(counts), max(counts))
    # the estimate the grammar fits lengths with stays close to the real count
    errors = [abs(estimate_tokens(c) - n) / n for (_, c), n in zip(corpus, counts)]
    assert np.mean(errors) < 0.1


def test_captions_vary(corpus):
    captions = [c for _, c in corpus]
    assert len(set(captions)) == len(captions)
    scene = next(s for s, _ in corpus if len(s.shapes) == 3)
    assert len({detailed_caption(scene, k) for k in range(30)}) > 20  # same scene, different wording
    text = " ".join(captions)
    for synonyms in (("circle", "ball", "disc"), ("square", "box"), ("large", "big"), ("small", "little"),
                     ("moves", "slides", "travels"), ("passes behind", "goes behind"),
                     ("first,", "at the start,", "to begin with,"), ("finally,", "at the end,"),
                     ("while", "at the same time"), ("background is", "on a")):
        assert all(s in text for s in synonyms), synonyms
    # clause order: the background opens some captions and closes others; still shapes come
    # before the events in some and after them in others
    assert any(c.split(".")[0].endswith("background") for c in captions)
    assert any("background" in c.split(".")[-2] for c in captions)
    still_first = [c.find("still") < c.find(w) for c in captions for w in (" moves ", " slides ")
                   if "still" in c and w in c]
    assert any(still_first) and not all(still_first)


def test_checker_round_trips_generated_captions(corpus):
    for scene, caption in corpus:
        scores = check_caption(caption, scene)
        assert all_correct(scores), (caption, scores)
    totals = Counter()
    for scene, caption in corpus:
        for attr, (_, total) in check_caption(caption, scene).items():
            totals[attr] += total
    assert all(totals[a] > 0 for a in ("direction", "to_colour", "end_region", "interactions", "order"))


def test_checker_gives_no_credit_to_an_empty_caption(corpus):
    scene = next(s for s, _ in corpus if len(s.shapes) == 4)
    scores = check_caption("", scene)
    assert all(correct == 0 for correct, _ in scores.values())


def _swap_word(caption: str, pattern: str, choices: tuple[str, ...]) -> str | None:
    m = re.search(pattern, caption)
    if not m:
        return None
    new = next(c for c in choices if c != m.group(1))
    return caption[: m.start(1)] + new + caption[m.end(1):]


TURN_HEAD = r"(first,|at the start,|to begin with,|after that,|next,|finally,|at the end,|then) "


def _swap_turns(caption: str) -> str | None:
    """Swap what happens in the first and the last turn (their connectives stay in place)."""
    sentences = caption[:-1].split(". ")
    turns = [(i, m) for i, s in enumerate(sentences) if (m := re.match(TURN_HEAD, s))]
    if len(turns) < 2:
        return None
    (a, ma), (b, mb) = turns[0], turns[-1]
    sentences[a], sentences[b] = ma.group(0) + sentences[b][mb.end():], mb.group(0) + sentences[a][ma.end():]
    return ". ".join(sentences) + "."


CORRUPTIONS = {
    "background": lambda c: _swap_word(c, r"\b(?:background is |on a )(white|black|grey)\b", ("black", "white")),
    "size": lambda c: _swap_word(c, r"\ban? (small|little|medium|large|big) ", ("medium", "small")),
    "direction": lambda c: _swap_word(c, r"\b(?:moves|slides|travels) (?:to the )?(left|right|up|down)",
                                      ("down", "up")),
    "to_colour": lambda c: _swap_word(c, r"\b(?:turns|colour to|to) (red|blue|green|yellow|purple|orange)\b",
                                      ("purple", "orange")),
    "interactions": lambda c: (c.replace(" behind ", " in front of ", 1) if " behind " in c
                               else c.replace(" in front of ", " behind ", 1) if " in front of " in c else None),
    "order": _swap_turns,
    "region": lambda c: _swap_word(c, r"\b(?:is|starts|begins) (in the centre|in the middle|at the top|at the bottom)",
                                   ("near the left edge", "in the top left")),
}


@pytest.mark.parametrize("attribute", sorted(CORRUPTIONS))
def test_checker_catches_corrupted_captions(corpus, attribute):
    corrupt = CORRUPTIONS[attribute]
    caught = 0
    for scene, caption in corpus:
        bad = corrupt(caption)
        if bad is None or bad == caption:
            continue
        scores = check_caption(bad, scene)
        assert not all_correct(scores), (attribute, bad)
        correct, total = scores[attribute]
        assert correct < total, (attribute, bad, scores)
        caught += 1
    assert caught >= 5, f"only {caught} captions could be corrupted for {attribute}"


def test_parse_reads_a_hand_written_caption():
    facts = parse_facts("we see two shapes on a grey background. a big blue box is in the top left. "
                        "a little red ball starts near the bottom. first, the red ball slides up and passes "
                        "behind the blue box and ends up at the top. then the blue box turns green.")
    assert facts["background"] == "grey" and facts["count"] == 2
    assert facts["shapes"][("blue", "square")] == {"size": "large", "region": "top left", "motion": "changing",
                                                   "to_colour": "green"}
    assert facts["shapes"][("red", "circle")]["direction"] == "up"
    assert facts["interactions"] == {(("red", "circle"), ("blue", "square"), "behind")}
    assert facts["turns"] == {("red", "circle"): 0, ("blue", "square"): 1}


def _crossing(mover_first: bool) -> DetailedScene:
    mover = Shape("circle", "red", "small", 0.2, 0.5, motion="moving", direction="right", velocity=(0.45, 0.0))
    block = Shape("square", "blue", "large", 0.45, 0.5)
    shapes = (mover, block) if mover_first else (block, mover)
    return DetailedScene(shapes, "white", windows=((0.0, 1.0), (0.0, 1.0)))


def test_depth_order_decides_behind_or_in_front():
    behind, front = _crossing(True), _crossing(False)
    assert [it.relation for it in interactions(behind)] == ["behind"]
    assert [it.relation for it in interactions(front)] == ["in front of"]
    # half-way the circle's centre is at x = 0.425, over the square: which colour shows there?
    for scene, colour in ((behind, (40, 80, 220)), (front, (220, 40, 40))):
        frame = render_video(scene, 3, 96)[1]
        assert tuple(frame[48, int(0.425 * 96)]) == colour
    for scene in (behind, front):
        facts = scene_facts(scene)
        assert facts["shapes"][("red", "circle")]["end_region"] == "centre"


def test_windows_order_the_events():
    late = Shape("circle", "red", "small", 0.2, 0.2, motion="moving", direction="right", velocity=(0.45, 0.0))
    early = Shape("star", "green", "medium", 0.7, 0.7, motion="changing", to_colour="yellow")
    scene = DetailedScene((late, early), "black", windows=((0.5, 1.0), (0.0, 0.5)))
    assert event_slots(scene) == [[1], [0]]
    assert scene.state(0, 0.4)[:2] == (0.2, 0.2)  # not started yet
    assert scene.state(1, 0.3)[3] == "yellow"  # changed half-way through its own window
    caption = detailed_caption(scene, 0)
    assert caption.index("green star") < caption.rindex("red ")
    assert all_correct(check_caption(caption, scene))


def test_long_video_mode(corpus):
    assert LONG_FRAMES >= 64 and LONG_FRAMES * 36 >= 2304  # pooled tokens of the LLaVA-NeXT-Video toy
    scene = next(s for s, _ in corpus if any(sh.motion == "moving" for sh in s.shapes))
    video = render_video(scene, LONG_FRAMES, 96)
    assert video.shape == (LONG_FRAMES, 96, 96, 3) and video.dtype == np.uint8
    short = render_video(scene, 8, 96)
    # the same clip: the long video's first and last frames are the short one's
    assert np.array_equal(video[0], short[0]) and np.array_equal(video[-1], short[-1])
    assert len({video[i].tobytes() for i in range(LONG_FRAMES)}) > 8


def test_captioner_examples_follow_the_card():
    from mmspec.world import DetailedScene, Scene, caption_token_cap, captioner_examples, detailed_examples, examples

    detailed = {"scenes": "detailed", "max_shapes": 2}
    got = captioner_examples(detailed, 3, seed=4, split="train")
    assert got == detailed_examples(3, 4, "train", max_shapes=2)
    assert all(isinstance(s, DetailedScene) and len(s.shapes) <= 2 for s, _ in got)
    one_shape = captioner_examples({}, 3, seed=4)  # no "scenes": the one-shape grammar, held-out by default
    assert one_shape == examples(3, 4, "heldout") and all(isinstance(s, Scene) for s, _ in one_shape)
    assert caption_token_cap(detailed) > 150 >= 48 == caption_token_cap({})
