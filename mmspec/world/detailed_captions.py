"""Caption grammar for detailed scenes: every shape, the background and the order of events.

A caption has four parts whose order varies: an overview (how many shapes, often the
background), one introduction per shape (size, colour, kind, where it starts), the events
turn by turn ("first ..., then ..., at the same time ...", with each moving shape's
direction, where it ends up and whom it passes behind or in front of), and what stays
still. Words come from weighted synonyms and several sentence frames; a shape keeps the
colour and kind words of its introduction, so "the red ball" names one shape throughout.

Every choice is drawn up front from the caller's ``random.Random`` (or seed), so a caption
is fixed for a seed. :mod:`mmspec.world.detailed_facts` parses captions back into facts.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from .captions import (
    BACKGROUND_PHRASES,
    DIRECTION_WORDS,
    INTROS,
    KIND_WORDS,
    LEADS,
    REGION_PHRASES,
    SIZE_WORDS,
    VERBS,
    _choose,
)
from .detailed_scenes import DetailedScene, event_slots, interactions
from .scenes import BACKGROUNDS, COLOURS, as_rng, region

Options = list[tuple[str, float]]

COUNT_PHRASES = {1: [("one shape", 0.6), ("a single shape", 0.4)], 2: [("two shapes", 1.0)],
                 3: [("three shapes", 1.0)], 4: [("four shapes", 1.0)]}
OVERVIEWS: Options = [("the video shows {n}", 0.35), ("this clip shows {n}", 0.25), ("we see {n}", 0.2),
                      ("in this video there {be} {n}", 0.2)]
BACKGROUND_WITH_OVERVIEW: Options = [(" on a {c} background", 1.0)]
BACKGROUND_ALONE: Options = [("the background is {c}", 0.6), ("it is all on a {c} background", 0.4)]
PLACE_VERBS: Options = [("is", 0.55), ("starts", 0.25), ("begins", 0.2)]
# (verb phrase, weight); "{d}" = direction, "{a}"/"{b}" = colour before / after a change.
EVENT_VERBS: dict[str, Options] = {
    "moving": [("moves {d}", 0.5), ("slides {d}", 0.3), ("travels {d}", 0.2)],
    "growing": [("grows", 0.5), ("gets bigger", 0.5)],
    "shrinking": [("shrinks", 0.5), ("gets smaller", 0.5)],
    "changing": [("turns {b}", 0.5), ("changes colour to {b}", 0.3), ("changes from {a} to {b}", 0.2)],
}
STILL_PHRASES: Options = [("stays still the whole time", 0.4), ("does not move at all", 0.3),
                          ("sits still throughout the clip", 0.3)]
END_PHRASES: Options = [("and ends up {r}", 0.6), ("and stops {r}", 0.4)]
RELATION_PHRASES: dict[str, Options] = {
    "behind": [("passes behind", 0.6), ("goes behind", 0.4)],
    "in front of": [("passes in front of", 0.6), ("goes in front of", 0.4)],
    "meets": [("meets", 0.6), ("runs into", 0.4)],
}
FIRST_TURN: Options = [("first,", 0.5), ("at the start,", 0.3), ("to begin with,", 0.2)]
NEXT_TURN: Options = [("then", 0.5), ("after that,", 0.3), ("next,", 0.2)]
LAST_TURN: Options = [("finally,", 0.5), ("at the end,", 0.3), ("then", 0.2)]
ONE_TURN: Options = [("throughout the clip,", 0.4), ("during the video,", 0.3), ("", 0.3)]
SAME_TURN: Options = [(", and at the same time", 0.5), (" while", 0.5)]
# Optional true remarks, switched on to lengthen short captions.
ONLY_NOTES: Options = [("it is the only shape in the video", 0.5), ("there are no other shapes", 0.5)]
KEEP_NOTES: dict[str, Options] = {
    "still": [("it keeps its colour and size", 0.5), ("its colour and size stay the same", 0.5)],
    "moving": [("it keeps its colour and size", 0.5), ("its colour and size stay the same", 0.5)],
    "growing": [("it keeps its colour", 0.5), ("its colour stays the same", 0.5)],
    "shrinking": [("it keeps its colour", 0.5), ("its colour stays the same", 0.5)],
    "changing": [("it keeps its size", 0.5), ("its size stays the same", 0.5)],
}
STAY_NOTES: Options = [("it stays in the same place", 0.5), ("it does not move from its place", 0.5)]
BACKGROUND_NOTES: Options = [("the background does not change", 0.5), ("the background stays {c} throughout", 0.5)]

# Length is fitted to the shipped caption tokenizer without loading it: words of the one-shape
# grammar are single tokens there; other words cost about NEW_WORD_TOKENS tokens each.
MIN_TOKENS, MAX_TOKENS = 60, 150
FIT_LOW, FIT_HIGH = 72, 138  # the estimate's target range, inside the real one with a margin
NEW_WORD_TOKENS = 4


def _words_of(tables) -> set[str]:
    out: set[str] = set()
    for table in tables:
        for options in (table.values() if isinstance(table, dict) else [table]):
            for option, _ in options:
                for text in (option if isinstance(option, tuple) else (option,)):
                    out.update(re.findall(r"[a-z]+", text))
    return out


# The one-shape grammar's words (the shipped caption tokenizer was trained on them).
ONE_SHAPE_WORDS = _words_of([SIZE_WORDS, KIND_WORDS, REGION_PHRASES, VERBS, DIRECTION_WORDS, INTROS, LEADS,
                             BACKGROUND_PHRASES]) | set(COLOURS) | set(BACKGROUNDS) | {"a", "an", "and", "two",
                                                                                      "three", "is", "are", "there", "that", "while"}


def estimate_tokens(text: str) -> int:
    """About how many tokens the shipped caption tokenizer makes of ``text`` (see NEW_WORD_TOKENS)."""
    pieces = re.findall(r"[a-z]+|[^a-z\s]", text)
    return sum(1 if p in ONE_SHAPE_WORDS or not p.isalpha() else NEW_WORD_TOKENS for p in pieces)


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


@dataclass
class _ShapePlan:
    """Every word choice for one shape."""

    size_word: str
    kind_word: str
    place_verb: str
    region_phrase: str
    end_pick: float  # which phrase of the end region
    verb: str
    end_phrase: str
    still_phrase: str
    keep_note: str
    stay_note: str  # for growing, shrinking and colour-changing shapes, which act in place
    show_end: bool
    show_keep: bool
    show_stay: bool

    def name(self, colour: str) -> str:
        return f"the {colour} {self.kind_word}"


@dataclass
class _Plan:
    scene: DetailedScene
    shapes: list[_ShapePlan]
    intro_order: list[int]
    overview: str
    background_in_overview: bool
    background_phrase: str
    intro_joined: bool  # one "there is a ..., a ... and a ..." sentence instead of one per shape
    still_first: bool  # the still shapes before the events
    turn_words: list[str]
    same_turn_words: list[str]
    relations: dict[int, list[tuple[str, int]]]  # mover -> [(relation phrase, other)]
    only_note: str
    background_note: str
    show_only: bool
    show_background_note: bool

    def _intro(self, i: int, bare: bool) -> str:
        s, p = self.scene.shapes[i], self.shapes[i]
        np_ = f"{p.size_word} {s.colour} {p.kind_word}"
        np_ = f"{_article(np_)} {np_}"
        text = f"{np_} {p.region_phrase}" if bare else f"{np_} {p.place_verb} {p.region_phrase}"
        return text

    def _event(self, i: int) -> str:
        s, p = self.scene.shapes[i], self.shapes[i]
        text = f"{p.name(s.colour)} {p.verb}"
        for phrase, other in self.relations.get(i, []):
            o = self.scene.shapes[other]
            text += f" and {phrase} {self.shapes[other].name(o.colour)}"
        if s.motion == "moving" and p.show_end:
            x, y, _, _ = self.scene.state(i, 1.0)
            options = REGION_PHRASES[region(x, y)]
            text += " " + p.end_phrase.format(r=options[int(p.end_pick * len(options))][0])
        return text

    def _shape_sentences(self, i: int) -> list[str]:
        """The still shape's sentence and the shape's optional keep-note."""
        s, p = self.scene.shapes[i], self.shapes[i]
        out = [f"{p.name(s.colour)} {p.still_phrase}"] if s.motion == "still" else []
        return out + ([p.keep_note] if p.show_keep and s.motion == "still" else [])

    def text(self) -> str:
        scene = self.scene
        overview = self.overview + (self.background_phrase if self.background_in_overview else "")
        sentences = [overview] + ([self.only_note] if self.show_only and len(scene.shapes) == 1 else [])
        if self.intro_joined and len(self.intro_order) > 1:
            parts = [self._intro(i, bare=True) for i in self.intro_order]
            sentences.append(f"there is {', '.join(parts[:-1])} and {parts[-1]}")
        else:
            sentences += [self._intro(i, bare=False) for i in self.intro_order]
        still = [t for i in range(len(scene.shapes)) for t in self._shape_sentences(i)]
        events = []
        for k, turn in enumerate(event_slots(scene)):
            clause = self._event(turn[0])
            for i in turn[1:]:
                clause += f"{self.same_turn_words[i]} {self._event(i)}"
            lead = self.turn_words[k]
            events.append(f"{lead} {clause}" if lead else clause)
            # a keep-note right after the turn names it ("it" = the last shape of the turn)
            last, acted = self.shapes[turn[-1]], scene.shapes[turn[-1]]
            if last.show_keep:
                events.append(last.keep_note)
            if last.show_stay and acted.motion in ("growing", "shrinking", "changing"):
                events.append(last.stay_note)
        sentences += (still + events) if self.still_first else (events + still)
        if not self.background_in_overview:
            sentences.append(self.background_phrase)
        if self.show_background_note:
            sentences.append(self.background_note)
        return ". ".join(sentences) + "."


def _turn_words(rng: random.Random, turns: int) -> list[str]:
    if turns == 1:
        return [_choose(rng, ONE_TURN)]
    words = [_choose(rng, FIRST_TURN)] + [_choose(rng, NEXT_TURN) for _ in range(turns - 2)]
    return words + [_choose(rng, LAST_TURN)]


def _relations(rng: random.Random, scene: DetailedScene) -> dict[int, list[tuple[str, int]]]:
    out: dict[int, list[tuple[str, int]]] = {}
    for it in interactions(scene):
        out.setdefault(it.mover, []).append((_choose(rng, RELATION_PHRASES[it.relation]), it.other))
    return out


def _plan(scene: DetailedScene, rng: random.Random) -> _Plan:
    shapes = []
    for s in scene.shapes:
        verb = _choose(rng, EVENT_VERBS[s.motion]) if s.motion != "still" else ""
        direction = _choose(rng, DIRECTION_WORDS[s.direction]) if s.direction else ""
        shapes.append(_ShapePlan(
            size_word=_choose(rng, SIZE_WORDS[s.size]), kind_word=_choose(rng, KIND_WORDS[s.kind])[0],
            place_verb=_choose(rng, PLACE_VERBS), region_phrase=_choose(rng, REGION_PHRASES[region(s.x, s.y)]),
            end_pick=rng.random(), verb=verb.format(d=direction, a=s.colour, b=s.to_colour or ""),
            end_phrase=_choose(rng, END_PHRASES), still_phrase=_choose(rng, STILL_PHRASES),
            keep_note=_choose(rng, KEEP_NOTES[s.motion]), stay_note=_choose(rng, STAY_NOTES),
            show_end=rng.random() < 0.6, show_keep=rng.random() < 0.15, show_stay=rng.random() < 0.1))
    n = len(scene.shapes)
    order = list(range(n))
    rng.shuffle(order)
    overview = _choose(rng, OVERVIEWS).format(n=_choose(rng, COUNT_PHRASES[n]), be="is" if n == 1 else "are")
    in_overview = rng.random() < 0.6
    bg = _choose(rng, BACKGROUND_WITH_OVERVIEW if in_overview else BACKGROUND_ALONE).format(c=scene.background)
    return _Plan(scene, shapes, order, overview, in_overview, bg, intro_joined=rng.random() < 0.4,
                 still_first=rng.random() < 0.5, turn_words=_turn_words(rng, len(event_slots(scene))),
                 same_turn_words=[_choose(rng, SAME_TURN) for _ in range(n)], relations=_relations(rng, scene),
                 only_note=_choose(rng, ONLY_NOTES),
                 background_note=_choose(rng, BACKGROUND_NOTES).format(c=scene.background),
                 show_only=rng.random() < 0.3, show_background_note=rng.random() < 0.15)


def _fit_length(plan: _Plan) -> None:
    """Switch optional remarks on (too short) or off (too long), in a fixed order."""
    cost = lambda: estimate_tokens(plan.text())  # noqa: E731
    moving = [p for p, s in zip(plan.shapes, plan.scene.shapes) if s.motion == "moving"]
    grow = [(p, "show_end") for p in moving] + [(plan, "show_only")] + [(p, "show_keep") for p in plan.shapes]
    for obj, attr in grow + [(p, "show_stay") for p in plan.shapes] + [(plan, "show_background_note")]:
        if cost() >= FIT_LOW:
            break
        setattr(obj, attr, True)
    if cost() < FIT_LOW and plan.turn_words == [""]:
        plan.turn_words = [ONE_TURN[0][0]]
    shrink = [(plan, "show_background_note"), (plan, "show_only")] + [
        (p, a) for p in plan.shapes for a in ("show_keep", "show_stay")]
    for obj, attr in shrink + [(p, "show_end") for p in plan.shapes]:
        if cost() <= FIT_HIGH:
            break
        setattr(obj, attr, False)
    if cost() > FIT_HIGH:
        plan.intro_joined = True
    if cost() > FIT_HIGH:
        plan.turn_words = [w if w in ("then", "first,") else ("then" if k else "first,")
                           for k, w in enumerate(plan.turn_words)] if len(plan.turn_words) > 1 else [""]
    if cost() > FIT_HIGH:
        plan.same_turn_words = [" while"] * len(plan.same_turn_words)


def detailed_caption(scene: DetailedScene, rng: random.Random | int | None = None) -> str:
    """One lowercase caption of ``scene`` (several sentences, ending with a period); fixed for a seed.

    About 60-150 tokens of the shipped caption tokenizer (see :func:`estimate_tokens`)."""
    plan = _plan(scene, as_rng(rng))
    _fit_length(plan)
    return plan.text()
