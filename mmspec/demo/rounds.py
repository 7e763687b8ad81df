"""What each decoding round did, in words: the pieces of text each `RoundInfo` committed.

A pipeline's `callback_on_round(round_index, info)` says which token ids one target forward
committed and how many of them were accepted drafts; the last committed token is the target's
own (a correction when a draft was rejected, else a bonus). This module turns those ids into text
pieces labelled by origin, for `gr.HighlightedText`, and into one row per round for a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

DRAFT = "accepted draft"
CORRECTION = "target: correction"
OWN = "target: own token"
COLORS = {DRAFT: "#16a34a", CORRECTION: "#dc2626", OWN: "#2563eb"}

Decode = Callable[[list[int]], str]


@dataclass(frozen=True)
class RoundView:
    index: int
    chunk: int | None
    drafted: int
    accepted: int
    draft_text: str  # the accepted drafts, as text
    target_text: str  # the target's own token, as text ("" when the round stopped at end-of-text)

    @property
    def target_label(self) -> str:
        return CORRECTION if self.accepted < self.drafted else OWN


def round_views(rounds: Sequence, decode: Decode) -> list[RoundView]:
    """One `RoundView` per `RoundInfo`, text decoded incrementally (per chunk) so that word pieces join up."""
    views: list[RoundView] = []
    ids: list[int] = []
    shown = ""
    chunk: object = object()
    for index, info in enumerate(rounds):
        if info.chunk != chunk:
            chunk, ids, shown = info.chunk, [], ""
        pieces = []
        for part in (info.tokens[: info.accepted], info.tokens[info.accepted:]):
            ids = ids + list(part)
            text = decode(ids)
            pieces.append(text[len(shown):] if text.startswith(shown) else text)
            shown = text
        views.append(RoundView(index, info.chunk, info.drafted, info.accepted, pieces[0], pieces[1]))
    return views


def highlighted(views: Sequence[RoundView]) -> list[tuple[str, str | None]]:
    """(text, label) pairs for `gr.HighlightedText`: accepted drafts and the target's tokens in their colours."""
    segments: list[tuple[str, str | None]] = []
    chunk: object = object()
    for view in views:
        if view.chunk != chunk and segments:
            segments.append((" ", None))  # chunks of long audio are joined by a space, as the transcript is
        chunk = view.chunk
        if view.draft_text:
            segments.append((view.draft_text, DRAFT))
        if view.target_text:
            segments.append((view.target_text, view.target_label))
    if segments:
        segments[0] = (segments[0][0].lstrip(), segments[0][1])
    return [segment for segment in segments if segment[0]]


def table_rows(views: Sequence[RoundView]) -> list[list[object]]:
    """One row per round: round, drafted, kept, rejected, the kept drafts' text, the target's token."""
    return [[v.index, v.drafted, v.accepted, v.drafted - v.accepted, v.draft_text, v.target_text] for v in views]


TABLE_HEADERS = ["round", "drafted", "kept", "rejected", "kept draft text", "target's token"]
