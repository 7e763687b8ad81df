"""Detailed scenes: 1-4 shapes that act in turn and pass behind or in front of each other.

A :class:`DetailedScene` is a :class:`~mmspec.world.scenes.Scene` whose shapes each act
during their own window of the clip (``first`` the red circle moves, ``then`` the blue
square turns green), drawn back to front in their order (a later shape hides an earlier
one where they overlap). What happens in a scene is derived from its geometry, never
declared: :func:`interactions` finds which moving shape passes behind or in front of
which other shape, and :func:`event_slots` groups the acting shapes by when they act.

The sampler keeps only scenes whose every overlap is caused by a moving shape and is
over by the end of the clip, so "passes behind" is always what the frames show. Every
shape has its own colour and kind pair, so "the red circle" names exactly one shape.
Bouncing is left out here: a bouncing path crosses other shapes at times no caption
could state simply.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from .render import shape_state
from .scenes import (
    BACKGROUNDS,
    COLOURS,
    DIRECTION_VECTORS,
    KINDS,
    SIZES,
    Scene,
    Shape,
    _motion_details,
    _pick,
    _start,
    as_rng,
)

MAX_SHAPES = 4
# No bouncing (see the module docstring); moving is the most common so interactions are common.
DETAILED_MOTIONS: dict[str, float] = {"still": 0.26, "moving": 0.38, "growing": 0.12, "shrinking": 0.10,
                                      "changing": 0.14}
OVERLAP = 0.8  # two shapes overlap when their centres are closer than OVERLAP x (sum of radii)
GRID = 160  # time samples per clip for the geometry checks
LONG_FRAMES = 64  # long-video mode: 64 frames x 36 pooled tokens = 2304 visual tokens (LLaVA-NeXT-Video toy)
MAX_TRIES = 200
VISIBLE_IN = (8, LONG_FRAMES)  # frame counts whose renders must each show every overlap at least once


@dataclass(frozen=True)
class DetailedScene(Scene):
    """Shapes drawn back to front, each acting during ``windows[i] = (start, end)`` of the clip."""

    windows: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        windows = tuple((float(a), float(b)) for a, b in self.windows) or ((0.0, 1.0),) * len(self.shapes)
        object.__setattr__(self, "windows", windows)
        if len(windows) != len(self.shapes):
            raise ValueError(f"{len(self.shapes)} shapes but {len(windows)} time windows")
        if not 1 <= len(self.shapes) <= MAX_SHAPES:
            raise ValueError(f"a detailed scene has 1..{MAX_SHAPES} shapes, got {len(self.shapes)}")
        for a, b in windows:
            if not 0.0 <= a < b <= 1.0:
                raise ValueError(f"a time window must satisfy 0 <= start < end <= 1, got ({a}, {b})")
        keys = [key(s) for s in self.shapes]
        if len(set(keys)) != len(keys):
            raise ValueError("every shape of a detailed scene needs its own colour and kind pair")
        if any(s.motion not in DETAILED_MOTIONS for s in self.shapes):
            raise ValueError(f"detailed scenes use the motions {sorted(DETAILED_MOTIONS)}")

    def local_time(self, index: int, t: float) -> float:
        a, b = self.windows[index]
        return min(max((t - a) / (b - a), 0.0), 1.0)

    def state(self, index: int, t: float) -> tuple[float, float, float, str]:
        """Centre, radius and colour of shape ``index`` at clip time ``t`` (square frames)."""
        return shape_state(self.shapes[index], self.local_time(index, t))

    def acting(self, index: int, t: float) -> bool:
        """Whether shape ``index`` is doing its motion at clip time ``t``."""
        a, b = self.windows[index]
        return self.shapes[index].motion != "still" and a <= t <= b


def key(shape: Shape) -> tuple[str, str]:
    """How captions name a shape: its (first) colour and its kind."""
    return shape.colour, shape.kind


@dataclass(frozen=True)
class Interaction:
    """``mover`` passes ``relation`` ("behind", "in front of") ``other``, or both move and meet."""

    mover: int
    other: int
    relation: str  # "behind" | "in front of" | "meets"
    time: float  # clip time of the first overlap


def _overlap(scene: DetailedScene, i: int, j: int, t: float) -> bool:
    xi, yi, ri, _ = scene.state(i, t)
    xj, yj, rj, _ = scene.state(j, t)
    return (xi - xj) ** 2 + (yi - yj) ** 2 < (OVERLAP * (ri + rj)) ** 2


def _first_overlap(scene: DetailedScene, i: int, j: int) -> float | None:
    for k in range(GRID + 1):
        if _overlap(scene, i, j, k / GRID):
            return k / GRID
    return None


def _classify(scene: DetailedScene, i: int, j: int, t: float) -> Interaction | None:
    """The interaction of shapes ``i < j`` first overlapping at ``t``; None if no moving shape causes it."""
    moving = [k for k in (i, j) if scene.shapes[k].motion == "moving" and scene.acting(k, t)]
    if len(moving) == 2:
        return Interaction(i, j, "meets", t)
    if len(moving) == 1:
        mover = moving[0]
        other = j if mover == i else i
        return Interaction(mover, other, "behind" if mover < other else "in front of", t)
    return None


def interactions(scene: DetailedScene) -> list[Interaction]:
    """Every pair of shapes that overlaps during the clip, in order of time."""
    found = []
    n = len(scene.shapes)
    for i in range(n):
        for j in range(i + 1, n):
            t = _first_overlap(scene, i, j)
            if t is not None:
                found.append(_classify(scene, i, j, t) or Interaction(i, j, "overlaps", t))
    return sorted(found, key=lambda x: (x.time, x.mover, x.other))


def _seen(scene: DetailedScene, i: int, j: int, frames: int) -> bool:
    return any(_overlap(scene, i, j, k / (frames - 1)) for k in range(frames))


def is_clear(scene: DetailedScene) -> bool:
    """Every overlap starts after t = 0, is caused by a moving shape, is over at t = 1 and shows
    in at least one frame of an 8-frame and of a long render; every moving shape stays inside
    the frame."""
    for it in interactions(scene):
        if it.relation == "overlaps" or it.time == 0.0 or _overlap(scene, it.mover, it.other, 1.0):
            return False
        if not all(_seen(scene, it.mover, it.other, frames) for frames in VISIBLE_IN):
            return False
    for i, s in enumerate(scene.shapes):
        x, y, r, _ = scene.state(i, 1.0)
        if s.motion == "moving" and not (r <= x <= 1 - r and r <= y <= 1 - r):
            return False
    return True


def event_slots(scene: DetailedScene) -> list[list[int]]:
    """The acting (non-still) shapes grouped by the start of their window, earliest first."""
    starts: dict[float, list[int]] = {}
    for i, s in enumerate(scene.shapes):
        if s.motion != "still":
            starts.setdefault(scene.windows[i][0], []).append(i)
    return [starts[a] for a in sorted(starts)]


def _sample_shape(rng: random.Random, taken: set[tuple[str, str]]) -> Shape:
    while True:
        kind, colour = _pick(rng, KINDS), _pick(rng, COLOURS)
        if (colour, kind) not in taken:
            break
    size, motion = _pick(rng, SIZES), _pick(rng, DETAILED_MOTIONS)
    direction, velocity, to_colour = _motion_details(rng, motion, colour)
    x, y = _start(rng, direction)
    return Shape(kind, colour, size, x, y, motion, direction, velocity, to_colour)


def _windows(rng: random.Random, shapes: list[Shape]) -> list[tuple[float, float]]:
    """All acting shapes over the whole clip, or split into 2-3 turns (some may share a turn)."""
    acting = [i for i, s in enumerate(shapes) if s.motion != "still"]
    windows = [(0.0, 1.0)] * len(shapes)
    if len(acting) < 2 or rng.random() < 0.3:
        return windows
    turns = rng.randint(2, min(3, len(acting)))
    order = acting[:]
    rng.shuffle(order)
    slot = {i: k for k, i in enumerate(order[:turns])}  # every turn gets at least one shape
    for i in order[turns:]:
        slot[i] = rng.randrange(turns)
    for i, k in slot.items():
        windows[i] = (round(k / turns, 4), round((k + 1) / turns, 4))
    return windows


def _cross_paths(rng: random.Random, shapes: list[Shape]) -> list[Shape]:
    """Put some resting shape half-way along a moving shape's path, so that it passes it."""
    shapes = shapes[:]
    resting = [i for i, s in enumerate(shapes) if s.motion != "moving"]
    for m, s in enumerate(shapes):
        if s.motion != "moving" or not resting or rng.random() < 0.45:
            continue
        o = resting.pop(rng.randrange(len(resting)))
        dx, dy = DIRECTION_VECTORS[s.direction]
        jitter = rng.uniform(-0.04, 0.04)
        x = s.x + s.velocity[0] * rng.uniform(0.45, 0.6) + (jitter if dy else 0.0)
        y = s.y + s.velocity[1] * rng.uniform(0.45, 0.6) + (jitter if dx else 0.0)
        shapes[o] = replace(shapes[o], x=round(x, 4), y=round(y, 4))
    return shapes


