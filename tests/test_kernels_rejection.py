"""Fused chain verification (mmspec.kernels.rejection): the Triton kernels equal their torch references bit
for bit (Triton's CPU interpreter), the references equal the core's and the image rules' decisions on the
same uniforms, and the sampled rule's output law is the target's (chi-square, with a failing control)."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from mmspec import rules
from mmspec.errors import MMSpecError
from mmspec.image_ar import rules as image_rules
from mmspec.kernels import rejection as R
from mmspec.kernels.triton_launch import interpreting, race_scores, runs_triton
from mmspec.sampling import SamplingConfig
from mmspec.testing import chi_square
from mmspec.types import Proposal

interpreter = pytest.mark.skipif(not interpreting(), reason="Triton's CPU interpreter is not loaded (TRITON_INTERPRET=1 "
                                                            "before Triton's first import; tests/conftest.py sets it without CUDA)")


def chain_case(seed: int, batch: int, k: int, vocab: int, *, ragged: bool = True, sharp: float = 2.0) -> dict:
    """Random p [B, k+1, V], q [B, k, V], drafts drawn from q, ragged lengths (0 and k included), noise."""
    g = torch.Generator().manual_seed(seed)
    p = (torch.randn(batch, k + 1, vocab, generator=g) * sharp).softmax(-1)
    q = (torch.randn(batch, k, vocab, generator=g) * sharp).softmax(-1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    lengths = torch.randint(0, k + 1, (batch,), generator=g) if ragged else None
    if ragged:
        lengths[0], lengths[-1] = k, 0
    return {"drafts": drafts, "p": p, "q": q, "lengths": lengths, "uniforms": torch.rand(batch, k, generator=g),
            "noise": torch.empty(batch, vocab).exponential_(generator=g)}


def assert_same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y), (a, b)


def greedy_drafts(choice: torch.Tensor, seed: int) -> torch.Tensor:
    """Drafts [B, k] from the target's choices [B, k+1]: row 0 all right, row 1 all wrong, others right up to a
    random slot."""
    batch, k = choice.shape[0], choice.shape[1] - 1
    vocab = int(choice.max()) + 2
    g = torch.Generator().manual_seed(seed)
    drafts = choice[:, :k].clone()
    wrong = (drafts + 1) % vocab
    cut = torch.randint(0, k + 1, (batch,), generator=g)
    cut[0], cut[1] = k, 0
    return torch.where(torch.arange(k)[None] >= cut[:, None], wrong, drafts)


# --------------------------------------------------------------------------- kernels == references


@interpreter
@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_kernel_equals_reference(k):
    g = torch.Generator().manual_seed(k)
    logits = torch.randn(5, k + 1, 23, generator=g)
    drafts = greedy_drafts(logits.argmax(-1), seed=k)
    lengths = torch.tensor([k, k, max(k - 1, 0), 0, k])
    for target in (logits, logits.argmax(-1), logits.to(torch.bfloat16).round()):  # the last has ties
        for row_lengths in (lengths, None):
            expected = R.greedy_chain_reference(drafts, target, row_lengths)
            assert_same(R.greedy_chain_verify(drafts, target, row_lengths, use_triton=True), expected)
    all_in = R.greedy_chain_verify(drafts[:1], logits[:1], use_triton=True)
    assert all_in[0].item() == k and all_in[1].item() == logits[0, k].argmax().item()  # every draft, then the bonus
    none_in = R.greedy_chain_verify(drafts[1:2], logits[1:2], use_triton=True)
    assert none_in[0].item() == 0 and none_in[1].item() == logits[1, 0].argmax().item()


@interpreter
def test_greedy_kernel_over_several_vocabulary_tiles_keeps_the_first_maximum():
    logits = torch.zeros(2, 4, 5000)
    logits[:, :, 4500] = 1.0
    logits[0, :, 7] = 1.0  # a tie across tiles: torch.argmax takes the first index
    drafts = torch.tensor([[7, 7, 3], [4500, 4500, 4500]])
    expected = R.greedy_chain_reference(drafts, logits)
    assert expected[0].tolist() == [2, 3] and expected[1].tolist() == [7, 4500]
    assert_same(R.greedy_chain_verify(drafts, logits, use_triton=True), expected)


@interpreter
@pytest.mark.parametrize("k", range(1, 9))
def test_sampled_kernel_equals_reference(k):
    case = chain_case(k, batch=6, k=k, vocab=19)
    for q in (case["q"], None):
        for lengths in (case["lengths"], None):
            args = (case["drafts"], case["p"], q)
            expected = R.sampled_chain_reference(*args, case["uniforms"], case["noise"], lengths=lengths)
            got = R.sampled_chain_verify(*args, lengths=lengths, uniforms=case["uniforms"], exponentials=case["noise"],
                                         use_triton=True)
            assert_same(got, expected)


@interpreter
def test_sampled_kernel_with_relaxed_inputs_equals_reference():
    case = chain_case(3, batch=8, k=4, vocab=17)
    g = torch.Generator().manual_seed(5)
    accept_target = torch.rand(8, 4, generator=g) * 0.5
    accept_draft = torch.rand(8, 4, generator=g)
    excluded = torch.rand(8, 4, 17, generator=g) < 0.3
    excluded[0] = case["p"][0, :4] > 0  # row 0: every token excluded, so the draw falls back to p itself
    excluded[1] = (case["p"][1, :4] - case["q"][1]) > 0  # row 1: the residual loses all its mass: p without them
    for q in (case["q"], None):
        for options in ({"accept_target": accept_target}, {"accept_draft": accept_draft},
                        {"accept_target": accept_target, "accept_draft": accept_draft, "residual_excluded": excluded},
                        {"residual_excluded": excluded}):
            expected = R.sampled_chain_reference(case["drafts"], case["p"], q, case["uniforms"], case["noise"],
                                                 lengths=case["lengths"], **options)
            got = R.sampled_chain_verify(case["drafts"], case["p"], q, lengths=case["lengths"], uniforms=case["uniforms"],
                                         exponentials=case["noise"], use_triton=True, **options)
            assert_same(got, expected)


@interpreter
def test_sampled_kernel_edge_cases():
    case = chain_case(7, batch=4, k=5, vocab=5000, ragged=False)  # two vocabulary tiles
    p, drafts = case["p"], case["drafts"]
    q_equal = p[:, :5].clone()
    every = (drafts, p, q_equal)  # q = p: u * p(x) < p(x) for every u < 1, so all drafts are accepted
    expected = R.sampled_chain_reference(*every, case["uniforms"], case["noise"])
    assert expected[0].tolist() == [5] * 4
    assert_same(R.sampled_chain_verify(*every, uniforms=case["uniforms"], exponentials=case["noise"], use_triton=True),
                expected)
    p_zero = p.clone()
    p_zero[:, :5].scatter_(-1, drafts[..., None], 0.0)  # the target never says a drafted token: none accepted
    for q in (case["q"], None):
        expected = R.sampled_chain_reference(drafts, p_zero, q, case["uniforms"], case["noise"])
        assert expected[0].tolist() == [0] * 4
        assert_same(R.sampled_chain_verify(drafts, p_zero, q, uniforms=case["uniforms"], exponentials=case["noise"],
                                           use_triton=True), expected)
    # rejected by a relaxed input while q == p: the residual has no mass and the token is drawn from p
    reject = {"accept_target": torch.zeros(4, 5)}
    expected = R.sampled_chain_reference(*every, case["uniforms"], case["noise"], **reject)
    assert expected[0].tolist() == [0] * 4
    assert expected[1].tolist() == race_scores(p[:, 0], case["noise"]).argmax(-1).tolist()
    assert_same(R.sampled_chain_verify(*every, uniforms=case["uniforms"], exponentials=case["noise"], use_triton=True,
                                       **reject), expected)


@interpreter
def test_kernels_take_no_drafts_and_empty_batches():
    p = torch.rand(3, 1, 11).softmax(-1)
    drafts = torch.empty(3, 0, dtype=torch.long)
    noise = torch.ones(3, 11)
    expected = R.sampled_chain_reference(drafts, p, None, torch.empty(3, 0), noise)
    assert_same(R.sampled_chain_verify(drafts, p, uniforms=torch.empty(3, 0), exponentials=noise, use_triton=True),
                expected)
    assert_same(R.greedy_chain_verify(drafts, p, use_triton=True), R.greedy_chain_reference(drafts, p))
    nothing = R.greedy_chain_verify(torch.empty(0, 2, dtype=torch.long), torch.empty(0, 3, 5), use_triton=True)
    assert nothing[0].shape == (0,)


def test_seeded_calls_repeat_and_draw_uniforms_then_noise():
    case = chain_case(2, batch=5, k=3, vocab=13)
    args = (case["drafts"], case["p"], case["q"])
    first = R.sampled_chain_verify(*args, generator=torch.Generator().manual_seed(9))
    assert_same(R.sampled_chain_verify(*args, generator=torch.Generator().manual_seed(9)), first)
    g = torch.Generator().manual_seed(9)
    uniforms = torch.rand(5, 3, generator=g)
    noise = torch.empty(5, 13).exponential_(generator=g)
    assert_same(R.sampled_chain_reference(*args, uniforms, noise), first)


def test_dispatchers_use_the_references_on_cpu_unless_asked():
    assert not runs_triton(torch.zeros(1), None)
    assert not runs_triton(torch.zeros(1), False)


def test_bad_shapes_are_one_clear_error():
    p = torch.rand(2, 4, 7)
    with pytest.raises(MMSpecError, match="target_probs must be"):
        R.sampled_chain_verify(torch.zeros(2, 4, dtype=torch.long), p)
    with pytest.raises(MMSpecError, match="draft_probs must be"):
        R.sampled_chain_verify(torch.zeros(2, 3, dtype=torch.long), p, torch.rand(2, 3, 6))
    with pytest.raises(MMSpecError, match="lengths must be"):
        R.greedy_chain_verify(torch.zeros(2, 3, dtype=torch.long), p, torch.tensor([1, 2, 3]))
    with pytest.raises(MMSpecError, match="draft_tokens must be"):
        R.greedy_chain_verify(torch.zeros(2, 3), p)


def test_kernels_compile_for_cuda_without_a_gpu():
    """The compiled (not interpreted) kernels build for sm_90: their types and control flow are valid Triton."""
    pytest.importorskip("triton.backends.nvidia")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "tests.triton_compile", "rejection"], check=False, capture_output=True,
                         text=True, env=env, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(": ok") == 4


# --------------------------------------------------------------------------- references == the core's rules


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_reference_equals_core_rule(k):
    g = torch.Generator().manual_seed(k)
    logits = torch.randn(6, k + 1, 29, generator=g)
    drafts = greedy_drafts(logits.argmax(-1), seed=k)
    lengths = torch.randint(0, k + 1, (6,), generator=g)
    for row_lengths in (lengths, None):
        verdict = rules.greedy_match(Proposal(tokens=drafts, lengths=row_lengths), logits)
        assert_same(R.greedy_chain_reference(drafts, logits, row_lengths), (verdict.num_accepted, verdict.next_token))


@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("ragged", [True, False])
def test_sampled_reference_equals_core_rule(monkeypatch, with_q, ragged):
    """Same uniforms (the core draws B x k of them first from its generator): same accepted counts, the same
    distribution for the next token, and the same token when that distribution is raced against the same noise."""
    case = chain_case(11, batch=64, k=4, vocab=9, ragged=ragged)
    logits = case["p"].log()
    sampling = SamplingConfig(do_sample=True)
    p = rules.probabilities(logits, sampling)
    q = case["q"] if with_q else None
    drawn_from = []

    def race(probs, generator):  # the core's draw, replaced by an exponential race on the test's noise
        drawn_from.append(probs)
        return race_scores(probs, case["noise"]).argmax(-1)

    monkeypatch.setattr(rules, "sample", race)
    generator = torch.Generator().manual_seed(4)
    uniforms = torch.rand((64, 4), generator=torch.Generator().manual_seed(4))
    verdict = rules.speculative_sampling(Proposal(case["drafts"], q, case["lengths"]), logits, sampling, generator)
    num, weights = R.sampled_chain_decide_reference(case["drafts"], p, q, uniforms, lengths=case["lengths"])
    assert torch.equal(num, verdict.num_accepted)
    assert 0 < int(num.sum()) < int(case["lengths"].sum() if ragged else 64 * 4)  # both outcomes occur
    torch.testing.assert_close(weights / weights.sum(-1, keepdim=True), drawn_from[0])
    assert torch.equal(race_scores(weights, case["noise"]).argmax(-1), verdict.next_token)


def lantern_inputs(drafts, p, neighbours, delta):
    p_tilde, num_merged, ids = image_rules.lantern_merged(drafts, p, neighbours, delta=delta)
    merged = torch.arange(ids.shape[-1]) < num_merged[..., None]
    excluded = torch.zeros(*drafts.shape, p.shape[-1], dtype=torch.bool).scatter_(-1, ids, merged)
    return {"accept_target": p_tilde, "residual_excluded": excluded}


@pytest.mark.parametrize("delta", [0.0, 0.05, 0.3])
@pytest.mark.parametrize("with_q", [True, False])
def test_relaxed_inputs_reproduce_lantern(delta, with_q):
    """LANTERN as inputs: p~(x) as the acceptance's target mass, the merged neighbours excluded from the residual."""
    case = chain_case(13, batch=48, k=3, vocab=12, ragged=False, sharp=1.0)
    codebook = torch.randn(12, 4, generator=torch.Generator().manual_seed(1))
    neighbours = image_rules.lantern_neighbours(codebook, k=5)
    q = case["q"] if with_q else None
    decision = image_rules.lantern_decide(case["drafts"], q, case["p"], case["uniforms"], neighbours=neighbours, delta=delta)
    num, weights = R.sampled_chain_decide_reference(case["drafts"], case["p"], q, case["uniforms"],
                                                    **lantern_inputs(case["drafts"], case["p"], neighbours, delta))
    assert torch.equal(num, decision.num_accepted)
    torch.testing.assert_close(weights / weights.sum(-1, keepdim=True), decision.next_probs / decision.next_probs.sum(-1, keepdim=True))


