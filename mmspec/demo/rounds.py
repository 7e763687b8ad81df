"""What each decoding round did, in words: the pieces of text each `RoundInfo` committed.

A pipeline's `callback_on_round(round_index, info)` says which token ids one target forward
committed, how many of them were accepted drafts and what the drafter proposed (`info.proposed`);
the last committed token is the target's own (a correction when a draft was rejected, else a
bonus). This module turns those ids into text pieces labelled by origin (kept drafts, rejected
drafts, the target's tokens), for `gr.HighlightedText`, and into one row per round for a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

DRAFT = "accepted draft"
REJECTED = "rejected draft"
CORRECTION = "target: correction"
OWN = "target: own token"
COLORS = {DRAFT: "#16a34a", REJECTED: "#9ca3af", CORRECTION: "#dc2626", OWN: "#2563eb"}

Decode = Callable[[list[int]], str]


@dataclass(frozen=True)
class RoundView:
    index: int
    chunk: int | None
    drafted: int
    accepted: int
    draft_text: str  # the accepted drafts, as text
    target_text: str  # the target's own token, as text ("" when the round stopped at end-of-text)
    rejected_text: str = ""  # the drafts the target rejected, as text (they read on from the kept ones)

    @property
    def target_label(self) -> str:
        return CORRECTION if self.accepted < self.drafted else OWN

    @property
    def proposed_text(self) -> str:
        """The round's whole draft, as the drafter proposed it: the kept part, then the rejected part."""
        return self.draft_text + self.rejected_text


def round_views(rounds: Sequence, decode: Decode) -> list[RoundView]:
    """One `RoundView` per `RoundInfo`, text decoded incrementally (per chunk) so that word pieces join up;
    the rejected drafts are decoded after the kept ones, as the drafter wrote them."""
    views: list[RoundView] = []
    ids: list[int] = []
    shown = ""
    chunk: object = object()
    for index, info in enumerate(rounds):
        if info.chunk != chunk:
            chunk, ids, shown = info.chunk, [], ""
        ids, shown, kept = _extend(ids, shown, info.tokens[: info.accepted], decode)
        rejected = _extend(ids, shown, info.proposed[info.accepted:], decode)[2]
        ids, shown, own = _extend(ids, shown, info.tokens[info.accepted:], decode)
        views.append(RoundView(index, info.chunk, info.drafted, info.accepted, kept, own, rejected))
    return views


def _extend(ids: list[int], shown: str, more: Sequence[int], decode: Decode) -> tuple[list[int], str, str]:
    """`ids` + `more`, its text, and the text `more` adds to `shown` (the text of `ids`)."""
    if not more:
        return ids, shown, ""
    ids = ids + list(more)
    text = decode(ids)
    return ids, text, text[len(shown):] if text.startswith(shown) else text


def highlighted(views: Sequence[RoundView]) -> list[tuple[str, str | None]]:
    """(text, label) pairs for `gr.HighlightedText`: accepted drafts, rejected drafts (right before the
    target's correction that replaced them) and the target's tokens, in their colours."""
    segments: list[tuple[str, str | None]] = []
    chunk: object = object()
    for view in views:
        if view.chunk != chunk and segments:
            segments.append((" ", None))  # chunks of long audio are joined by a space, as the transcript is
        chunk = view.chunk
        if view.draft_text:
            segments.append((view.draft_text, DRAFT))
        if view.rejected_text:
            segments.append((view.rejected_text, REJECTED))
        if view.target_text:
            segments.append((view.target_text, view.target_label))
    if segments:
        segments[0] = (segments[0][0].lstrip(), segments[0][1])
    return [segment for segment in segments if segment[0]]


def table_rows(views: Sequence[RoundView]) -> list[list[object]]:
    """One row per round: round, drafted, kept, rejected, the draft's text, its kept part, its rejected part, the
    target's token (the correction where a draft was rejected)."""
    return [[v.index, v.drafted, v.accepted, v.drafted - v.accepted, v.proposed_text, v.draft_text, v.rejected_text,
             v.target_text] for v in views]


TABLE_HEADERS = ["round", "drafted", "kept", "rejected", "draft text", "kept draft text", "rejected draft text",
                 "target's token"]
REJECTED_COLUMN = TABLE_HEADERS.index("rejected draft text")
