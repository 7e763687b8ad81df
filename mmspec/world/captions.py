"""Caption grammar for shapes-world scenes.

``caption(scene, rng)`` turns a scene into one lowercase English sentence (or two)
with real but limited variety: weighted synonyms, three sentence frames, optional
size / start-position / background details, counts for identical shapes and
several ways of joining clauses. Most words follow from the previous words plus
the scene; a few positions per caption are genuine choices, which is what a
speculative-decoding drafter should find: predictable, not trivially so.

Every choice is drawn up front from the caller's ``random.Random`` (or seed), so a
caption is fixed for a seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .scenes import Scene, Shape, as_rng, region

MIN_WORDS, MAX_WORDS = 10, 35

Options = list[tuple[str, float]]

SIZE_WORDS: dict[str, Options] = {
    "small": [("small", 0.7), ("little", 0.3)],
    "medium": [("medium", 1.0)],
    "large": [("large", 0.6), ("big", 0.4)],
}
# (singular, plural) per synonym
KIND_WORDS: dict[str, list[tuple[tuple[str, str], float]]] = {
    "circle": [(("circle", "circles"), 0.65), (("ball", "balls"), 0.2), (("disc", "discs"), 0.15)],
    "square": [(("square", "squares"), 0.7), (("box", "boxes"), 0.3)],
    "triangle": [(("triangle", "triangles"), 1.0)],
    "star": [(("star", "stars"), 1.0)],
}
COUNT_WORDS = {2: "two", 3: "three", 4: "four"}
REGION_PHRASES: dict[str, Options] = {
    "top left": [("in the top left corner", 0.5), ("in the top left", 0.5)],
    "top right": [("in the top right corner", 0.5), ("in the top right", 0.5)],
    "bottom left": [("in the bottom left corner", 0.5), ("in the bottom left", 0.5)],
    "bottom right": [("in the bottom right corner", 0.5), ("in the bottom right", 0.5)],
    "top": [("at the top", 0.6), ("near the top", 0.4)],
    "bottom": [("at the bottom", 0.6), ("near the bottom", 0.4)],
    "left": [("on the left", 0.6), ("near the left edge", 0.4)],
    "right": [("on the right", 0.6), ("near the right edge", 0.4)],
    "centre": [("in the centre", 0.6), ("in the middle", 0.4)],
}
# Verb phrases as (third person singular, plural, gerund); "{d}" = direction,
# "{a}"/"{b}" = colour before / after a change.
VERBS: dict[str, list[tuple[tuple[str, str, str], float]]] = {
    "still": [
        (("stays still", "stay still", "staying still"), 0.5),
        (("does not move", "do not move", "not moving"), 0.3),
        (("sits still", "sit still", "sitting still"), 0.2),
    ],
    "moving": [
        (("moves {d}", "move {d}", "moving {d}"), 0.55),
        (("slides {d}", "slide {d}", "sliding {d}"), 0.25),
        (("travels {d}", "travel {d}", "travelling {d}"), 0.2),
    ],
    "bouncing": [
        (("bounces around", "bounce around", "bouncing around"), 0.6),
        (("bounces off the walls", "bounce off the walls", "bouncing off the walls"), 0.4),
    ],
    "growing": [
        (("grows", "grow", "growing"), 0.5),
        (("gets bigger", "get bigger", "getting bigger"), 0.5),
    ],
    "shrinking": [
        (("shrinks", "shrink", "shrinking"), 0.5),
        (("gets smaller", "get smaller", "getting smaller"), 0.5),
    ],
    "changing": [
        (("turns {b}", "turn {b}", "turning {b}"), 0.5),
        (("changes colour to {b}", "change colour to {b}", "changing colour to {b}"), 0.3),
        (("changes from {a} to {b}", "change from {a} to {b}", "changing from {a} to {b}"), 0.2),
    ],
}
DIRECTION_WORDS: dict[str, Options] = {
    "left": [("to the left", 0.6), ("left", 0.4)],
    "right": [("to the right", 0.6), ("right", 0.4)],
    "up": [("up", 0.6), ("upwards", 0.4)],
    "down": [("down", 0.6), ("downwards", 0.4)],
}
FRAMES: Options = [("plain", 0.45), ("intro", 0.3), ("shows", 0.25)]
INTROS: Options = [("in this video,", 0.5), ("in this clip,", 0.3), ("in the video,", 0.2)]
LEADS: Options = [("the video shows", 0.4), ("this clip shows", 0.3), ("we see", 0.3)]
JOIN2: Options = [("and", 0.5), ("while", 0.3), ("stop", 0.2)]
JOIN3: Options = [("list", 0.7), ("stop", 0.3)]
BACKGROUND_PHRASES: Options = [("the background is {c}", 0.7), ("it is on a {c} background", 0.3)]


def _choose(rng: random.Random, options: list[tuple]) -> object:
    return rng.choices([o for o, _ in options], weights=[w for _, w in options], k=1)[0]


def _group_key(s: Shape) -> tuple:
    return (s.kind, s.colour, s.size, s.motion, s.direction, s.to_colour)


def group_shapes(scene: Scene) -> list[list[Shape]]:
    """Identical-looking shapes with the same motion, in order of first appearance."""
    groups: dict[tuple, list[Shape]] = {}
    for s in scene.shapes:
        groups.setdefault(_group_key(s), []).append(s)
    return list(groups.values())


def describe(scene: Scene) -> dict:
    """A JSON-able structured description of ``scene`` (what a caption is made from)."""
    shapes = []
    for s in scene.shapes:
        d = {"kind": s.kind, "colour": s.colour, "size": s.size, "x": s.x, "y": s.y,
             "region": region(s.x, s.y), "motion": s.motion}
        if s.motion == "moving":
            d["direction"] = s.direction
        if s.motion == "bouncing":
            d["velocity"] = list(s.velocity)
        if s.motion == "changing":
            d["to_colour"] = s.to_colour
        shapes.append(d)
    groups = [{"count": len(g), "kind": g[0].kind, "colour": g[0].colour, "size": g[0].size,
               "motion": g[0].motion} for g in group_shapes(scene)]
    return {"background": scene.background, "num_shapes": len(scene.shapes),
            "shapes": shapes, "groups": groups}


@dataclass
class _GroupPlan:
    """Every word choice for one group, drawn before we know which details to show."""

    shapes: list[Shape]
    size_word: str
    kind_words: tuple[str, str]
    verb: tuple[str, str, str]
    direction_word: str
    region_phrase: str
    there: bool  # "there is a ... that ..." instead of subject-verb
    show_size: bool
    show_region: bool


def _plan_group(rng: random.Random, group: list[Shape]) -> _GroupPlan:
    s = group[0]
    return _GroupPlan(
        shapes=group,
        size_word=_choose(rng, SIZE_WORDS[s.size]),
        kind_words=_choose(rng, KIND_WORDS[s.kind]),
        verb=_choose(rng, VERBS[s.motion]),
        direction_word=_choose(rng, DIRECTION_WORDS[s.direction]) if s.direction else "",
        region_phrase=_choose(rng, REGION_PHRASES[region(s.x, s.y)]),
        there=rng.random() < 0.3,
        show_size=rng.random() < 0.5,
        show_region=len(group) == 1 and rng.random() < 0.4,
    )


def _noun_phrase(p: _GroupPlan) -> str:
    s, n = p.shapes[0], len(p.shapes)
    words = ([p.size_word] if p.show_size else []) + [s.colour, p.kind_words[0 if n == 1 else 1]]
    det = COUNT_WORDS.get(n, str(n)) if n > 1 else ("an" if words[0][0] in "aeiou" else "a")
    np_ = " ".join([det, *words])
    return f"{np_} {p.region_phrase}" if p.show_region else np_


def _verb_phrase(p: _GroupPlan, form: int) -> str:
    s = p.shapes[0]
    return p.verb[form].format(d=p.direction_word, a=s.colour, b=s.to_colour or "")


def _clause(p: _GroupPlan, gerund: bool) -> str:
    plural = len(p.shapes) > 1
    if gerund:
        return f"{_noun_phrase(p)} {_verb_phrase(p, 2)}"
    vp = _verb_phrase(p, 1 if plural else 0)
    if p.there:
        return f"there {'are' if plural else 'is'} {_noun_phrase(p)} that {vp}"
    return f"{_noun_phrase(p)} {vp}"


def _join(clauses: list[str], how: str) -> str:
    if len(clauses) == 1:
        return clauses[0]
    if how == "stop":
        return ". ".join(clauses)
    if how == "while":
        return f"{clauses[0]}, while {clauses[1]}"
    # "and" / "list": "a, b and c"
    return f"{', '.join(clauses[:-1])} and {clauses[-1]}"


@dataclass
class _Plan:
    frame: str
    opener: str
    join: str
    background: str
    show_background: bool
    groups: list[_GroupPlan]

    def text(self) -> str:
        gerund = self.frame == "shows"
        body = _join([_clause(g, gerund) for g in self.groups], "and" if gerund else self.join)
        if self.frame != "plain":
            body = f"{self.opener} {body}"
        if self.show_background:
            body = f"{body}. {self.background}"
        return body + "."


def _plan(scene: Scene, rng: random.Random) -> _Plan:
    groups = [_plan_group(rng, g) for g in group_shapes(scene)]
    frame = _choose(rng, FRAMES)
    opener = _choose(rng, INTROS if frame == "intro" else LEADS)
    join = _choose(rng, JOIN2 if len(groups) == 2 else JOIN3)
    bg = _choose(rng, BACKGROUND_PHRASES).format(c=scene.background)
    return _Plan(frame, opener, join, bg, rng.random() < 0.3, groups)


def _fit_length(plan: _Plan) -> None:
    """Switch optional details on (too short) or off (too long) in a fixed order."""
    n_words = lambda: len(plan.text().split())  # noqa: E731
    grow = [("show_size", g) for g in plan.groups] + [
        ("show_region", g) for g in plan.groups if len(g.shapes) == 1]
    for attr, g in grow:
        if n_words() >= MIN_WORDS:
            break
        setattr(g, attr, True)
    if n_words() < MIN_WORDS:
        plan.show_background = True
    if n_words() < MIN_WORDS and plan.frame == "plain":
        plan.frame = "intro"
        plan.opener = INTROS[0][0]
    shrink = [("show_region", g) for g in plan.groups] + [("show_size", g) for g in plan.groups]
    if n_words() > MAX_WORDS:
        plan.show_background = False
    for attr, g in shrink:
        if n_words() <= MAX_WORDS:
            break
        setattr(g, attr, False)
    for g in plan.groups:
        if n_words() <= MAX_WORDS:
            break
        g.there = False


def caption(scene: Scene, rng: random.Random | int | None = None) -> str:
    """One lowercase caption of ``scene`` ending with a period; fixed for a given seed."""
    plan = _plan(scene, as_rng(rng))
    _fit_length(plan)
    return plan.text()
