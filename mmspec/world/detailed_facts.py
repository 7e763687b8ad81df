"""Facts of detailed scenes, read from the scene or parsed back out of a caption, and scored.

:func:`scene_facts` states what a detailed scene shows; :func:`parse_facts` reads the same
facts from a caption (a generated one may be garbled: whatever does not parse is missing);
:func:`score_facts` compares the two attribute by attribute, which is what per-attribute
accuracy of a captioner is computed from. Shapes are matched by their (first) colour and
kind, which are unique within a detailed scene.

Facts per shape: size, start region, motion, direction (moving shapes), new colour
(colour-changing shapes), end region (moving shapes; scored only where a caption states
it). Scene facts: background, shape count, interactions (who passes behind / in front of /
meets whom) and the order of events (for every pair of acting shapes: before, same time,
after).
"""

from __future__ import annotations

import re

from .captions import DIRECTION_WORDS, KIND_WORDS, REGION_PHRASES, SIZE_WORDS
from .detailed_captions import (
    COUNT_PHRASES,
    EVENT_VERBS,
    FIRST_TURN,
    LAST_TURN,
    NEXT_TURN,
    ONE_TURN,
    RELATION_PHRASES,
    STILL_PHRASES,
)
from .detailed_scenes import DetailedScene, event_slots, interactions, key
from .scenes import BACKGROUNDS, COLOURS, region

ATTRIBUTES = ("background", "count", "shapes", "size", "region", "motion", "direction", "to_colour",
              "end_region", "interactions", "order")


def _alt(words) -> str:
    """A regex alternation, longest first (so "in the top left corner" wins over "in the top left")."""
    return "|".join(re.escape(w) for w in sorted(set(words), key=len, reverse=True))


SIZE_OF = {w: size for size, opts in SIZE_WORDS.items() for w, _ in opts}
KIND_OF = {w: kind for kind, opts in KIND_WORDS.items() for (w, _), _ in opts}
REGION_OF = {p: name for name, opts in REGION_PHRASES.items() for p, _ in opts}
DIRECTION_OF = {w: d for d, opts in DIRECTION_WORDS.items() for w, _ in opts}
COUNT_OF = {p: n for n, opts in COUNT_PHRASES.items() for p, _ in opts}
RELATION_OF = {p: rel for rel, opts in RELATION_PHRASES.items() for p, _ in opts}

_C, _K, _S, _R, _D = (_alt(COLOURS), _alt(KIND_OF), _alt(SIZE_OF), _alt(REGION_OF), _alt(DIRECTION_OF))
_INTRO = re.compile(rf"\b(?:a|an) ({_S}) ({_C}) ({_K})(?: (?:is|starts|begins))? ({_R})\b")
_BACKGROUND = re.compile(rf"\b({_alt(BACKGROUNDS)}) background\b|\bbackground is ({_alt(BACKGROUNDS)})\b")
_COUNT = re.compile(rf"\b({_alt(COUNT_OF)})\b")
_TURN_START = re.compile(rf"^(?:{_alt(w for w, _ in FIRST_TURN + NEXT_TURN + LAST_TURN + ONE_TURN if w)})(?=\s)\s*")
_SAME_TURN = re.compile(r",? and at the same time |,? while ")
_SUBJECT = re.compile(rf"^the ({_C}) ({_K}) (.*)$")
_MOTIONS = {
    "moving": re.compile(rf"^(?:{_alt(v.split()[0] for v, _ in EVENT_VERBS['moving'])}) ({_D})\b"),
    "growing": re.compile(rf"^(?:{_alt(v for v, _ in EVENT_VERBS['growing'])})\b"),
    "shrinking": re.compile(rf"^(?:{_alt(v for v, _ in EVENT_VERBS['shrinking'])})\b"),
    "changing": re.compile(rf"^(?:turns|changes colour to|changes from (?:{_C}) to) ({_C})\b"),
    "still": re.compile(rf"^(?:{_alt(v for v, _ in STILL_PHRASES)})\b"),
}
_RELATION = re.compile(rf"\band ({_alt(RELATION_OF)}) the ({_C}) ({_K})\b")
_END = re.compile(rf"\band (?:ends up|stops) ({_R})\b")


def scene_facts(scene: DetailedScene) -> dict:
    """What ``scene`` shows, in the form :func:`parse_facts` returns."""
    shapes = {}
    for i, s in enumerate(scene.shapes):
        x, y, _, _ = scene.state(i, 1.0)
        shapes[key(s)] = {"size": s.size, "region": region(s.x, s.y), "motion": s.motion,
                          "direction": s.direction, "to_colour": s.to_colour,
                          "end_region": region(x, y) if s.motion == "moving" else None}
    turns = {key(scene.shapes[i]): k for k, turn in enumerate(event_slots(scene)) for i in turn}
    links = {_link(key(scene.shapes[it.mover]), it.relation, key(scene.shapes[it.other]))
             for it in interactions(scene)}
    return {"background": scene.background, "count": len(scene.shapes), "shapes": shapes,
            "interactions": links, "turns": turns}


