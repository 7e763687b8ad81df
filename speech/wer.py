"""Word error rate, one normalisation for every number mmspec reports (benches, zoo cards, recipes)."""

from __future__ import annotations

import unicodedata

from ..optional import require

NORMALISATION = "lowercase, punctuation (Unicode category P) removed, whitespace collapsed"


def normalise(text: str) -> str:
    """Lowercase, drop punctuation (Unicode category P), collapse whitespace."""
    kept = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text.lower())
    return " ".join(kept.split())


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words) after `normalise`."""
    jiwer = require("jiwer", "speech", "the word error rate")

    ref, hyp = normalise(reference), normalise(hypothesis)
    if not ref:
        return len(hyp.split()), 0  # jiwer refuses an empty reference: every output word is an insertion
    out = jiwer.process_words(ref, hyp if hyp else "")
    return out.substitutions + out.deletions + out.insertions, len(ref.split())


def corpus_wer(references: list[str], hypotheses: list[str]) -> float:
    """Word error rate over the whole set (errors summed, divided by the reference words summed)."""
    errors = words = 0
    for ref, hyp in zip(references, hypotheses):
        e, n = word_errors(ref, hyp)
        errors += e
        words += n
    return errors / words if words else float(errors > 0)
