"""The lean Llama forward computes what transformers' forward computes, and steps aside when it could not."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, MistralConfig

from mmspec import speculative_generate
from mmspec.cached_model import CachedModel
from mmspec.drafters import ModelDrafter
from mmspec.kernels.lean_llama import (
    LeanCausalLM,
    Rotation,
    causal_mask,
    default_rotation,
    lean_layer_supported,
    llama_layer_forward,
    plain_rotary,
    rms_norm,
)
from mmspec.testing import reload_from_disk, tiny_llama


def llama(**overrides) -> nn.Module:
    """A tiny random Llama with grouped-query attention, biases and peaked outputs (differences would show)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2, attention_bias=True,
                         mlp_bias=True, **overrides)
    return reload_from_disk(AutoModelForCausalLM.from_config(config))


def prefilled(model, length: int = 9) -> DynamicCache:
    ids = torch.arange(2, 2 + length)[None] % model.config.vocab_size
    return model(ids, use_cache=True).past_key_values


def assert_same_caches(a: DynamicCache, b: DynamicCache) -> None:
    assert a.get_seq_length() == b.get_seq_length()
    for left, right in zip(a.layers, b.layers):
        torch.testing.assert_close(left.keys, right.keys, rtol=0, atol=1e-6)
        torch.testing.assert_close(left.values, right.values, rtol=0, atol=1e-6)


@pytest.mark.parametrize("new_tokens", [1, 4])
@torch.inference_mode()
def test_lean_logits_and_cache_equal_the_models_own(new_tokens):
    model = llama()
    lean = LeanCausalLM(model)
    tokens = torch.tensor([[5, 17, 3, 40, 22][:new_tokens]])
    ours, theirs = prefilled(model), prefilled(model)
    logits = lean.forward(tokens, ours, logits_to_keep=0)
    expected = model(tokens, past_key_values=theirs, use_cache=True).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    assert_same_caches(ours, theirs)
    # logits_to_keep keeps the last positions, as transformers does
    ours.crop(-new_tokens)
    torch.testing.assert_close(lean.forward(tokens, ours, logits_to_keep=1), expected[:, -1:], rtol=0, atol=1e-5)


@torch.inference_mode()
def test_lean_tree_step_with_a_four_d_mask_and_positions_equals_the_models_own():
    model = llama()
    # three tree nodes below the committed prefix: nodes 1 and 2 are children of node 0 (2 does not see 1)
    ours, theirs = prefilled(model), prefilled(model)
    past = ours.get_seq_length()
    allowed = torch.ones(3, past + 3, dtype=torch.bool)
    allowed[:, past:] = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    positions = torch.tensor([[past, past + 1, past + 1]])
    tokens = torch.tensor([[7, 8, 9]])
    logits = LeanCausalLM(model).forward(tokens, ours, logits_to_keep=0, attention_mask=mask, position_ids=positions)
    expected = model(tokens, past_key_values=theirs, attention_mask=mask, position_ids=positions, use_cache=True).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    # control: the same nodes read causally (each sees its left neighbours) give other logits for node 2
    causal = LeanCausalLM(model).forward(tokens, prefilled(model), logits_to_keep=0, position_ids=positions)
    assert not torch.allclose(causal[0, 2], expected[0, 2], atol=1e-3)


@torch.inference_mode()
def test_layer_forward_equals_the_layer_with_and_without_a_mask():
    model = llama()
    layer, rotary = model.model.layers[0], model.model.rotary_emb
    assert lean_layer_supported(layer)
    hidden = torch.randn(1, 3, 32)
    positions = torch.arange(9, 12)[None]
    embeddings = rotary(hidden, positions)
    for length, mask in ((3, causal_mask(3, 9, hidden.dtype, hidden.device)), (1, None)):
        hidden, positions, embeddings = hidden[:, :length], positions[:, :length], tuple(e[:, :length] for e in embeddings)
        ours, theirs = prefilled(model), prefilled(model)
        out = llama_layer_forward(layer, hidden, embeddings, mask, ours)
        expected = layer(hidden, attention_mask=mask, position_ids=positions, past_key_values=theirs, use_cache=True,
                         position_embeddings=embeddings)
        torch.testing.assert_close(out, expected[0] if isinstance(expected, tuple) else expected, rtol=0, atol=1e-5)


def test_models_it_cannot_run_take_their_own_forward():
    model = llama()
    assert LeanCausalLM.supports(model)
    assert not LeanCausalLM.supports(model.train())
    model.eval()
    handle = model.model.layers[1].mlp.register_forward_hook(lambda *args: None)
    assert not LeanCausalLM.supports(model), "a hook would not be called"
    handle.remove()

    class QuantisedLinear(nn.Linear):
        pass

    odd = llama()
    odd.model.layers[0].self_attn.q_proj.__class__ = QuantisedLinear
    assert not LeanCausalLM.supports(odd)
    torch.manual_seed(0)
    mistral = AutoModelForCausalLM.from_config(MistralConfig(vocab_size=61, hidden_size=32, intermediate_size=48,
                                                             num_hidden_layers=1, num_attention_heads=4,
                                                             num_key_value_heads=2, sliding_window=8)).eval()
    assert not LeanCausalLM.supports(mistral)
    assert CachedModel(mistral, role="drafter", lean=True)._lean is None
    assert CachedModel(model, role="drafter", lean=False)._lean is None
    assert CachedModel(model, role="drafter", lean=True)._lean is not None


