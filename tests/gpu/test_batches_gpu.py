"""Batches on CUDA: ragged rows equal generate on the batch, with a CUDA or a CPU generator for sampling."""

import pytest
import torch

from mmspec import PromptLookupDrafter, speculative_generate
from mmspec.drafters import NoDrafter
from mmspec.testing import tiny_llama

from ..test_batch_decoding import PROMPTS, left_padded

CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def pair():
    return (tiny_llama(seed=0, initializer_range=0.3).to(CUDA),
            tiny_llama(seed=1, num_layers=1, hidden_size=32, initializer_range=0.3).to(CUDA))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ragged_batch_equals_generate_on_cuda(pair, dtype):
    target, small = (m.to(dtype) for m in pair)
    ids, mask = (t.to(CUDA) for t in left_padded(PROMPTS))
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    for drafter in (small, PromptLookupDrafter(), NoDrafter()):
        out = speculative_generate(target, drafter, ids, attention_mask=mask, max_new_tokens=20, num_draft_tokens=4)
        assert torch.equal(out.sequences, expected)
        assert out.sequences.device.type == "cuda"
    for m in pair:
        m.to(torch.float32)


@pytest.mark.parametrize("generator_device", ["cuda", "cpu"])
def test_seeded_batch_sampling_repeats(pair, generator_device):
    target, small = pair
    ids, mask = (t.to(CUDA) for t in left_padded(PROMPTS[:4]))
    runs = [speculative_generate(target, small, ids, attention_mask=mask, do_sample=True, max_new_tokens=16,
                                 generator=torch.Generator(device=generator_device).manual_seed(3)).sequences
            for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
