"""Tree verification (mmspec.kernels.tree_verify): the Triton kernels equal their torch references bit for bit
(Triton's CPU interpreter), the references equal the core's tree rules (mmspec.tree_rules) on the same
uniforms, and the sampled rule's output law is the target's (chi-square, with a failing control)."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from mmspec import tree_rules
from mmspec.errors import MMSpecError
from mmspec.kernels import tree_verify as T
from mmspec.kernels.triton_launch import interpreting, race_scores
from mmspec.sampling import SamplingConfig
from mmspec.testing import chi_square
from mmspec.trees import DraftTree

interpreter = pytest.mark.skipif(not interpreting(), reason="Triton's CPU interpreter is not loaded (TRITON_INTERPRET=1 "
                                                            "before Triton's first import; tests/conftest.py sets it without CUDA)")


def random_trees(seed: int, batch: int, size: int, vocab: int, sharp: float = 2.0) -> dict:
    """Random trees (every parent before its child), target rows, draft rows, ragged node counts, noise.
    About half the nodes carry the target's argmax after their parent, so greedy paths go deep."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.stack([torch.tensor([int(torch.randint(-1, i, (1,), generator=g)) if i else -1 for i in range(size)])
                           for _ in range(batch)])
    logits = torch.randn(batch, size + 1, vocab, generator=g) * sharp
    tokens = torch.randint(0, vocab, (batch, size), generator=g)
    wanted = logits.argmax(-1).gather(1, parents + 1)
    tokens = torch.where(torch.rand(batch, size, generator=g) < 0.5, wanted, tokens)
    counts = torch.randint(0, size + 1, (batch,), generator=g)
    counts[0] = size
    return {"tokens": tokens, "parents": parents, "counts": counts, "logits": logits, "p": logits.softmax(-1),
            "q": (torch.randn(batch, size, vocab, generator=g) * sharp).softmax(-1),
            "uniforms": torch.rand(batch, size, generator=g), "noise": torch.empty(batch, vocab).exponential_(generator=g)}


def assert_same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y), (a, b)


# --------------------------------------------------------------------------- kernels == references


@interpreter
@pytest.mark.parametrize("size", [1, 4, 9, 20])
def test_greedy_kernel_equals_reference(size):
    case = random_trees(size, batch=5, size=size, vocab=23)
    for target in (case["logits"], case["logits"].argmax(-1), case["logits"].to(torch.bfloat16).round()):
        for counts in (case["counts"], None):
            expected = T.greedy_tree_reference(case["tokens"], case["parents"], target, counts)
            assert_same(T.greedy_tree_verify(case["tokens"], case["parents"], target, counts, use_triton=True), expected)


@interpreter
def test_greedy_kernel_edge_cases():
    # a chain the target agrees with all along (all accepted), a tree it rejects at the root (none accepted), and
    # twin siblings with the same token (the eldest is followed), over two vocabulary tiles
    logits = torch.zeros(3, 5, 5000)
    choice = torch.tensor([[11, 4500, 12, 13, 14], [20, 21, 22, 23, 24], [30, 31, 32, 33, 34]])
    logits.scatter_(-1, choice[..., None], 1.0)
    tokens = torch.tensor([[11, 4500, 12, 13], [1, 2, 3, 4], [30, 30, 31, 31]])
    parents = torch.tensor([[-1, 0, 1, 2], [-1, -1, 0, 1], [-1, -1, 0, 1]])
    expected = T.greedy_tree_reference(tokens, parents, logits)
    assert expected[0].tolist() == [[0, 1, 2, 3], [-1] * 4, [0, 2, -1, -1]]
    assert expected[1].tolist() == [4, 0, 2] and expected[2].tolist() == [14, 20, 33]
    assert_same(T.greedy_tree_verify(tokens, parents, logits, use_triton=True), expected)


@interpreter
@pytest.mark.parametrize("size", [1, 5, 12])
def test_sampled_kernel_equals_reference(size):
    case = random_trees(100 + size, batch=6, size=size, vocab=19, sharp=1.0)
    for q in (case["q"], None):
        for counts in (case["counts"], None):
            args = (case["tokens"], case["parents"], case["p"], q)
            expected = T.sampled_tree_reference(*args, case["uniforms"], case["noise"], counts)
            got = T.sampled_tree_verify(*args, counts, uniforms=case["uniforms"], exponentials=case["noise"],
                                        use_triton=True)
            assert_same(got, expected)


