"""MSD's and FLASH's decoder layers run lean when drafting: the same outputs as through the transformers layer."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from mmspec.kernels.lean_llama import lean_layer_supported
from mmspec.vision.flash_model import FlashDrafterModel
from mmspec.vision.msd import MSDDrafterModel


def text_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=128)


def drafter(kind: str):
    torch.manual_seed(0)
    if kind == "flash":
        model = FlashDrafterModel.from_target_config(text_config(), num_queries=4, semi_ar_tokens=2)
    else:
        model = MSDDrafterModel.from_target_config(text_config())
    for parameter in model.parameters():  # trained-looking weights: outputs far from the input
        torch.nn.init.normal_(parameter, std=0.2)
    return model.eval()


def run(model, hidden, positions, cache, lean):
    if isinstance(model, FlashDrafterModel):
        return model(hidden, positions, past_key_values=cache, lean=lean)
    return model(hidden, positions, past_key_values=cache, use_cache=True, lean=lean).last_hidden_state


@pytest.mark.parametrize("kind", ["msd", "flash"])
@torch.inference_mode()
def test_lean_layer_outputs_equal_the_transformers_layers(kind):
    model = drafter(kind)
    layer = model.layer if kind == "flash" else model.layers[0]
    assert lean_layer_supported(layer)
    prompt, steps = torch.randn(1, 7, 32), [torch.randn(1, 1, 32), torch.randn(1, 3, 32)]
    outputs = {}
    calls = []
    handle = layer.register_forward_pre_hook(lambda *args: calls.append(1))
    assert not lean_layer_supported(layer)  # a hooked layer takes its own forward (the lean path would skip the hook)
    run(model, prompt, torch.arange(7)[None], DynamicCache(), lean=True)
    handle.remove()
    assert calls == [1] and lean_layer_supported(layer)
    for lean in (True, False):  # False: transformers' layer forward
        cache = DynamicCache()
        outs = [run(model, prompt, torch.arange(7)[None], cache, lean)]
        start = 7
        for step in steps:
            outs.append(run(model, step, torch.arange(start, start + step.shape[1])[None], cache, lean))
            start += step.shape[1]
        outputs[lean] = outs
    for ours, theirs in zip(outputs[True], outputs[False]):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    assert not torch.allclose(outputs[True][1], outputs[True][2][:, :1], atol=1e-3)  # the steps differ: a real check