@pytest.mark.parametrize("window,threshold", [(2, 0.3), (3, None), (0, 0.3)])
def test_relaxed_inputs_reproduce_gsd(window, threshold):
    """GSD as inputs: the group's target and draft masses in the acceptance test, the plain residual."""
    case = chain_case(17, batch=48, k=3, vocab=12, ragged=False, sharp=1.0)
    options = {"window": window, "prob_threshold": threshold, "embeddings": None}
    decision = image_rules.gsd_decide(case["drafts"], case["q"], case["p"], case["uniforms"], **options)
    group = image_rules.gsd_group_mask(case["drafts"], case["p"], **options)
    num, weights = R.sampled_chain_decide_reference(
        case["drafts"], case["p"], case["q"], case["uniforms"],
        accept_target=(case["p"][:, :3] * group).sum(-1), accept_draft=(case["q"] * group).sum(-1))
    assert torch.equal(num, decision.num_accepted)
    torch.testing.assert_close(weights / weights.sum(-1, keepdim=True), decision.next_probs)


# --------------------------------------------------------------------------- the output law


def committed_tokens(drafts: torch.Tensor, num: torch.Tensor, next_token: torch.Tensor, slot: int) -> torch.Tensor:
    """The token each row commits at `slot` (rows that committed fewer tokens are dropped)."""
    reached = num >= slot
    token = torch.where(num > slot, drafts[:, min(slot, drafts.shape[1] - 1)], next_token)
    return token[reached]


