"""A target spread over the GPU, the CPU and the disk, and a drafter on a device of its own (accelerate's hook
carries the tokens across): greedy output equal to the target's own `generate`."""

import pytest
import torch

from mmspec import speculative_generate
from mmspec.devices import input_device, place_drafter
from mmspec.testing import assert_greedy_equal, tiny_llama

from ..test_device_map import LLAMA_MAP, MAX_NEW, PROMPT, dispatched, tiny_target

# The first layers on the GPU, one on the CPU, the last on the disk: accelerate runs the offloaded ones on cuda:0.
GPU_MAP = {**LLAMA_MAP, "model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, "model.norm": 0, "lm_head": 0}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return dispatched(tiny_target(), GPU_MAP, tmp_path_factory.mktemp("gpu-map"))


@pytest.mark.parametrize("drafter_device", [None, "cpu"])
def test_spread_target_with_a_drafter_on_its_own_device(target, drafter_device):
    assert input_device(target) == torch.device("cuda:0")
    drafter = place_drafter(tiny_llama(num_layers=1, hidden_size=32, seed=5, initializer_range=0.3, eos_token_id=None),
                            drafter_device, target)
    assert drafter.device == (torch.device("cuda:0") if drafter_device is None else torch.device("cpu"))
    prompt = PROMPT.to(input_device(target))
    assert_greedy_equal(target, drafter, prompt, max_new_tokens=MAX_NEW, num_draft_tokens=4)
    sampled = [speculative_generate(target, drafter, prompt, max_new_tokens=MAX_NEW, do_sample=True,
                                    generator=torch.Generator().manual_seed(2)).sequences for _ in range(2)]
    assert torch.equal(*sampled)
