"""The text-only drafter reads text, never pixels or placeholder tokens, and never drafts them."""

import pytest
import torch

from mmspec import FixedDraftLength, MMSpecError, SamplingConfig, speculative_generate
from mmspec.drafters import DraftView
from mmspec.vision import TextOnlyDrafter, VisionTarget, visual_token_ids

from .test_sparse_to_dense import tiny_llava  # noqa: F401 (fixture)
from .tiny_vlms import IMAGE, VIDEO, VISION_END, VISION_START

VISUAL = {IMAGE, VIDEO, VISION_START, VISION_END}


def record_calls(model):
    """Forward pre-hook logging every call's input_ids and keyword names."""
    calls = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        calls.append((ids.clone(), set(kwargs)))

    return calls, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("name", ["llava-image", "onevision-video", "nextvideo-video", "qwen2vl-image", "qwen2vl-video"])
def test_drafter_never_sees_visual_tokens_or_pixels(name, vlm_cases, text_lm):
    case = vlm_cases[name]
    calls, handle = record_calls(text_lm)
    try:
        out = speculative_generate(VisionTarget(case.model), TextOnlyDrafter(text_lm, case.model), case.input_ids,
                                   max_new_tokens=12, num_draft_tokens=3, **case.inputs)
    finally:
        handle.remove()
    assert calls, "the drafter never ran"
    for ids, keys in calls:
        assert not set(ids.flatten().tolist()) & VISUAL
        assert not keys & {"pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw", "mm_token_type_ids", "image_sizes"}
    # Its first forward reads the prompt's text, in order.
    prompt_text = [t for t in case.input_ids[0].tolist() if t not in VISUAL]
    assert calls[0][0][0].tolist() == prompt_text
    assert out.stats.drafter_forwards == len(calls)


def test_cache_follows_the_filtered_sequence(vlm_cases, text_lm):
    case = vlm_cases["qwen2vl-video"]
    drafter = speculative_generate(VisionTarget(case.model), TextOnlyDrafter(text_lm, case.model), case.input_ids,
                                   max_new_tokens=10, num_draft_tokens=4, **case.inputs).drafter  # the call's own copy
    assert drafter.cached_tokens.numel() > 0
    # After a round the cache holds a prefix of the text-only sequence (lazy catch-up, as ModelDrafter).
    assert not set(drafter.cached_tokens.tolist()) & VISUAL
    assert drafter.lm.length <= drafter.cached_tokens.shape[0]


def test_never_drafts_a_visual_token(text_lm, vlm_cases):
    drafter = TextOnlyDrafter(text_lm, {IMAGE, VIDEO})
    logits = torch.zeros(1, text_lm.config.vocab_size)
    logits[0, IMAGE] = 10.0
    logits[0, VIDEO] = 9.0
    logits[0, 7] = 1.0
    token, _, _ = drafter.choose(logits, SamplingConfig(), None, False)
    assert int(token[0]) == 7
    token, q, _ = drafter.choose(logits, SamplingConfig(do_sample=True), torch.Generator().manual_seed(0), False)
    assert float(q[0, IMAGE]) == 0.0 and float(q[0, VIDEO]) == 0.0 and int(token[0]) not in (IMAGE, VIDEO)


def test_all_visual_prompt_gives_no_drafts(text_lm):
    drafter = TextOnlyDrafter(text_lm, {IMAGE})
    prompt = torch.full((1, 4), IMAGE)
    view = DraftView(prompt, SamplingConfig(), None, FixedDraftLength(3), max_tokens=3)
    drafter.begin(view, {"pixel_values": torch.zeros(1)})
    proposal = drafter.propose(view)
    assert proposal.length == 0


def test_constructor_reads_ids_from_the_target(vlm_cases, text_lm):
    target = vlm_cases["qwen2vl-image"].model
    drafter = TextOnlyDrafter(text_lm, target)
    assert set(drafter.visual_ids.tolist()) == visual_token_ids(target) == VISUAL
    with pytest.raises(MMSpecError):
        TextOnlyDrafter(text_lm, [])



def test_drafter_without_the_appended_visual_tokens_is_padded(tiny_llava):
    """A drafter trained before `<image>` was appended to the vocabulary still drafts for the target."""
    from mmspec.testing import assert_greedy_equal, tiny_llama

    from .test_sparse_to_dense import IMAGE_TOKEN, llava_inputs

    input_ids, pixel_values = llava_inputs()
    small = tiny_llama(vocab_size=IMAGE_TOKEN, num_layers=1, hidden_size=32, seed=5)  # ids 0..98: no <image>
    drafter = TextOnlyDrafter(small, tiny_llava)
    assert drafter.vocab_size == IMAGE_TOKEN + 1
    out = assert_greedy_equal(tiny_llava, drafter, input_ids, max_new_tokens=12, num_draft_tokens=3, pixel_values=pixel_values)
    assert out.stats.drafted > 0


def test_drafter_missing_ordinary_tokens_is_refused(tiny_llava):
    from mmspec.testing import tiny_llama

    small = tiny_llama(vocab_size=90, num_layers=1, hidden_size=32, seed=5)
    with pytest.raises(MMSpecError, match="vocabularies differ"):
        speculative_generate(tiny_llava, TextOnlyDrafter(small, tiny_llava), torch.tensor([[1, 5, 6]]), max_new_tokens=3)
