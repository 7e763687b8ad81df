"""Feature drafters (MSD, FLASH) draft for a batch: every row gets the drafts it would get alone, and
the batch decodes to `generate`'s output."""

from types import SimpleNamespace

import pytest
import torch

from mmspec import FixedDraftLength, speculative_generate
from mmspec.vision.distill_data import generate_distill_data
from mmspec.vision.drafter_training import train_drafter
from mmspec.vision.flash import FlashDrafter, FlashDrafterModel
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


class Recording:
    """Keeps every round's drafts and draft logits, per row (for a batch) or for its one sequence."""

    def __init__(self, model):
        super().__init__(model)
        self.rounds = []

    def bind(self, target):
        super().bind(target)
        # The head outlives this object: a call runs on a working copy of the drafter, which shares this box.
        head, box = self.lm_head, SimpleNamespace(logits=[])
        self._box = box

        def recording_head(hidden):
            logits = head(hidden)
            box.logits.append(logits.detach().clone())
            return logits

        self.lm_head = recording_head
        self.lm_head.weight = head.weight

    def propose(self, view):
        self._box.logits = []
        proposal, batch = super().propose(view), view.batch
        if not self._box.logits:
            return proposal
        if batch is None:
            self.rounds.append({0: (proposal.tokens[0].tolist(), torch.stack([logit[0] for logit in self._box.logits]))})
            return proposal
        logits = torch.stack(self._box.logits, dim=1)
        self.rounds.append({row: (tokens, logits[i]) for i, (row, tokens) in
                            enumerate(zip(batch.rows.tolist(), proposal.tokens.tolist()))})
        return proposal


class RecordingMSD(Recording, MSDDrafter):
    pass


class RecordingFlash(Recording, FlashDrafter):
    pass


RUNTIME = {"msd": RecordingMSD, "flash": RecordingFlash}


def untrained_flash(model, n, seed=0):
    torch.manual_seed(seed)
    return FlashDrafterModel.from_target_config(model.config.get_text_config(), num_queries=3, semi_ar_tokens=n,
                                                compress=True).eval()


@pytest.mark.parametrize("which", ["untrained", "trained"])
def test_msd_batch_equals_generate(case, trained, which):
    model = untrained(case.model) if which == "untrained" else trained
    rows, ids, mask, pixels = ragged_batch([3, 4, 5])
    expected = case.model.generate(ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=16, do_sample=False)
    out = speculative_generate(case.model, MSDDrafter(model), ids, attention_mask=mask, pixel_values=pixels,
                               max_new_tokens=16, policy=FixedDraftLength(3))
    assert torch.equal(out.sequences, expected)
    assert out.stats.drafted > 0


@pytest.mark.parametrize("n", [1, 2, 3])
def test_flash_batch_equals_generate(case, n):
    rows, ids, mask, pixels = ragged_batch([3, 4, 5])
    expected = case.model.generate(ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=16, do_sample=False)
    out = speculative_generate(case.model, FlashDrafter(untrained_flash(case.model, n)), ids, attention_mask=mask,
                               pixel_values=pixels, max_new_tokens=16, policy=FixedDraftLength(4))
    assert torch.equal(out.sequences, expected)


@pytest.fixture(scope="module", params=["msd", pytest.param("flash", marks=pytest.mark.slow)])
def fitted(case, tmp_path_factory, request):
    """A drafter fitted to the target's traces of the very rows decoded below: it accepts often, so
    rounds end at every acceptance depth and the features after each depth are exercised."""
    folder = tmp_path_factory.mktemp(f"{request.param}-batch")
    rows, _, _, pixels = ragged_batch([0, 1, 2])
    examples = [{"input_ids": row[None], "pixel_values": pixels[i:i + 1]} for i, row in enumerate(rows)]
    generate_distill_data(case.model, examples, folder / "data", max_new_tokens=20, progress=False)
    model = train_drafter(case.model, request.param, folder / "data", folder / "out", steps=150, batch_size=3, lr=3e-3,
                          curriculum="none", checkpoint_every=0, progress=False)
    return RUNTIME[request.param], model


def test_feature_drafter_drafts_each_row_as_alone(case, fitted):
    """Row by row, the batch's drafts equal those of the row decoded alone (same committed tokens, same
    features): the slots of holes, pads and each row's first column are invisible to the drafter, and
    FLASH's compressed prompts of different lengths are padded apart."""
    runtime, model = fitted
    rows, ids, mask, pixels = ragged_batch([0, 1, 2])
    out = speculative_generate(case.model, runtime(model), ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=20,
                               policy=FixedDraftLength(4))
    assert out.stats.alpha > 0.4  # most rounds accept some drafts
    batched = out.drafter  # each call's own working copy of the drafter holds what it recorded
    compared = 0
    for i, row in enumerate(rows):
        alone = speculative_generate(case.model, runtime(model), row[None], pixel_values=pixels[i:i + 1], max_new_tokens=20,
                                     policy=FixedDraftLength(4)).drafter
        mine = [r[i] for r in batched.rounds if i in r]
        for (a, a_logits), (b, b_logits) in zip([r[0] for r in alone.rounds], mine):
            if len(a) == len(b) == 4:  # near the end the batch's draft length follows the longest row
                assert a == b
                torch.testing.assert_close(b_logits[: len(a_logits)], a_logits[: len(b_logits)], atol=1e-4, rtol=1e-4)
                compared += 1
    assert compared >= 6
    assert any(IMAGE in row.tolist() for row in rows)