def sample_detailed_scene(rng: random.Random | int | None = None, max_shapes: int = MAX_SHAPES,
                          min_shapes: int = 1) -> DetailedScene:
    """Draw a detailed scene with ``min_shapes``..``max_shapes`` shapes; fixed for a seed.

    Draws are repeated (from the same generator) until the scene is clear (see
    :func:`is_clear`); about two draws in three are kept.
    """
    rng = as_rng(rng)
    if not 1 <= min_shapes <= max_shapes <= MAX_SHAPES:
        raise ValueError(f"need 1 <= min_shapes <= max_shapes <= {MAX_SHAPES}")
    background = _pick(rng, BACKGROUNDS)
    n = rng.randint(min_shapes, max_shapes)  # drawn once: rejection must not favour few shapes
    for _ in range(MAX_TRIES):
        shapes: list[Shape] = []
        for _ in range(n):
            shapes.append(_sample_shape(rng, {key(s) for s in shapes}))
        shapes = _cross_paths(rng, shapes)
        rng.shuffle(shapes)  # the drawing (depth) order
        scene = DetailedScene(tuple(shapes), background, tuple(_windows(rng, shapes)))
        if is_clear(scene):
            return scene
    raise RuntimeError(f"no clear scene in {MAX_TRIES} draws")  # never seen; a guard, not a path
