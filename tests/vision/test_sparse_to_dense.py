"""Sparse-to-Dense: lossless against the target's own greedy decoding; the sparse cache is really sparse."""

import pytest
import torch
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

from mmspec import FixedDraftLength, speculative_generate
from mmspec.testing import assert_greedy_equal, reload_from_disk
from mmspec.vision.attention_scoring import text_to_visual_importance
from mmspec.vision.sparse_to_dense import SparseToDenseDrafter, select_kv_positions

IMAGE_TOKEN = 99
PATCHES = 16  # 56 / 14 = 4 x 4 patches


@pytest.fixture(scope="module")
def tiny_llava():
    torch.manual_seed(0)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                       image_size=56, patch_size=14),
        text_config=LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                bos_token_id=1, eos_token_id=2, pad_token_id=0),
        image_token_id=IMAGE_TOKEN,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
    )
    return reload_from_disk(LlavaForConditionalGeneration(config))


def llava_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    text_before = torch.tensor([1, 5, 6])
    text_after = torch.randint(3, 90, (6,), generator=gen)
    visual = torch.full((PATCHES + 1,), IMAGE_TOKEN)  # "full" strategy keeps the CLS token too
    input_ids = torch.cat([text_before, visual, text_after])[None]
    pixel_values = torch.randn(1, 3, 56, 56, generator=gen)
    return input_ids, pixel_values


@pytest.mark.parametrize("visual_keep", [1, 4, 17])
@pytest.mark.parametrize("k", [1, 3, 9])
def test_std_greedy_identical(tiny_llava, visual_keep, k):
    input_ids, pixel_values = llava_inputs()
    drafter = SparseToDenseDrafter(tiny_llava, visual_keep=visual_keep)
    out = assert_greedy_equal(tiny_llava, drafter, input_ids, max_new_tokens=20, policy=FixedDraftLength(k),
                              pixel_values=pixel_values)
    assert out.stats.drafter_forwards > 0
    if visual_keep == 17:  # keeps every visual entry: the drafter is the target itself
        assert out.stats.alpha == 1.0


def test_std_sampling_repeats_and_runs(tiny_llava):
    input_ids, pixel_values = llava_inputs(1)
    runs = [
        speculative_generate(tiny_llava, SparseToDenseDrafter(tiny_llava, visual_keep=4), input_ids, max_new_tokens=12,
                             do_sample=True, generator=torch.Generator().manual_seed(3), pixel_values=pixel_values)
        for _ in range(2)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences)


def test_sparse_cache_holds_budget_plus_text(tiny_llava):
    input_ids, pixel_values = llava_inputs()
    drafter = speculative_generate(tiny_llava, SparseToDenseDrafter(tiny_llava, visual_keep=4), input_ids, max_new_tokens=1,
                                   pixel_values=pixel_values).drafter  # the call's own working copy holds its caches
    text_tokens = input_ids.shape[1] - (PATCHES + 1)
    assert drafter.sparse_cache.get_seq_length() == 4 + text_tokens
    assert drafter.kept_fraction == pytest.approx(4 / 17)
    # The user's model is left with its own attention implementation.
    assert tiny_llava.config.get_text_config()._attn_implementation != "mmspec_text_to_visual_scoring"


def test_importance_ranks_attended_keys_first():
    # One head, keys: position 2 aligned with the text query, position 1 orthogonal.
    key = torch.zeros(1, 1, 4, 2)
    key[0, 0, 1] = torch.tensor([0.0, 1.0])
    key[0, 0, 2] = torch.tensor([5.0, 0.0])
    query = torch.zeros(1, 1, 4, 2)
    query[0, 0, 3] = torch.tensor([1.0, 0.0])
    importance = text_to_visual_importance(query, key, torch.tensor([3]), torch.tensor([1, 2]), scaling=1.0)
    assert importance[0, 0, 1] > importance[0, 0, 0]
    kept = select_kv_positions(importance, torch.tensor([1, 2]), torch.tensor([0, 3]), keep=1)
    assert kept.tolist() == [[[0, 2, 3]]]


def test_std_refuses_a_prompt_without_visual_tokens(tiny_llava):
    from mmspec import MMSpecError

    with pytest.raises(MMSpecError, match="needs visual tokens"):
        speculative_generate(tiny_llava, SparseToDenseDrafter(tiny_llava), torch.tensor([[1, 5, 6, 7]]), max_new_tokens=4)


def test_std_refuses_another_model(tiny_llava):
    from mmspec import MMSpecError
    from mmspec.testing import tiny_llama

    with pytest.raises(MMSpecError, match="own weights"):
        speculative_generate(tiny_llama(vocab_size=100), SparseToDenseDrafter(tiny_llava), torch.tensor([[1, 5]]), max_new_tokens=2)
