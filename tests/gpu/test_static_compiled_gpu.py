"""The static-shape compiled path (`compile=True`) on CUDA: CUDA graphs ("reduce-overhead") over static caches,
greedy output equal to `generate`, graphs reused from call to call; the chain rules' fused kernels on CUDA logits."""

import pytest
import torch

from mmspec import rules, speculative_generate
from mmspec.kernels import rejection
from mmspec.sampling import SamplingConfig
from mmspec.testing import tiny_llama
from mmspec.types import Proposal

from ..test_generation_fidelity import PROMPT

CUDA = torch.device("cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_greedy_equals_generate_on_cuda(dtype):
    import torch._dynamo

    target = tiny_llama(seed=0, initializer_range=0.3).to(CUDA, dtype)
    drafter = tiny_llama(seed=1, num_layers=1, hidden_size=32, initializer_range=0.3).to(CUDA, dtype)
    prompt = PROMPT.to(CUDA)
    expected = target.generate(prompt, do_sample=False, max_new_tokens=40)
    for draft_model in (drafter, target):
        out = speculative_generate(target, draft_model, prompt, max_new_tokens=40, do_sample=False, num_draft_tokens=4,
                                   compile=True)
        assert torch.equal(out.sequences, expected)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    out = speculative_generate(target, drafter, prompt, max_new_tokens=40, do_sample=False, num_draft_tokens=4,
                               compile=True)
    assert torch.equal(out.sequences, expected)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs  # the same graphs, no recompile


def test_compiled_sampling_repeats_with_a_seed_on_cuda():
    target = tiny_llama(seed=0, initializer_range=0.3).to(CUDA)
    drafter = tiny_llama(seed=1, num_layers=1, hidden_size=32, initializer_range=0.3).to(CUDA)
    runs = [speculative_generate(target, drafter, PROMPT.to(CUDA), max_new_tokens=30, do_sample=True, compile=True,
                                 generator=torch.Generator().manual_seed(3)).sequences for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


def test_rules_take_the_fused_kernel_on_cuda(monkeypatch):
    calls = []
    real = rejection.greedy_chain_verify
    monkeypatch.setattr(rejection, "greedy_chain_verify", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 32000, generator=g)
    drafts = torch.where(torch.rand(4, 5, generator=g) < 0.7, logits.argmax(-1)[:, :5], torch.randint(0, 32000, (4, 5), generator=g))
    on_cpu = rules.greedy_match(Proposal(tokens=drafts), logits)
    on_cuda = rules.greedy_match(Proposal(tokens=drafts.to(CUDA)), logits.to(CUDA))
    assert calls and torch.equal(on_cpu.num_accepted, on_cuda.num_accepted.cpu())
    assert torch.equal(on_cpu.next_token, on_cuda.next_token.cpu())
    monkeypatch.setattr(rules, "FUSED_CHAIN_KERNELS", True)  # sampled: opt-in (another draw of the appended token)
    sampled = rules.speculative_sampling(Proposal(tokens=drafts.to(CUDA)), logits.to(CUDA), SamplingConfig(do_sample=True),
                                         torch.Generator().manual_seed(1))
    reference = rules.speculative_sampling(Proposal(tokens=drafts), logits, SamplingConfig(do_sample=True),
                                           torch.Generator().manual_seed(1))
    assert torch.equal(sampled.num_accepted.cpu(), reference.num_accepted)  # the same uniforms decide


def test_compiled_tree_greedy_equals_generate_on_cuda():
    """Draft trees verified at a fixed width under CUDA graphs, the accepted path moved in the static cache."""
    from mmspec import TreeConfig

    target = tiny_llama(seed=0, initializer_range=0.3).to(CUDA)
    drafter = tiny_llama(seed=1, num_layers=1, hidden_size=32, initializer_range=0.3).to(CUDA)
    prompt = PROMPT.to(CUDA)
    expected = target.generate(prompt, do_sample=False, max_new_tokens=40)
    tree = TreeConfig(num_nodes=12, top_k=3, depth=4)
    for draft_model in (drafter, target):
        eager = speculative_generate(target, draft_model, prompt, max_new_tokens=40, do_sample=False, tree=tree)
        out = speculative_generate(target, draft_model, prompt, max_new_tokens=40, do_sample=False, tree=tree,
                                   compile=True)
        assert torch.equal(out.sequences, expected[:, :out.sequences.shape[1]])
        assert torch.equal(out.sequences, eager.sequences) and out.stats.accepted == eager.stats.accepted