@interpreter
def test_sampled_kernel_edge_cases():
    case = random_trees(7, batch=3, size=6, vocab=5000, sharp=1.0)  # two vocabulary tiles
    p = case["p"].clone()
    p[:, 0] = 0.0
    p[:, 0, 4999] = 1.0  # the target's only token after the root is the eldest root child's: always accepted
    case["tokens"][:, 0] = 4999
    for q in (case["q"], None):
        args = (case["tokens"], case["parents"], p, q)
        expected = T.sampled_tree_reference(*args, case["uniforms"], case["noise"])
        assert (expected[1] >= 1).all()
        assert_same(T.sampled_tree_verify(*args, uniforms=case["uniforms"], exponentials=case["noise"], use_triton=True),
                    expected)
    zero = torch.zeros(3, 6)  # uniforms 0: a child is kept whenever the target gives its token any mass
    drafted = torch.zeros(3, 5000, dtype=torch.bool).scatter_(1, case["tokens"], True)
    p_none = case["p"].masked_fill(drafted[:, None], 0.0)
    args = (case["tokens"], case["parents"], p_none, None)
    expected = T.sampled_tree_reference(*args, zero, case["noise"])
    assert expected[1].tolist() == [0, 0, 0]  # no drafted token has target mass: nothing accepted
    assert_same(T.sampled_tree_verify(*args, uniforms=zero, exponentials=case["noise"], use_triton=True), expected)


@interpreter
def test_kernels_take_trees_without_nodes():
    p = torch.rand(2, 1, 9).softmax(-1)
    nothing = torch.empty(2, 0, dtype=torch.long)
    noise = torch.ones(2, 9)
    assert_same(T.sampled_tree_verify(nothing, nothing, p, uniforms=torch.empty(2, 0), exponentials=noise,
                                      use_triton=True),
                T.sampled_tree_reference(nothing, nothing, p, None, torch.empty(2, 0), noise))
    assert_same(T.greedy_tree_verify(nothing, nothing, p, use_triton=True), T.greedy_tree_reference(nothing, nothing, p))


def test_bad_shapes_are_one_clear_error():
    tokens = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(MMSpecError, match="tokens and parents"):
        T.greedy_tree_verify(tokens, torch.zeros(2, 4, dtype=torch.long), torch.rand(2, 4, 5))
    with pytest.raises(MMSpecError, match="target must start"):
        T.greedy_tree_verify(tokens, tokens - 1, torch.rand(2, 3, 5))
    with pytest.raises(MMSpecError, match="num_nodes must be"):
        T.sampled_tree_verify(tokens, tokens - 1, torch.rand(2, 4, 5), None, torch.tensor([1]))


def test_kernels_compile_for_cuda_without_a_gpu():
    """The compiled (not interpreted) kernels build for sm_90: their types and control flow are valid Triton."""
    pytest.importorskip("triton.backends.nvidia")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "tests.triton_compile", "tree_verify"], check=False,
                         capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(": ok") == 4


# --------------------------------------------------------------------------- references == the core's tree rules


def row_tree(case: dict, b: int, with_q: bool) -> DraftTree:
    count = int(case["counts"][b])
    return DraftTree(tokens=case["tokens"][b, :count], parents=case["parents"][b, :count],
                     probs=case["q"][b, :count] if with_q else None)


@pytest.mark.parametrize("size", [3, 10])
def test_greedy_reference_equals_core_rule(size):
    case = random_trees(size, batch=8, size=size, vocab=17)
    path, num, next_token = T.greedy_tree_reference(case["tokens"], case["parents"], case["logits"], case["counts"])
    for b in range(8):
        count = int(case["counts"][b])
        verdict = tree_rules.greedy_tree_match(row_tree(case, b, False), case["logits"][b : b + 1, : count + 1])
        assert path[b, : len(verdict.path)].tolist() == verdict.path and num[b] == len(verdict.path)
        assert next_token[b] == verdict.next_token[0]
    assert num.max() >= 2  # deep paths occur


