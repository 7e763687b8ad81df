"""The column layout of a batch whose rows accept different numbers of drafts.

Every forward appends the same columns to every row, so each KV cache stays one rectangular
tensor; a rejected draft's column becomes a hole: masked out of attention from then on and
skipped by position ids. No cache is ever cropped or shifted per row.

    columns:  [ left pads | prompt | t0 | d1 d2 d3 | t1 | d1 d2 d3 | t2 ]
    mask:     [    0 0    |  1 1 1 |  1 |  1  0  0 |  1 |  1  1  1 |  1 ]   (row accepted 1, then 3)

The last column always holds each row's newest committed token, which no cache holds yet.
Positions count a row's valid columns (as transformers' `generate` derives them from a padded
attention mask), so a row is computed as if decoded alone.
"""

from __future__ import annotations

import torch


class RaggedBatch:
    """Token columns [B, S] and their validity mask [B, S] for the rows still decoding.

    `rows` maps each live row to its index in the caller's batch; `generated[i]` lists the tokens
    committed for caller row i (finished rows keep theirs after they leave the batch).
    """

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        self.tokens = input_ids
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.device).long()
        self.mask = mask
        self.prompt_width = input_ids.shape[1]
        self.rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        self.generated: list[list[int]] = [[] for _ in range(input_ids.shape[0])]

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])

    @property
    def width(self) -> int:
        return int(self.tokens.shape[1])

    def next_positions(self, count: int) -> torch.Tensor:
        """Positions [B, count] of `count` columns appended after the current ones (all valid)."""
        start = self.mask.sum(-1, keepdim=True)
        return start + torch.arange(count, device=self.mask.device)[None]

    def column_positions(self, start: int) -> torch.Tensor:
        """Positions [B, S - start] of the existing columns from `start` on (holes get their neighbour's; masked anyway)."""
        return (self.mask.cumsum(-1) - 1).clamp(min=0)[:, start:]

    def commit(self, tokens: torch.Tensor, valid: torch.Tensor, stops: set[int], budget: int) -> tuple[int, list[int]]:
        """Append a round's columns `tokens` [B, m] whose `valid` [B, m] ones are committed, each row cut after
        its first stop token or at its token `budget`. Returns the tokens committed and the rows that finished."""
        valid = valid.clone()
        finished = []
        for b, live in enumerate(self.rows.tolist()):
            room, kept = budget - len(self.generated[live]), 0  # a live row has room for one more at least
            for j in valid[b].nonzero().flatten().tolist():
                kept += 1
                if int(tokens[b, j]) in stops or kept == room:
                    valid[b, j + 1:] = False
                    finished.append(b)
                    break
        self.append(tokens, valid)
        return int(valid.sum()), finished

    def append(self, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """Add columns `tokens` [B, m]; `valid` [B, m] says which hold committed tokens (the rest are holes)."""
        self.tokens = torch.cat([self.tokens, tokens], dim=1)
        self.mask = torch.cat([self.mask, valid.long()], dim=1)
        for live, row_tokens, row_valid in zip(self.rows.tolist(), tokens.tolist(), valid.tolist()):
            self.generated[live].extend(t for t, ok in zip(row_tokens, row_valid) if ok)

    def feed(self, start: int, new_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """Inputs of a forward over the columns from `start` on plus `new_tokens` [B, m] appended as valid
        columns: tokens [B, S - start + m], the attention mask over every column [B, S + m], position ids."""
        count = new_tokens.shape[1]
        positions = torch.cat([self.column_positions(start), self.next_positions(count)], dim=1)
        mask = torch.cat([self.mask, self.mask.new_ones((self.size, count))], dim=1)
        return {"tokens": torch.cat([self.tokens[:, start:], new_tokens], dim=1), "attention_mask": mask, "position_ids": positions}

    def prefixes(self, row: int, first_column: int, count: int, drafts: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Row `row`'s token prefixes [1, L] through columns first_column .. first_column + count - 1, with
        `drafts` [B, m] as valid columns after the current ones, as `generate` sees them: the padded
        prompt, then the row's valid tokens (what logits processors read)."""
        tokens, keep = self.tokens[row], self.mask[row].bool().clone()
        if drafts is not None:
            tokens = torch.cat([tokens, drafts[row]])
            keep = torch.cat([keep, keep.new_ones(drafts.shape[1])])
        keep[: self.prompt_width] = True
        return [tokens[: c + 1][keep[: c + 1]][None] for c in range(first_column, first_column + count)]

    def without(self, drop: torch.Tensor, filler: int = 0) -> "RaggedBatch":
        """A view of the same rows in which the columns `drop` [B, S] are holes too (their tokens set to
        `filler`): what a drafter sees that must not read some tokens (a text drafter and visual tokens)."""
        view = RaggedBatch.__new__(RaggedBatch)
        view.__dict__.update(self.__dict__)
        view.tokens = self.tokens.masked_fill(drop, filler)
        view.mask = self.mask.masked_fill(drop, 0)
        return view

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the live rows at indices `keep` (finished rows leave the batch)."""
        self.tokens = self.tokens.index_select(0, keep)
        self.mask = self.mask.index_select(0, keep)
        self.rows = self.rows.index_select(0, keep)

    def sequences(self, prompt: torch.Tensor, pad_token_id: int) -> torch.Tensor:
        """Caller's prompt [B, P] followed by each row's generated tokens, right-padded with `pad_token_id`."""
        longest = max((len(g) for g in self.generated), default=0)
        out = prompt.new_full((prompt.shape[0], longest), pad_token_id)
        for i, tokens in enumerate(self.generated):
            if tokens:
                out[i, : len(tokens)] = torch.tensor(tokens, dtype=out.dtype, device=out.device)
        return torch.cat([prompt, out], dim=1)
