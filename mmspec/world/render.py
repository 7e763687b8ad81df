"""Render shapes-world scenes to images, videos and video files.

Time ``t`` runs over ``[0, 1]`` across a clip: moving shapes translate, bouncing
shapes reflect off the walls, growing/shrinking shapes change radius and
colour-changing shapes switch colour half-way.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

from ..media import write_video  # noqa: F401 (re-exported: the world writes its videos with it)
from .scenes import RGB, SIZE_RADIUS, Scene, Shape

GROW_TO = 1.8  # radius multiplier reached at t = 1 by a growing shape
SHRINK_TO = 0.4  # ... and by a shrinking shape


def _hw(size: int | tuple[int, int]) -> tuple[int, int]:
    """Normalise ``size`` (an int for a square, or ``(height, width)``)."""
    h, w = (size, size) if isinstance(size, int) else size
    if int(h) < 1 or int(w) < 1:
        raise ValueError(f"image size must be positive, got {size!r}")
    return int(h), int(w)


def _reflect(p: float, lo: float, hi: float) -> float:
    """Fold an unconstrained coordinate into ``[lo, hi]`` (a bounce off both walls)."""
    if hi <= lo:
        return (lo + hi) / 2
    span = hi - lo
    q = (p - lo) % (2 * span)
    return lo + (q if q <= span else 2 * span - q)


def shape_state(shape: Shape, t: float, aspect: float = 1.0) -> tuple[float, float, float, str]:
    """Centre ``(x, y)`` in frame fractions, radius (fraction of min side) and colour at ``t``.

    ``aspect`` is width / height; bouncing needs it to place the walls exactly.
    """
    t = min(max(float(t), 0.0), 1.0)
    r = SIZE_RADIUS[shape.size]
    if shape.motion == "growing":
        r *= 1.0 + (GROW_TO - 1.0) * t
    elif shape.motion == "shrinking":
        r *= 1.0 + (SHRINK_TO - 1.0) * t
    x, y = shape.x, shape.y
    if shape.motion in ("moving", "bouncing"):
        x, y = x + shape.velocity[0] * t, y + shape.velocity[1] * t
    if shape.motion == "bouncing":
        # The radius is a fraction of the short side; convert it to each axis.
        rx, ry = r / max(aspect, 1.0), r * min(aspect, 1.0)
        x, y = _reflect(x, rx, 1.0 - rx), _reflect(y, ry, 1.0 - ry)
    colour = shape.to_colour if shape.motion == "changing" and t >= 0.5 else shape.colour
    return x, y, r, colour


def _polygon(kind: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    if kind == "square":
        s = r * 0.9  # a square of "radius" r looks bigger than a circle; shrink a little
        return [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    if kind == "triangle":
        return [(cx + r * math.cos(a), cy + r * math.sin(a))
                for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
    if kind == "star":
        pts = []
        for i in range(10):
            rr = r if i % 2 == 0 else r * 0.45
            a = -math.pi / 2 + i * math.pi / 5
            pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
        return pts
    raise ValueError(f"no polygon for kind {kind!r}")


def render_image(scene: Scene, size: int | tuple[int, int] = 64, t: float = 0.0) -> Image.Image:
    """Draw ``scene`` at time ``t`` as an RGB image of ``size`` (int or ``(H, W)``)."""
    h, w = _hw(size)
    img = Image.new("RGB", (w, h), RGB[scene.background])
    draw = ImageDraw.Draw(img)
    short = min(h, w)
    for index, shape in enumerate(scene.shapes):  # later shapes are drawn in front
        x, y, r, colour = shape_state(shape, scene.local_time(index, t), aspect=w / h)
        cx, cy, rp = x * w, y * h, max(r * short, 0.5)
        fill = RGB[colour]
        if shape.kind == "circle":
            draw.ellipse([cx - rp, cy - rp, cx + rp, cy + rp], fill=fill)
        else:
            draw.polygon(_polygon(shape.kind, cx, cy, rp), fill=fill)
    return img


def render_video(scene: Scene, num_frames: int = 16, size: int | tuple[int, int] = 64) -> np.ndarray:
    """Render ``num_frames`` evenly spaced in ``t`` over ``[0, 1]``: uint8 ``[T, H, W, 3]``."""
    if num_frames < 1:
        raise ValueError("num_frames must be >= 1")
    ts = [i / (num_frames - 1) if num_frames > 1 else 0.0 for i in range(num_frames)]
    return np.stack([np.asarray(render_image(scene, size, t)) for t in ts])
