"""Whisper's decoder on the static-shape path (`compile=True`) on CUDA: CUDA graphs ("reduce-overhead") over the
static self- and cross-attention caches, greedy and strict hybrid output equal to `generate`, graphs reused."""

import pytest
import torch

from mmspec import NoDrafter, speculative_generate
from mmspec.speech.hybrid import HybridDrafter, hybrid_policy

from ..speech.tiny_whisper import features, tiny_whisper

CUDA = torch.device("cuda")


class Hypothesis:
    def __init__(self, tokens):
        self.tokens = tokens

    def hypothesis(self, encoder_hidden_states):
        return [list(self.tokens)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_whisper_on_cuda(dtype):
    import torch._dynamo

    model = tiny_whisper(seed=0).to(CUDA, dtype)
    for seed in range(3):
        x = features(seed).to(CUDA, dtype)
        # float32: generate itself; bfloat16: generate over a static cache (attention over the padded cache rounds
        # differently from a dynamic one's at that precision)
        extra = {} if dtype == torch.float32 else {"cache_implementation": "static"}
        expected = model.generate(x, do_sample=False, max_new_tokens=30, return_dict_in_generate=True, **extra).sequences
        out = speculative_generate(model, NoDrafter(), None, input_features=x, max_new_tokens=30, compile=True)
        assert torch.equal(out.sequences, expected)
        edited = expected[0, 4:].tolist()
        edited[1] = (edited[1] + 5) % 100  # a rejection at once: the rest is verified by compiled, chunked steps
        out = speculative_generate(model, HybridDrafter(Hypothesis(edited)), None, input_features=x, max_new_tokens=30,
                                   policy=hybrid_policy(), compile=True)
        assert torch.equal(out.sequences, expected)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    out = speculative_generate(model, NoDrafter(), None, input_features=features(5).to(CUDA, dtype), max_new_tokens=30,
                               compile=True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs  # the same graphs, no recompile
