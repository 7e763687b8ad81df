"""Vision-language targets decode batches: each row (its own image or video, its own prompt length)
equals the row decoded alone and `generate` on the batch."""

import pytest
import torch

from mmspec import speculative_generate
from mmspec.drafters import DraftView, NoDrafter
from mmspec.policies import FixedDraftLength
from mmspec.sampling import SamplingConfig
from mmspec.vision.flash import FlashDrafterModel
from mmspec.vision.models import modality_token_types
from mmspec.vision.msd import MSDDrafterModel
from mmspec.vision.sparse_to_dense import SparseToDenseDrafter
from mmspec.vision.text_drafter import TextOnlyDrafter

from .tiny_vlms import (
    BOS,
    IMAGE,
    VIDEO,
    VISION_END,
    VISION_START,
    llava,
    next_video,
    onevision,
    qwen2_vl_model,
    text_drafter_lm,
)

# Per row: text before and after the media placeholders (ragged lengths).
ROWS = [([BOS, 11, 12], [13, 14, 15, 11, 12]), ([BOS, 40], [41, 42]), ([BOS, 7, 8, 9, 10, 11], [12, 13, 14])]


def batch_of(case, placeholder, count, pixels_key):
    rows = [torch.tensor(before + [placeholder] * count + after) for before, after in ROWS]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([r.new_zeros(width - len(r)), r]) for r in rows])
    mask = torch.stack([torch.cat([r.new_zeros(width - len(r)), torch.ones_like(r)]) for r in rows])
    torch.manual_seed(5)
    pixels = torch.randn(len(rows), *case.inputs[pixels_key].shape[1:])
    return rows, ids, mask, {pixels_key: pixels}


CASES = {
    "llava-image": lambda: (llava(), IMAGE, 4, "pixel_values"),
    "nextvideo-video": lambda: (next_video(), VIDEO, 16, "pixel_values_videos"),
    "onevision-video": lambda: (onevision(), VIDEO, 17, "pixel_values_videos"),
}


@pytest.fixture(scope="module")
def drafter_lm():
    return text_drafter_lm()


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("method", ["text", "ar"])
def test_vlm_batch_equals_generate_and_each_row_alone(name, method, drafter_lm):
    case, placeholder, count, key = CASES[name]()
    model = case.model
    rows, ids, mask, media = batch_of(case, placeholder, count, key)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, **media)
    drafter = TextOnlyDrafter(drafter_lm, model) if method == "text" else NoDrafter()
    out = speculative_generate(model, drafter, ids, attention_mask=mask, max_new_tokens=16, num_draft_tokens=3, **media)
    assert torch.equal(out.sequences, expected)
    for i, row in enumerate(rows):
        alone = model.generate(row[None], max_new_tokens=16, do_sample=False, **{key: media[key][i:i + 1]})
        produced = out.sequences[i, ids.shape[1]:][: alone.shape[1] - len(row)]
        assert torch.equal(produced, alone[0, len(row):])


class FirstDrafts(TextOnlyDrafter):
    """Keeps the drafts of its first batch round."""

    first = None

    def propose(self, view):
        proposal = super().propose(view)
        if view.batch is not None:
            self.first = self.first if self.first is not None else proposal.tokens
        return proposal


def test_text_drafter_reads_a_batch_as_each_row_alone(drafter_lm):
    """Visual columns are holes to the text drafter: its drafts for a row in a batch are the drafts it
    makes for that row alone (its positions count text tokens only)."""
    case, placeholder, count, key = CASES["nextvideo-video"]()
    rows, ids, mask, media = batch_of(case, placeholder, count, key)
    batched = speculative_generate(case.model, FirstDrafts(drafter_lm, case.model), ids, attention_mask=mask, max_new_tokens=6,
                                   num_draft_tokens=4, **media).drafter  # the call's own working copy recorded them
    for i, row in enumerate(rows):
        # The first drafts ride along with the prefill: drafted from the prompt, as a lone drafter drafts them.
        lone = TextOnlyDrafter(drafter_lm, case.model)
        view = DraftView(row[None], SamplingConfig(), None, FixedDraftLength(4), max_tokens=4)
        lone.begin(view, {})
        expected = lone.propose(view).tokens[0]
        assert torch.equal(batched.first[i], expected)


QWEN_ROWS = [([BOS, 41, 42, VISION_START], [VISION_END, 43, 44, 41, 42]), ([BOS, 40, VISION_START], [VISION_END, 42]),
             ([BOS, 7, 8, 9, 10, VISION_START], [VISION_END, 12, 13, 14])]


