"""What every image bench report holds (rows against the `ar` reference, settings, notes, a grid of
the images); each bench module adds its own table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from mmspec.bench.harness import TableReport

REFERENCE = "ar"


@dataclass
class ImageReport(TableReport):
    title: str
    rows: list[dict[str, Any]]
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    grid: Image.Image | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "reference": REFERENCE, "settings": self.settings, "methods": self.rows,
                "notes": self.notes}
