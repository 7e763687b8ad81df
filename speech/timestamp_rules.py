"""Whisper's timestamp rules for a whole batch in tensor operations.

transformers' `WhisperTimeStampLogitsProcessor` reads each row's prefix as a Python list (`input_ids.tolist()`, a
scan of every earlier token) at every decoder step; in a batch of long windows that loop grows with rows and
positions. `BatchedTimestampRules` takes the same settings (it is that processor, constructed the same way) and
gives the same scores: every rule only sets scores to -inf, so applying the per-row masks together in any order
leaves the same tensor, and the final "timestamps more likely than any text" test reads it exactly as the original
does (the same `log_softmax` / `logsumexp` / `max` calls on the same values).
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor


class BatchedTimestampRules(WhisperTimeStampLogitsProcessor):
    """`WhisperTimeStampLogitsProcessor` with its per-row rules computed for all rows at once (same scores)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        inf = -float("inf")
        begin = self.timestamp_begin
        processed = scores.clone()
        processed[:, self.no_timestamps_token_id] = inf
        tail = input_ids[:, self.begin_index:]
        rows, generated = tail.shape
        stamp = tail >= begin
        no = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
        last = stamp[:, -1] if generated >= 1 else no
        penultimate = stamp[:, -2] if generated >= 2 else ~no  # fewer than two tokens counts as a timestamp
        # After a timestamp pair (or a lone first one) only text; after text then a timestamp, no text (its pair).
        processed[:, begin:].masked_fill_((last & penultimate).unsqueeze(-1), inf)
        processed[:, : self.eos_token_id].masked_fill_((last & ~penultimate).unsqueeze(-1), inf)
        # Timestamps never go back: below the last one (closing a pair may repeat it, anything else must pass it).
        floor = torch.full((rows,), begin, dtype=torch.long, device=input_ids.device)
        if generated:
            positions = torch.arange(1, generated + 1, device=input_ids.device)
            latest = (stamp * positions).argmax(dim=-1, keepdim=True)  # the last timestamp's place (0 when none)
            value = tail.gather(1, latest).squeeze(-1)
            repeat_allowed = last & ~penultimate
            floor = torch.where(stamp.any(dim=-1), value + (~repeat_allowed).long(), floor)
        stamps = torch.arange(begin, max(begin, processed.shape[-1]), device=processed.device)  # only timestamps can fall
        processed[:, begin:].masked_fill_(stamps < floor.to(processed.device).unsqueeze(-1), inf)
        if input_ids.shape[1] == self.begin_index:
            processed[:, :begin] = inf
            if self.max_initial_timestamp_index is not None:
                processed[:, begin + self.max_initial_timestamp_index + 1:] = inf
        if self._detect_timestamp_from_logprob:
            logprobs = torch.nn.functional.log_softmax(processed.float(), dim=-1)
            timestamp_logprob = logprobs[:, begin:].logsumexp(dim=-1)
            max_text_token_logprob = logprobs[:, :begin].max(dim=-1).values
            processed[:, :begin].masked_fill_((timestamp_logprob > max_text_token_logprob).unsqueeze(-1), inf)
        return processed