def qwen_batch(kind):
    """Ragged Qwen2-VL rows, each with its own picture (4 tokens, grid 1x4x4) or video (8 tokens, grid 2x4x4)."""
    placeholder, count, grid, key, grid_key = ((IMAGE, 4, [1, 4, 4], "pixel_values", "image_grid_thw") if kind == "image"
                                               else (VIDEO, 8, [2, 4, 4], "pixel_values_videos", "video_grid_thw"))
    rows = [torch.tensor(before + [placeholder] * count + after) for before, after in QWEN_ROWS]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([r.new_zeros(width - len(r)), r]) for r in rows])
    mask = torch.stack([torch.cat([r.new_zeros(width - len(r)), torch.ones_like(r)]) for r in rows])
    torch.manual_seed(9)
    patches = grid[0] * grid[1] * grid[2]
    pixels = torch.randn(len(rows) * patches, 3 * 2 * 14 * 14)
    singles = [{key: pixels[i * patches:(i + 1) * patches], grid_key: torch.tensor([grid])} for i in range(len(rows))]
    return rows, ids, mask, {key: pixels, grid_key: torch.tensor([grid] * len(rows))}, singles


@pytest.fixture(scope="module")
def qwen():
    return qwen2_vl_model()


@pytest.mark.parametrize("kind", ["image", "video"])
@pytest.mark.parametrize("method", ["text", "ar", "std"])
def test_qwen2_vl_batch_equals_generate_and_each_row_alone(qwen, drafter_lm, kind, method):
    """Qwen2-VL's 3-D M-RoPE positions per row: the prompt's table from the padded batch, then text
    position + the row's rope delta."""
    rows, ids, mask, media, singles = qwen_batch(kind)
    types = modality_token_types(qwen, ids)
    expected = qwen.generate(ids, attention_mask=mask, mm_token_type_ids=types, max_new_tokens=12, do_sample=False, **media)
    drafter = {"text": lambda: TextOnlyDrafter(drafter_lm, qwen), "ar": NoDrafter,
               "std": lambda: SparseToDenseDrafter(qwen, visual_keep=2)}[method]()
    out = speculative_generate(qwen, drafter, ids, attention_mask=mask, max_new_tokens=12, num_draft_tokens=3, **media)
    assert torch.equal(out.sequences, expected)
    for i, row in enumerate(rows):
        alone = qwen.generate(row[None], mm_token_type_ids=modality_token_types(qwen, row[None]), max_new_tokens=12,
                              do_sample=False, **singles[i])
        assert torch.equal(out.sequences[i, ids.shape[1]:][: alone.shape[1] - len(row)], alone[0, len(row):])


@pytest.mark.parametrize("kind", ["image", "video"])
@pytest.mark.parametrize("method", ["msd", "flash"])
def test_qwen2_vl_feature_drafters_rotate_each_row_by_its_own_positions(qwen, kind, method):
    """MSD and FLASH drafters of a Qwen2-VL target in a batch: output equals generate, and each row's draft
    logits equal those of the row alone (its slots at the target's 3-D positions: the prompt table, then
    text position + the row's delta)."""
    from .test_feature_batches import RecordingFlash, RecordingMSD

    torch.manual_seed(0)
    text_config = qwen.config.get_text_config()
    if method == "msd":
        model, runtime = MSDDrafterModel.from_target_config(text_config), RecordingMSD
    else:
        model = FlashDrafterModel.from_target_config(text_config, num_queries=2, semi_ar_tokens=2, compress=True)
        runtime = RecordingFlash
    rows, ids, mask, media, singles = qwen_batch(kind)
    types = modality_token_types(qwen, ids)
    expected = qwen.generate(ids, attention_mask=mask, mm_token_type_ids=types, max_new_tokens=10, do_sample=False, **media)
    out = speculative_generate(qwen, runtime(model.eval()), ids, attention_mask=mask, max_new_tokens=10, num_draft_tokens=3,
                               **media)
    assert torch.equal(out.sequences, expected)
    batched = out.drafter  # each call's own working copy of the drafter holds what it recorded
    for i, row in enumerate(rows):
        alone = speculative_generate(qwen, runtime(model), row[None], max_new_tokens=10, num_draft_tokens=3,
                                     **singles[i]).drafter
        mine = [r[i] for r in batched.rounds if i in r]
        compared = 0
        for (a, a_logits), (b, b_logits) in zip([r[0] for r in alone.rounds], mine):
            if len(a) == len(b) == 3:
                torch.testing.assert_close(b_logits, a_logits, atol=1e-4, rtol=1e-4)
                compared += 1
        assert compared >= 2
