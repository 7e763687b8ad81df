"""Stats and timings as the page shows them (Markdown and chart data), the same for every tab."""

from __future__ import annotations

from typing import Any

import pandas as pd


def stats_markdown(stats: Any, method: str) -> str:
    """tau, alpha, forwards, tokens and time of one call (a `SpecStats`)."""
    alpha = f"{stats.alpha:.2f}" if stats.drafted else "- (nothing drafted)"
    return (f"**{method}**: {stats.new_tokens} new tokens in {stats.target_forwards} target forwards "
            f"(tau **{stats.tau:.2f}** tokens per forward), alpha {alpha} "
            f"({stats.accepted} of {stats.drafted} drafts accepted), {stats.drafter_forwards} drafter forwards, "
            f"{stats.total_time * 1e3:.0f} ms ({stats.tokens_per_second:.1f} tokens/s)")


def acceptance_frame(stats: Any) -> pd.DataFrame:
    """Per draft position: the share of rounds reaching it that accepted it (for `gr.BarPlot`)."""
    shares = stats.per_position_acceptance
    width = len(str(len(shares)))  # zero-padded ("01".."12"): a chart sorting its labels as text keeps them in order
    return pd.DataFrame({"draft position": [str(i + 1).zfill(width) for i in range(len(shares))], "acceptance": shares})


def comparison_markdown(fast: Any, plain: Any, sampled: bool = False) -> str:
    """The method against plain decoding on the same input: both decoding times, the speed-up, same text or not.
    Pass calls made after a warm-up (the demo times a second run of the method, after plain decoding's)."""
    speed_up = plain.stats.total_time / fast.stats.total_time if fast.stats.total_time > 0 else 0.0
    why = ("sampling: lossless speculative sampling keeps the distribution, not each draw" if sampled
           else "a relaxed method may differ")
    same = "yes" if fast.text == plain.text else f"**no** ({why})"
    return (f"plain decoding (`ar`): {plain.stats.total_time * 1e3:.0f} ms, {plain.stats.target_forwards} target forwards; "
            f"`{fast.method}`: {fast.stats.total_time * 1e3:.0f} ms, {fast.stats.target_forwards} target forwards; "
            f"speed-up **{speed_up:.2f}x** (one run each, after a warm-up); same text: {same}\n\n"
            f"plain decoding's text: {plain.text}")
