"""Seeded generator of "shapes world" scenes.

A scene is a handful of coloured shapes on a plain background, each with one kind
of motion. Scenes are pure data: rendering lives in :mod:`mmspec.world.render` and
captions in :mod:`mmspec.world.captions`.

Coordinates are fractions of the frame: ``x`` grows to the right, ``y`` grows
downwards (image convention), both in ``[0, 1]``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Sampling weights are deliberately skewed: a text-only caption model then has a
# well-defined most-likely word at content positions, which makes greedy target and
# drafter agree more often than under uniform (tie-breaking) choices.
KINDS: dict[str, float] = {"circle": 0.35, "square": 0.30, "triangle": 0.20, "star": 0.15}
COLOURS: dict[str, float] = {
    "red": 0.26,
    "blue": 0.22,
    "green": 0.18,
    "yellow": 0.13,
    "purple": 0.11,
    "orange": 0.10,
}
RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "blue": (40, 80, 220),
    "green": (40, 170, 60),
    "yellow": (235, 210, 40),
    "purple": (140, 50, 180),
    "orange": (245, 140, 30),
    # backgrounds
    "white": (245, 245, 245),
    "black": (15, 15, 15),
    "grey": (128, 128, 128),
}
SIZES: dict[str, float] = {"small": 0.25, "medium": 0.45, "large": 0.30}
# Radius of a shape as a fraction of min(height, width).
SIZE_RADIUS: dict[str, float] = {"small": 0.07, "medium": 0.11, "large": 0.16}
MOTIONS: dict[str, float] = {
    "still": 0.22,
    "moving": 0.30,
    "bouncing": 0.14,
    "growing": 0.12,
    "shrinking": 0.10,
    "changing": 0.12,
}
DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down")
DIRECTION_VECTORS: dict[str, tuple[float, float]] = {
    "left": (-1.0, 0.0),
    "right": (1.0, 0.0),
    "up": (0.0, -1.0),
    "down": (0.0, 1.0),
}
BACKGROUNDS: dict[str, float] = {"white": 0.6, "black": 0.25, "grey": 0.15}
# Distance a "moving" shape travels over the whole clip (fraction of the frame).
TRAVEL: float = 0.45


@dataclass(frozen=True)
class Shape:
    """One shape and its motion over the clip (time ``t`` in ``[0, 1]``)."""

    kind: str
    colour: str
    size: str
    x: float
    y: float
    motion: str = "still"
    direction: str | None = None  # for motion == "moving"
    velocity: tuple[float, float] = (0.0, 0.0)  # frame-widths per clip; moving/bouncing
    to_colour: str | None = None  # for motion == "changing"

    def __post_init__(self) -> None:
        for what, value, known in (("shape kind", self.kind, KINDS), ("colour", self.colour, COLOURS),
                                   ("size", self.size, SIZES), ("motion", self.motion, MOTIONS)):
            if value not in known:
                raise ValueError(f"unknown {what} {value!r}; expected one of {sorted(known)}")
        if self.motion == "moving" and self.direction not in DIRECTIONS:
            raise ValueError("a moving shape needs a direction (left/right/up/down)")
        if self.motion == "changing" and (self.to_colour not in COLOURS or self.to_colour == self.colour):
            raise ValueError("a colour-changing shape needs a different to_colour")


@dataclass(frozen=True)
class Scene:
    """A background colour and one to a few shapes."""

    shapes: tuple[Shape, ...]
    background: str = "white"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shapes", tuple(self.shapes))  # accept lists too
        if not self.shapes:
            raise ValueError("a scene needs at least one shape")
        if self.background not in BACKGROUNDS:
            raise ValueError(f"unknown background {self.background!r}")

    def local_time(self, index: int, t: float) -> float:
        """Where shape ``index`` is in its own motion at clip time ``t`` (here: every shape
        moves over the whole clip; detailed scenes give each shape its own time window)."""
        return t


def as_rng(rng: random.Random | int | None) -> random.Random:
    """Accept a ``random.Random`` or a seed; never touch the global random state."""
    if isinstance(rng, random.Random):
        return rng
    return random.Random(rng)


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    keys = list(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys], k=1)[0]


def _start(rng: random.Random, direction: str | None) -> tuple[float, float]:
    """A start point; a moving shape starts far enough from the wall it heads to
    that its whole path stays inside the frame."""
    x, y = rng.uniform(0.15, 0.85), rng.uniform(0.15, 0.85)
    if direction is not None:
        dx, dy = DIRECTION_VECTORS[direction]
        lo, hi = 0.12, 0.88 - TRAVEL
        if dx:
            x = rng.uniform(lo, hi) if dx > 0 else 1.0 - rng.uniform(lo, hi)
        else:
            y = rng.uniform(lo, hi) if dy > 0 else 1.0 - rng.uniform(lo, hi)
    return round(x, 4), round(y, 4)


def _motion_details(rng: random.Random, motion: str, colour: str) -> tuple[str | None, tuple[float, float], str | None]:
    """What a shape's `motion` draws: its direction, velocity and end colour (None, (0, 0), None where unused)."""
    direction, velocity, to_colour = None, (0.0, 0.0), None
    if motion == "moving":
        direction = rng.choice(DIRECTIONS)
        dx, dy = DIRECTION_VECTORS[direction]
        velocity = (dx * TRAVEL, dy * TRAVEL)
    elif motion == "bouncing":
        speed = rng.uniform(1.0, 1.8)  # fast enough to hit at least one wall
        velocity = (speed * rng.choice((-1, 1)), speed * rng.uniform(0.4, 0.9) * rng.choice((-1, 1)))
    elif motion == "changing":
        others = {c: w for c, w in COLOURS.items() if c != colour}
        to_colour = _pick(rng, others)
    return direction, velocity, to_colour


def _sample_shape(rng: random.Random) -> Shape:
    kind = _pick(rng, KINDS)
    colour = _pick(rng, COLOURS)
    size = _pick(rng, SIZES)
    motion = _pick(rng, MOTIONS)
    direction, velocity, to_colour = _motion_details(rng, motion, colour)
    x, y = _start(rng, direction)
    return Shape(kind, colour, size, x, y, motion, direction,
                 (round(velocity[0], 4), round(velocity[1], 4)), to_colour)


def sample_scene(rng: random.Random | int | None = None, max_shapes: int = 3) -> Scene:
    """Draw a scene with 1..``max_shapes`` shapes.

    With some probability a shape is a copy (same kind, colour, size and motion, a
    different place) of the previous one, so captions can say "two red circles".
    """
    rng = as_rng(rng)
    if max_shapes < 1:
        raise ValueError("max_shapes must be >= 1")
    background = _pick(rng, BACKGROUNDS)
    n = rng.randint(1, max_shapes)
    shapes: list[Shape] = []
    for _ in range(n):
        if shapes and rng.random() < 0.25:
            prev = shapes[-1]
            x, y = _start(rng, prev.direction)  # same look and motion, another place
            shapes.append(Shape(prev.kind, prev.colour, prev.size, x, y, prev.motion,
                                prev.direction, prev.velocity, prev.to_colour))
        else:
            shapes.append(_sample_shape(rng))
    return Scene(tuple(shapes), background)


def region(x: float, y: float) -> str:
    """Name the 3x3 grid cell of a point: 'top left', 'top', ..., 'centre', ... ."""
    col = "left" if x < 1 / 3 else ("right" if x > 2 / 3 else "")
    row = "top" if y < 1 / 3 else ("bottom" if y > 2 / 3 else "")
    return " ".join(p for p in (row, col) if p) or "centre"
