"""Feature drafters (MSD) draft for a batch: every row gets the drafts it would get alone, and the
batch decodes to `generate`'s output."""

import pytest
import torch

from mmspec import FixedDraftLength, speculative_generate
from mmspec.vision.distill_data import generate_distill_data
from mmspec.vision.drafter_training import train_drafter
from mmspec.vision.msd import MSDDrafter

from .test_msd import case, llava_prompt, trained, untrained  # noqa: F401 (fixtures)
from .tiny_vlms import IMAGE


def ragged_batch(seeds):
    """Left-padded LLaVA prompts of different lengths, each with its own picture."""
    rows, pixels = [], []
    for seed in seeds:
        ids, picture = llava_prompt(seed)
        rows.append(ids[0, : ids.shape[1] - seed % 3])  # cut 0-2 trailing text tokens: ragged lengths
        pixels.append(picture)
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([r.new_zeros(width - len(r)), r]) for r in rows])
    mask = torch.stack([torch.cat([r.new_zeros(width - len(r)), torch.ones_like(r)]) for r in rows])
    return rows, ids, mask, torch.cat(pixels)


class RecordingMSD(MSDDrafter):
    """Keeps every round's drafts, per row (for a batch) or for its one sequence."""

    def __init__(self, model):
        super().__init__(model)
        self.rounds = []

    def propose(self, sequence, max_tokens, sampling, generator, policy):
        proposal = super().propose(sequence, max_tokens, sampling, generator, policy)
        self.rounds.append(proposal.tokens[0].tolist())
        return proposal

    def propose_batch(self, batch, max_tokens, sampling, generator):
        proposal = super().propose_batch(batch, max_tokens, sampling, generator)
        self.rounds.append(dict(zip(batch.rows.tolist(), proposal.tokens.tolist())))
        return proposal


@pytest.mark.parametrize("which", ["untrained", "trained"])
def test_msd_batch_equals_generate(case, trained, which):
    model = untrained(case.model) if which == "untrained" else trained
    rows, ids, mask, pixels = ragged_batch([3, 4, 5])
    expected = case.model.generate(ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=16, do_sample=False)
    out = speculative_generate(case.model, MSDDrafter(model), ids, attention_mask=mask, pixel_values=pixels,
                               max_new_tokens=16, policy=FixedDraftLength(3))
    assert torch.equal(out.sequences, expected)
    assert out.stats.drafted > 0


@pytest.fixture(scope="module")
def fitted(case, tmp_path_factory):
    """A drafter fitted to the target's traces of the very rows decoded below: it accepts often, so
    rounds end at every acceptance depth and the features after each depth are exercised."""
    folder = tmp_path_factory.mktemp("msd-batch")
    rows, _, _, pixels = ragged_batch([0, 1, 2])
    examples = [{"input_ids": row[None], "pixel_values": pixels[i:i + 1]} for i, row in enumerate(rows)]
    generate_distill_data(case.model, examples, folder / "data", max_new_tokens=20, progress=False)
    return train_drafter(case.model, "msd", folder / "data", folder / "out", steps=150, batch_size=3, lr=3e-3,
                         curriculum="none", checkpoint_every=0, progress=False)


def test_msd_drafts_each_row_as_alone(case, fitted):
    """Row by row, the batch's drafts equal those of the row decoded alone (same committed tokens, same
    features): the slots of holes, pads and each row's first column are invisible to the drafter."""
    rows, ids, mask, pixels = ragged_batch([0, 1, 2])
    batched = RecordingMSD(fitted)
    out = speculative_generate(case.model, batched, ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=20,
                               policy=FixedDraftLength(4))
    assert out.stats.alpha > 0.4  # most rounds accept some drafts
    compared = 0
    for i, row in enumerate(rows):
        alone = RecordingMSD(fitted)
        speculative_generate(case.model, alone, row[None], pixel_values=pixels[i:i + 1], max_new_tokens=20,
                             policy=FixedDraftLength(4))
        mine = [r[i] for r in batched.rounds if i in r]
        for a, b in zip(alone.rounds, mine):
            if len(a) == len(b) == 4:  # near the end the batch's draft length follows the longest row
                assert a == b
                compared += 1
    assert compared >= 6
    assert any(IMAGE in row.tolist() for row in rows)
