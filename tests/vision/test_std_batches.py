"""Sparse-to-Dense drafts for a batch: each row keeps its own top-K visual entries (rows padded apart),
mirrors its own committed columns, and drafts what it drafts alone."""

import pytest
import torch

from mmspec import FixedDraftLength, speculative_generate
from mmspec.vision.sparse_to_dense import SparseToDenseDrafter

from .test_sparse_to_dense import IMAGE_TOKEN, PATCHES, tiny_llava  # noqa: F401 (fixture)


def ragged_rows(count=3):
    rows, pixels = [], []
    for seed in range(count):
        gen = torch.Generator().manual_seed(seed)
        before = torch.tensor([1, 5, 6, 7][: 2 + seed % 3])
        after = torch.randint(3, 90, (3 + 2 * seed,), generator=gen)
        rows.append(torch.cat([before, torch.full((PATCHES + 1,), IMAGE_TOKEN), after]))
        pixels.append(torch.randn(1, 3, 56, 56, generator=gen))
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([r.new_zeros(width - len(r)), r]) for r in rows])
    mask = torch.stack([torch.cat([r.new_zeros(width - len(r)), torch.ones_like(r)]) for r in rows])
    return rows, ids, mask, torch.cat(pixels)


class RecordingStD(SparseToDenseDrafter):
    """Keeps each drafting step's logits, per row, until the first round drafting fewer than `K` tokens: a batch's
    rounds draft for the live row with the least room, so from there on its rows' rounds differ from their own."""

    K = 3

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = []
        self.recording = True

    def _sparse_step(self, token, position, keys=None):
        logits = super()._sparse_step(token, position, keys)
        if self.recording:
            self.steps.append(logits.clone())
        return logits

    def draft_rows(self, batch, max_tokens, sampling, generator):
        self.recording = self.recording and max_tokens >= self.K
        self.rows_now = batch.rows.tolist()
        start = len(self.steps)
        proposal = super().draft_rows(batch, max_tokens, sampling, generator)
        self.steps[start:] = [{row: s[i] for i, row in enumerate(self.rows_now)} for s in self.steps[start:]]
        return proposal


@pytest.mark.parametrize("visual_keep", [1, 4, 17])
def test_std_batch_equals_generate(tiny_llava, visual_keep):
    rows, ids, mask, pixels = ragged_rows()
    expected = tiny_llava.generate(ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=16, do_sample=False)
    out = speculative_generate(tiny_llava, SparseToDenseDrafter(tiny_llava, visual_keep=visual_keep), ids,
                               attention_mask=mask, pixel_values=pixels, max_new_tokens=16, policy=FixedDraftLength(3))
    assert torch.equal(out.sequences, expected)
    if visual_keep == PATCHES + 1:  # every visual entry kept: each row's drafter is the target itself
        assert out.stats.alpha == 1.0


def test_std_drafts_each_row_as_alone(tiny_llava):
    rows, ids, mask, pixels = ragged_rows()
    # Each call's own working copy of the drafter holds what it recorded.
    batched = speculative_generate(tiny_llava, RecordingStD(tiny_llava, visual_keep=4), ids, attention_mask=mask,
                                   pixel_values=pixels, max_new_tokens=16, policy=FixedDraftLength(RecordingStD.K)).drafter
    for i, row in enumerate(rows):
        alone = speculative_generate(tiny_llava, RecordingStD(tiny_llava, visual_keep=4), row[None],
                                     pixel_values=pixels[i:i + 1], max_new_tokens=16, policy=FixedDraftLength(3)).drafter
        mine = [step[i] for step in batched.steps if i in step]
        compared = min(len(mine), len(alone.steps)) - 3  # the last round's length may differ
        assert compared >= 6
        for a, b in zip(alone.steps[:compared], mine[:compared]):
            torch.testing.assert_close(b, a[0], atol=1e-4, rtol=1e-4)