def _link(a: tuple, relation: str, b: tuple) -> tuple:
    """An interaction; "meets" is symmetric, so its pair is sorted."""
    return (*sorted([a, b]), "meets") if relation == "meets" else (a, b, relation)


def parse_facts(caption: str) -> dict:
    """The facts a caption states; a fact it does not state (or garbles) is missing."""
    text = caption.lower()
    shapes: dict[tuple, dict] = {}
    for size, colour, kind, where in _INTRO.findall(text):
        shapes.setdefault((colour, KIND_OF[kind]), {"size": SIZE_OF[size], "region": REGION_OF[where]})
    bg = _BACKGROUND.search(text)
    count = _COUNT.search(text)
    links, turns = set(), {}
    turn = -1
    for sentence in re.split(r"\.\s*", text):
        lead = _TURN_START.match(sentence)
        if lead:
            turn += 1
            sentence = sentence[lead.end():]
        for clause in _SAME_TURN.split(sentence):
            subject = _SUBJECT.match(clause.strip())
            if not subject:
                continue
            colour, kind, rest = subject.groups()
            k = (colour, KIND_OF[kind])
            facts = shapes.setdefault(k, {})
            for motion, pattern in _MOTIONS.items():
                found = pattern.match(rest)
                if found:
                    facts["motion"] = motion
                    if motion == "moving":
                        facts["direction"] = DIRECTION_OF[found.group(1)]
                    if motion == "changing":
                        facts["to_colour"] = found.group(1)
                    if motion != "still":
                        turns[k] = max(turn, 0)
                    break
            for phrase, c, kd in _RELATION.findall(rest):
                links.add(_link(k, RELATION_OF[phrase], (c, KIND_OF[kd])))
            end = _END.search(rest)
            if end:
                facts["end_region"] = REGION_OF[end.group(1)]
    return {"background": (bg.group(1) or bg.group(2)) if bg else None,
            "count": COUNT_OF[count.group(1)] if count else None,
            "shapes": shapes, "interactions": links, "turns": turns}


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def score_facts(predicted: dict, gold: dict) -> dict[str, tuple[int, int]]:
    """Per attribute, ``(correct, total)``.

    Per-shape attributes count over the scene's shapes (a missing shape gets them all wrong);
    ``end_region`` counts only where the caption states it. ``shapes`` is the overlap of named
    and real shapes over their union (a made-up shape counts against it), ``interactions`` the
    same for interactions, ``order`` every pair of acting shapes (before / same time / after).
    """
    out: dict[str, list[int]] = {a: [0, 0] for a in ATTRIBUTES}

    def add(attr: str, ok: bool) -> None:
        out[attr][0] += bool(ok)
        out[attr][1] += 1

    add("background", predicted["background"] == gold["background"])
    add("count", predicted["count"] == gold["count"])
    real, named = set(gold["shapes"]), set(predicted["shapes"])
    out["shapes"] = [len(real & named), len(real | named)]
    for k, facts in gold["shapes"].items():
        said = predicted["shapes"].get(k, {})
        for attr in ("size", "region", "motion"):
            add(attr, said.get(attr) == facts[attr])
        if facts["motion"] == "moving":
            add("direction", said.get("direction") == facts["direction"])
        if facts["motion"] == "changing":
            add("to_colour", said.get("to_colour") == facts["to_colour"])
        if said.get("end_region") is not None:
            add("end_region", said["end_region"] == facts["end_region"])
    real, named = gold["interactions"], predicted["interactions"]
    out["interactions"] = [len(real & named), len(real | named)]
    acting = sorted(gold["turns"])
    for i, a in enumerate(acting):
        for b in acting[i + 1:]:
            ta, tb = predicted["turns"].get(a), predicted["turns"].get(b)
            add("order", ta is not None and tb is not None
                and _sign(ta - tb) == _sign(gold["turns"][a] - gold["turns"][b]))
    return {a: (c, t) for a, (c, t) in out.items()}


def check_caption(caption: str, scene: DetailedScene) -> dict[str, tuple[int, int]]:
    """:func:`score_facts` of ``caption`` against ``scene``."""
    return score_facts(parse_facts(caption), scene_facts(scene))


def all_correct(scores: dict[str, tuple[int, int]]) -> bool:
    return all(c == t for c, t in scores.values())