@pytest.mark.parametrize("with_q", [True, False])
def test_sampled_reference_equals_core_rule(monkeypatch, with_q):
    """The core draws one uniform per tried child from its generator, in order, then the token: given the same
    uniforms the reference keeps the same path and draws from the same distribution."""
    case = random_trees(31, batch=24, size=8, vocab=7, sharp=1.0)
    sampling = SamplingConfig(do_sample=True)
    drawn_from = []
    depths = []
    for b in range(24):
        count = int(case["counts"][b])
        core_draws = torch.Generator().manual_seed(b)
        uniforms = torch.cat([torch.rand((1,), generator=core_draws) for _ in range(8)])[None]

        def race(probs, generator, b=b):  # the core's draw, replaced by an exponential race on the test's noise
            drawn_from.append(probs[0])
            return race_scores(probs, case["noise"][b : b + 1]).argmax(-1)

        monkeypatch.setattr(tree_rules, "sample", race)
        verdict = tree_rules.tree_speculative_sampling(row_tree(case, b, with_q), case["logits"][b : b + 1, : count + 1],
                                                       sampling, torch.Generator().manual_seed(b))
        one = slice(b, b + 1)
        path, num, final = T.sampled_tree_decide_reference(
            case["tokens"][one], case["parents"][one], case["p"][one], case["q"][one] if with_q else None, uniforms,
            case["counts"][one])
        assert path[0, : int(num[0])].tolist() == verdict.path
        torch.testing.assert_close(final[0], drawn_from[-1].float())
        assert race_scores(final, case["noise"][one]).argmax(-1) == verdict.next_token
        depths.append(int(num[0]))
    assert min(depths) == 0 and max(depths) >= 2


# --------------------------------------------------------------------------- the output law


def law_trees(rows: int, uniforms: torch.Tensor | None = None):
    """Trees of two root children drawn from q0 without replacement, each with two children drawn from q1
    without replacement; the target after a child with token a is P2[a]."""
    g = torch.Generator().manual_seed(5)
    vocab = 5
    p_root = (torch.randn(vocab, generator=g) * 1.5).softmax(-1)
    p_next = (torch.randn(vocab, vocab, generator=g) * 1.5).softmax(-1)
    q0 = (torch.randn(vocab, generator=g) * 1.5).softmax(-1)
    q1 = (torch.randn(vocab, generator=g) * 1.5).softmax(-1)
    first = torch.multinomial(q0.expand(rows, -1), 2, replacement=False, generator=g)
    second = torch.multinomial(q1.expand(rows * 2, -1), 2, replacement=False, generator=g).view(rows, 4)
    tokens = torch.cat([first, second], 1)  # nodes 0, 1 under the root; 2, 3 under node 0; 4, 5 under node 1
    parents = torch.tensor([-1, -1, 0, 0, 1, 1]).expand(rows, -1)
    target = torch.cat([p_root.expand(rows, 1, -1), p_next[tokens]], 1)  # [rows, 7, V]
    draft = torch.stack([q0, q0, q1, q1, q1, q1])[None].expand(rows, -1, -1)
    path, num, next_token = T.sampled_tree_verify(tokens, parents, target, draft, generator=g, uniforms=uniforms)
    accepted = tokens.gather(1, path.clamp(min=0))
    y0 = torch.where(num > 0, accepted[:, 0], next_token)
    y1 = torch.where(num > 1, accepted[:, 1], next_token)[num >= 1]
    return p_root, p_next, y0, y0[num >= 1], y1


def p_value(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    return chi_square(Counter(tokens.tolist()), dict(enumerate(probs.tolist()))).p_value


def test_sampled_output_law_is_the_target():
    """The first committed token follows the target after the root, the second the target after the first."""
    p_root, p_next, y0, y0_accepted, y1 = law_trees(6000)
    assert p_value(y0, p_root) > 1e-3
    for a in y0_accepted.unique():
        after_a = y1[y0_accepted == a]
        if len(after_a) > 300:
            assert p_value(after_a, p_next[a]) > 1e-3


def test_control_accepting_every_child_fails_the_law_test():
    p_root, _, y0, _, _ = law_trees(6000, uniforms=torch.zeros(6000, 6))
    assert p_value(y0, p_root) < 1e-6