def law_draws(rows: int, *, with_q: bool, **options) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(21)
    vocab, k = 6, 2
    p = (torch.randn(k + 1, vocab, generator=g) * 1.5).softmax(-1)
    q = (torch.randn(k, vocab, generator=g) * 1.5).softmax(-1)
    if with_q:
        drafts = torch.stack([torch.multinomial(q[i], rows, replacement=True, generator=g) for i in range(k)], 1)
    else:  # a deterministic drafter always proposing the target's likeliest tokens
        drafts = p[:k].argmax(-1)[None].expand(rows, k)
    num, next_token = R.sampled_chain_verify(drafts, p.expand(rows, -1, -1), q.expand(rows, -1, -1) if with_q else None,
                                             generator=g, **options)
    return p, drafts, committed_tokens(drafts, num, next_token, 0), committed_tokens(drafts, num, next_token, 1)


def p_value(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    return chi_square(Counter(tokens.tolist()), dict(enumerate(probs.tolist()))).p_value


@pytest.mark.parametrize("with_q", [True, False])
def test_sampled_output_law_is_the_target(with_q):
    """The first committed token follows p_0, and the second (where the first draft was accepted) p_1."""
    p, _, first, second = law_draws(40_000, with_q=with_q)
    assert p_value(first, p[0]) > 1e-3
    assert len(second) > 5_000 and p_value(second, p[1]) > 1e-3


def test_control_accepting_every_draft_fails_the_law_test():
    p, drafts, first, _ = law_draws(40_000, with_q=True, accept_target=torch.ones(40_000, 2),
                                    accept_draft=torch.zeros(40_000, 2))
    assert torch.equal(first, drafts[:, 0])  # every draft accepted: the first token follows q, not p
    assert p_value(first, p[0]) < 1e-6
