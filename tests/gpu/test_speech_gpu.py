"""Whisper on CUDA: hybrid-free speculative transcription equals generate; CPU generator works."""

import pytest
import torch

from mmspec import NoDrafter, PromptLookupDrafter, speculative_generate
from mmspec.speech.feature_drafter import WhisperFeatureDrafter, WhisperFeatureDrafterModel
from mmspec.speech.target import WhisperTarget

from ..speech.tiny_whisper import features, tiny_whisper

CUDA = torch.device("cuda")


@pytest.mark.parametrize("drafter", ["none", "lookup", "self", "feature"])
def test_whisper_greedy_on_cuda(drafter):
    model = tiny_whisper(seed=0).to(CUDA)
    x = features(2).to(CUDA)
    expected = model.generate(x, do_sample=False, max_new_tokens=20, return_dict_in_generate=True).sequences
    if drafter == "feature":  # a float16 checkpoint, as shipped: bound on the model's device and dtype
        chosen = WhisperFeatureDrafter(WhisperFeatureDrafterModel.for_target(model).half())
    else:
        chosen = {"none": NoDrafter(), "lookup": PromptLookupDrafter(), "self": model}[drafter]
    out = speculative_generate(WhisperTarget(model), chosen, None, input_features=x, do_sample=False, max_new_tokens=20)
    assert torch.equal(out.sequences, expected)


def test_whisper_sampling_with_a_cpu_generator():
    model = tiny_whisper(seed=0).to(CUDA)
    x = features(2).to(CUDA)
    runs = [speculative_generate(WhisperTarget(model), model, None, input_features=x, do_sample=True, max_new_tokens=12,
                                 generator=torch.Generator().manual_seed(5)).sequences for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
