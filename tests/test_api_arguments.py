"""Bad arguments to `speculative_generate` fail at the call with one MMSpecError naming the argument,
never from deep inside the loop, a sampler or a kernel."""

from __future__ import annotations

import pytest
import torch

from mmspec import speculative_generate
from mmspec.errors import MMSpecError


@pytest.mark.parametrize("input_ids, named", [
    ("a red circle", "input_ids"),
    ([[1, 17, 42]], "input_ids"),
    (torch.tensor([[1.0, 17.0, 42.0]]), "input_ids"),
    (torch.tensor([[1, 17, 100000]]), "input_ids"),
    (torch.tensor([[1, -3, 42]]), "input_ids"),
    (torch.tensor([1, 17, 42]), "input_ids"),
])
def test_bad_input_ids_are_named(target, small_drafter, input_ids, named):
    with pytest.raises(MMSpecError, match=named):
        speculative_generate(target, small_drafter, input_ids, max_new_tokens=4)


@pytest.mark.parametrize("options, named", [
    ({"policy": "fastest-please"}, "policy"),
    ({"generator": 42, "do_sample": True}, "generator"),
    ({"top_p": 2.0, "do_sample": True}, "top_p"),
    ({"top_p": 0.0, "do_sample": True}, "top_p"),
    ({"attention_mask": torch.ones(1, 12, dtype=torch.long)}, "attention_mask"),
    ({"attention_mask": torch.ones(2, 8, dtype=torch.long)}, "attention_mask"),
    ({"num_draft_tokens": "5"}, "num_draft_tokens"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
    ({"rule": "greedy"}, "rule must be an acceptance rule"),
    ({"eos_token_id": "x"}, "eos_token_id"),
    ({"eos_token_id": 2.0}, "eos_token_id"),
    ({"eos_token_id": [2, "a"]}, "eos_token_id"),
    ({"on_tokens": "print"}, "on_tokens must be callable"),
    ({"on_round": 3}, "on_round must be callable"),
])
def test_bad_options_are_named(target, small_drafter, prompt, options, named):
    options = {"max_new_tokens": 4, **options}
    with pytest.raises(MMSpecError, match=named):
        speculative_generate(target, small_drafter, prompt, **options)


def test_eos_ids_as_numpy_or_tensor_integers_still_stop(target, small_drafter, prompt):
    import numpy as np

    plain = speculative_generate(target, small_drafter, prompt, max_new_tokens=6, eos_token_id=[])
    stop = int(plain.sequences[0, prompt.shape[1] + 1])  # the second new token
    for eos in (stop, np.int64(stop), torch.tensor(stop), [torch.tensor(stop)], torch.tensor([stop])):
        out = speculative_generate(target, small_drafter, prompt, max_new_tokens=6, eos_token_id=eos)
        assert out.sequences.shape[1] <= prompt.shape[1] + 2, eos


def test_good_arguments_still_run(target, small_drafter, prompt):
    out = speculative_generate(target, small_drafter, prompt, max_new_tokens=4, attention_mask=torch.ones_like(prompt),
                               top_p=1.0, do_sample=True, generator=torch.Generator().manual_seed(0))
    assert out.sequences.shape[1] == prompt.shape[1] + 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for a CUDA generator")
def test_a_generator_on_another_device_than_the_model_is_named(target, small_drafter, prompt):
    with pytest.raises(MMSpecError, match="generator"):
        speculative_generate(target, small_drafter, prompt, max_new_tokens=4, do_sample=True,
                             generator=torch.Generator(device="cuda").manual_seed(0))