@torch.inference_mode()
def test_a_hook_registered_later_sends_steps_through_the_models_forward():
    model = llama()
    cached = CachedModel(model, role="drafter", lean=True)
    cached.prefill(torch.tensor([[2, 3, 4]]))
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        cached.extend(torch.tensor([[5]]), logits_to_keep=1)
    finally:
        handle.remove()
    assert calls == [1]
    cached.extend(torch.tensor([[6]]), logits_to_keep=1)
    assert calls == [1] and cached.forwards == 3


@pytest.mark.parametrize("tree", [False, True])
def test_a_lean_drafter_changes_nothing_but_its_cost(tree):
    """Greedy output equals the target's own generate; the drafter's drafts equal its transformers-forward twin's."""
    from mmspec import TreeConfig

    target, small = tiny_llama(seed=1, num_layers=3), tiny_llama(seed=2, hidden_size=32, initializer_range=0.2)
    prompt = torch.tensor([[1, 9, 4, 33, 12, 8]])
    expected = target.generate(prompt, do_sample=False, max_new_tokens=20)
    runs = {}
    for lean in (True, False):
        drafter = ModelDrafter(small, lean=lean)
        assert (drafter.lm._lean is not None) is lean
        proposals = []
        out = speculative_generate(target, drafter, prompt, max_new_tokens=20, do_sample=False, num_draft_tokens=4,
                                   tree=TreeConfig(8, 2, 3) if tree else None,
                                   on_round=lambda tokens, drafted, accepted, proposed: proposals.append(proposed.tolist()))
        assert torch.equal(out.sequences, expected)
        runs[lean] = (proposals, out.stats.drafter_forwards)
    assert runs[True] == runs[False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_rotation_and_norm_are_bitwise_transformers_own(dtype):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = llama().to(dtype)
    torch.manual_seed(3)
    positions = torch.tensor([[0, 5, 6, 7, 100]])
    hidden = torch.randn(1, 5, 32, dtype=dtype)
    embeddings = model.model.rotary_emb(hidden, positions)
    # a query laid out as the layer lays it out: [B, L, heads, D] viewed as [B, heads, L, D]
    query, key = (torch.randn(1, 5, heads, 8, dtype=dtype).transpose(1, 2) * 30 for heads in (4, 2))
    rotation = Rotation.of(embeddings)
    expected = apply_rotary_pos_emb(query, key, *embeddings)
    assert torch.equal(rotation.rotate(query), expected[0]) and torch.equal(rotation.rotate(key), expected[1])
    norm = model.model.layers[0].input_layernorm
    norm.weight.normal_()
    assert torch.equal(rms_norm(norm, hidden * 7), norm(hidden * 7))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_default_rotation_is_bitwise_the_rotary_modules(dtype):
    model = llama().to(dtype)
    rotary = model.model.rotary_emb
    assert plain_rotary(rotary)
    probe = torch.zeros(1, dtype=dtype)
    for start, length in ((0, 1), (9, 6), (120, 3), (37, 64)):
        positions = torch.arange(start, start + length)
        expected = Rotation.of(rotary(probe, positions[None]))
        ours = default_rotation(rotary, positions.float(), dtype)
        assert torch.equal(ours.cos, expected.cos) and torch.equal(ours.signed_sin, expected.signed_sin)
    rows = torch.tensor([[3, 4, 4, 5], [10, 11, 12, 12]])  # a batch's or a tree's own positions
    expected = Rotation.of(rotary(probe, rows))
    ours = default_rotation(rotary, rows, dtype)
    assert torch.equal(ours.cos, expected.cos) and torch.equal(ours.signed_sin, expected.signed_sin)
    scaled = llama(rope_scaling={"rope_type": "linear", "factor": 2.0}).model.rotary_emb
    assert not plain_rotary(scaled), "other kinds run the module's own forward"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_mask_blocks_exactly_the_later_keys(dtype):
    assert causal_mask(1, 5, dtype, torch.device("cpu")) is None
    for queries, past in ((2, 0), (6, 9), (3, 40)):
        mask = causal_mask(queries, past, dtype, torch.device("cpu"))
        seen = torch.arange(past + queries)[None] <= torch.arange(queries)[:, None] + past
        expected = torch.zeros(queries, past + queries, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)
        assert mask.shape == (1, 1, queries, past + queries) and torch.equal(mask[0, 0], expected)
