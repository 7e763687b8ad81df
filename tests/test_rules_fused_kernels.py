"""The chain rules' fused path: on CUDA tensors `greedy_match` and `speculative_sampling` verify in one Triton
kernel (`mmspec.kernels.rejection`). Forced on CPU tensors here through Triton's interpreter, it must decide as
the torch path does: the same accepted counts, the same greedy tokens, sampled tokens from the same distribution.
The sampled kernel is opt-in (`rules.FUSED_CHAIN_KERNELS = True`): it draws the appended token with other random
numbers, and a seed must give the same tokens on every device."""

import pytest
import torch

from mmspec import rules, speculative_generate
from mmspec.kernels import rejection
from mmspec.kernels.triton_launch import interpreting
from mmspec.sampling import SamplingConfig
from mmspec.types import Proposal

interpreter = pytest.mark.skipif(not interpreting(), reason="needs Triton's CPU interpreter (TRITON_INTERPRET=1 before "
                                                            "Triton's first import; tests/conftest.py sets it)")


def case(seed, batch, k, vocab, ragged):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, k + 1, vocab, generator=g) * 2
    q = (torch.randn(batch, k, vocab, generator=g) * 2).softmax(-1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    # Make some drafts the target's argmax so greedy rounds accept a few.
    choice = logits.argmax(-1)[:, :k]
    agree = torch.rand(batch, k, generator=g) < 0.6
    greedy_drafts = torch.where(agree, choice, drafts)
    lengths = torch.randint(0, k + 1, (batch,), generator=g) if ragged else None
    return logits, q, drafts, greedy_drafts, lengths


def both_paths(monkeypatch, rule, *args):
    monkeypatch.setattr(rules, "FUSED_CHAIN_KERNELS", False)
    plain = rule(*args[:-1], torch.Generator().manual_seed(5) if args[-1] else None)
    monkeypatch.setattr(rules, "FUSED_CHAIN_KERNELS", True)
    fused = rule(*args[:-1], torch.Generator().manual_seed(5) if args[-1] else None)
    return plain, fused


@interpreter
@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_greedy_fused_decides_like_torch(monkeypatch, seed, ragged):
    logits, _, _, drafts, lengths = case(seed, batch=4, k=5, vocab=37, ragged=ragged)
    proposal = Proposal(tokens=drafts, lengths=lengths)
    plain, fused = both_paths(monkeypatch, rules.greedy_match, proposal, logits, SamplingConfig(), False)
    assert torch.equal(plain.num_accepted, fused.num_accepted) and torch.equal(plain.next_token, fused.next_token)
    assert int(plain.num_accepted.sum()) > 0


@interpreter
@pytest.mark.parametrize("with_q", [False, True])
@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_sampled_fused_decides_like_torch(monkeypatch, seed, ragged, with_q):
    logits, q, drafts, _, lengths = case(seed, batch=4, k=4, vocab=23, ragged=ragged)
    proposal = Proposal(tokens=drafts, probs=q if with_q else None, lengths=lengths)
    sampling = SamplingConfig(do_sample=True)
    plain, fused = both_paths(monkeypatch, rules.speculative_sampling, proposal, logits, sampling, True)
    # The same uniforms come first on both paths: the same drafts are accepted.
    assert torch.equal(plain.num_accepted, fused.num_accepted)
    # The appended token is a draw from the same distribution: one the torch path's weights allow.
    g = torch.Generator().manual_seed(5)
    uniforms = torch.rand(4, 4, generator=g)
    _, weights = rejection.sampled_chain_decide_reference(
        drafts, rules.probabilities(logits, sampling), q if with_q else None, uniforms, lengths=lengths)
    rows = torch.arange(4)
    assert bool((weights[rows, fused.next_token] > 0).all())


@interpreter
def test_fused_greedy_decoding_equals_generate(monkeypatch, target, small_drafter, prompt):
    monkeypatch.setattr(rules, "FUSED_CHAIN_KERNELS", True)
    calls = []
    real = rejection.greedy_chain_verify
    monkeypatch.setattr(rejection, "greedy_chain_verify", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    expected = target.generate(prompt, do_sample=False, max_new_tokens=16)
    out = speculative_generate(target, small_drafter, prompt, max_new_tokens=16, do_sample=False, num_draft_tokens=3)
    assert torch.equal(out.sequences, expected) and calls


def test_sampling_keeps_torch_unless_asked(monkeypatch):
    """By default only greedy matching takes the kernel: sampled tokens stay those a seed gives on every device."""
    from mmspec.kernels import triton_launch

    monkeypatch.setattr(triton_launch, "runs_triton", lambda like, requested: requested is None or bool(requested))

    def refuse(*args, **kwargs):
        raise AssertionError("the sampled kernel ran without being asked")

    monkeypatch.setattr(rejection, "sampled_chain_verify", refuse)
    logits, q, drafts, _, _ = case(1, batch=2, k=3, vocab=11, ragged=False)
    rules.speculative_sampling(Proposal(tokens=drafts, probs=q), logits, SamplingConfig(do_sample=True),
                               torch.Generator().manual_seed(0))


def test_cpu_tensors_keep_the_torch_path(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the fused kernel ran on CPU tensors")

    monkeypatch.setattr(rejection, "greedy_chain_verify", refuse)
    monkeypatch.setattr(rejection, "sampled_chain_verify", refuse)
    logits, q, drafts, greedy_drafts, _ = case(0, batch=2, k=3, vocab=11, ragged=False)
    rules.greedy_match(Proposal(tokens=greedy_drafts), logits)
    rules.speculative_sampling(Proposal(tokens=drafts, probs=q), logits, SamplingConfig(do_sample=True),
                               torch.Generator().manual_seed(0))
