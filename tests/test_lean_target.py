"""A plain Llama target verifies chains through the lean forward only where that is bitwise its own forward."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from mmspec import speculative_generate
from mmspec.bench.text import inert_layer_pair
from mmspec.cached_model import cache_argument, output_cache
from mmspec.kernels.lean_llama import LeanCausalLM
from mmspec.targets import Target
from mmspec.testing import reload_from_disk


def llama(kv_heads: int = 4, bias: bool = False, layers: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=kv_heads, max_position_embeddings=256, initializer_range=0.2,
                         attention_bias=bias, mlp_bias=bias, eos_token_id=None)
    return reload_from_disk(AutoModelForCausalLM.from_config(config))


@pytest.fixture
def lean_steps(monkeypatch):
    steps: list[int] = []  # tokens fed by each lean forward (logits or, for the certified head, hidden states)
    hidden_states = LeanCausalLM.hidden_states

    def counted(self, tokens, *args, **kwargs):
        steps.append(tokens.shape[1])
        return hidden_states(self, tokens, *args, **kwargs)

    monkeypatch.setattr(LeanCausalLM, "hidden_states", counted)
    return steps


@pytest.mark.parametrize(("kv_heads", "bias"), [(4, False), (2, True)])
@pytest.mark.parametrize("past", [3, 40])
@torch.inference_mode()
def test_chain_scores_are_bitwise_the_models_own(kv_heads, bias, past, lean_steps):
    model = llama(kv_heads, bias)
    prompt = torch.arange(1, past + 1)[None] % 97
    target = Target(model)
    target.start(prompt)
    reference_cache = output_cache(model(prompt, use_cache=True))
    for tokens in (torch.tensor([[5]]), torch.tensor([[7, 11, 13, 2, 90, 41]]), torch.tensor([[3, 4]])):
        step = target.verify(tokens[:, :1], tokens[:, 1:])
        expected = model(tokens, **{cache_argument(model): reference_cache}, use_cache=True, logits_to_keep=0).logits
        assert torch.equal(step.logits, expected)
    assert lean_steps == [1, 6, 2]
    for ours, theirs in zip(target.cache.layers, reference_cache.layers):
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)


@pytest.mark.parametrize("certified_head", [True, False])
def test_greedy_with_a_lean_target_equals_generate(certified_head, lean_steps, monkeypatch):
    # With the certified head (the tests' default for every size), the target's lean forward stops at the hidden state.
    if not certified_head:
        monkeypatch.setattr(Target, "certified_head_min_size", 1 << 22)
    target, drafter = inert_layer_pair(llama(layers=3, seed=1), drafter_layers=1)
    _, other_drafter = inert_layer_pair(llama(layers=3, seed=2), drafter_layers=1)  # disagrees: rejections and rollbacks
    prompt = torch.tensor([[1, 17, 5, 44, 9, 61, 23, 8]])
    with torch.no_grad():
        expected = target.generate(prompt, do_sample=False, max_new_tokens=40)
    for pair_drafter in (drafter, other_drafter):
        out = speculative_generate(target, pair_drafter, prompt, max_new_tokens=40, num_draft_tokens=4)
        assert torch.equal(out.sequences, expected)
    assert 5 in lean_steps  # the target verified its newest token and 4 drafts through the lean forward


@torch.inference_mode()
def test_lean_hidden_states_are_bitwise_the_base_models(lean_steps):
    model = llama(2, True)
    prompt = torch.arange(1, 30)[None]
    target = Target(model)
    target.prefill(prompt, head=False)
    reference_cache = output_cache(model(prompt, use_cache=True))
    tokens = torch.tensor([[7, 11, 13, 2, 90]])
    ours = target.extend(tokens, head=False).last_hidden_state
    expected = model.model(tokens, **{cache_argument(model): reference_cache}, use_cache=True).last_hidden_state
    assert torch.equal(ours, expected) and lean_steps == [5]


@torch.inference_mode()
def test_the_models_own_forward_where_lean_is_not_proven_or_not_wanted(lean_steps):
    prompt = torch.tensor([[1, 17, 5, 44, 9]])
    tokens = torch.tensor([[7, 11, 13]])

    hooked = llama()
    calls: list[int] = []
    handle = hooked.register_forward_hook(lambda *args: calls.append(1))
    target = Target(hooked)
    target.start(prompt)
    target.verify(tokens[:, :1], tokens[:, 1:])
    handle.remove()
    assert calls == [1, 1] and not lean_steps  # the user's hook saw the prefill and the verification

    wrapped = llama()
    own_forward = wrapped.forward
    wrapped.forward = lambda *args, **kwargs: calls.append(2) or own_forward(*args, **kwargs)
    target = Target(wrapped)
    target.start(prompt)
    target.verify(tokens[:, :1], tokens[:, 1:])
    assert calls.count(2) == 2 and not lean_steps  # a forward replaced on the instance is called

    half = llama().to(torch.bfloat16)
    target = Target(half)
    target.start(prompt)
    target.verify(tokens[:, :1], tokens[:, 1:])
    assert not lean_steps  # bfloat16: bitwise equality not established, transformers' forward

    target = Target(llama(), output_hidden_states=True)
    target.start(prompt)
    assert target.verify(tokens[:, :1], tokens[:, 1:]).hidden_states is not None and not lean_steps
