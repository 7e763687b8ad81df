"""The fused verification kernels (mmspec.kernels.rejection, mmspec.kernels.tree_verify) compiled on CUDA: equal
to their torch references bit for bit at a real vocabulary (128256), no host synchronisation, CUDA-graph replay."""

import pytest
import torch

from mmspec.kernels import rejection as R
from mmspec.kernels import tree_verify as T
from mmspec.kernels.triton_launch import interpreting

pytestmark = pytest.mark.skipif(interpreting(), reason="Triton was loaded by its CPU interpreter in this session "
                                                       "(TRITON_INTERPRET=1): run tests/gpu on their own")

CUDA = torch.device("cuda")
VOCAB = 128256


def assert_same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu()), (a, b)


def chain(seed: int, batch: int = 4, k: int = 5, vocab: int = VOCAB) -> dict:
    g = torch.Generator(CUDA).manual_seed(seed)
    logits = torch.randn(batch, k + 1, vocab, device=CUDA, generator=g) * 3
    p = logits.softmax(-1)
    q = (torch.randn(batch, k, vocab, device=CUDA, generator=g) * 3).softmax(-1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    drafts[0] = p[0, :k].argmax(-1)  # a row the target likes: long accepted prefixes
    return {"logits": logits, "p": p, "q": q, "drafts": drafts, "lengths": torch.tensor([k, k - 2, 0, k], device=CUDA),
            "uniforms": torch.rand(batch, k, device=CUDA, generator=g),
            "noise": torch.empty(batch, vocab, device=CUDA).exponential_(generator=g)}


def tree(seed: int, batch: int = 3, size: int = 16, vocab: int = VOCAB) -> dict:
    g = torch.Generator(CUDA).manual_seed(seed)
    parents = torch.tensor([[-1, -1, -1, 0, 0, 1, 3, 3, 4, 6, 6, 7, 9, 9, 12, 12]] * batch, device=CUDA)[:, :size]
    logits = torch.randn(batch, size + 1, vocab, device=CUDA, generator=g) * 3
    tokens = torch.randint(0, vocab, (batch, size), device=CUDA, generator=g)
    wanted = logits.argmax(-1).gather(1, parents + 1)
    tokens = torch.where(torch.rand(batch, size, device=CUDA, generator=g) < 0.6, wanted, tokens)
    return {"tokens": tokens, "parents": parents, "logits": logits, "p": logits.softmax(-1),
            "q": (torch.randn(batch, size, vocab, device=CUDA, generator=g) * 3).softmax(-1),
            "counts": torch.tensor([size, size // 2, 0][:batch], device=CUDA),
            "uniforms": torch.rand(batch, size, device=CUDA, generator=g),
            "noise": torch.empty(batch, vocab, device=CUDA).exponential_(generator=g)}


def test_chain_kernels_equal_references_on_cuda():
    case = chain(0)
    for target in (case["logits"], case["logits"].to(torch.bfloat16), case["logits"].argmax(-1)):
        assert_same(R.greedy_chain_verify(case["drafts"], target, case["lengths"]),
                    R.greedy_chain_reference(case["drafts"], target, case["lengths"]))
    excluded = torch.rand(4, 5, VOCAB, device=CUDA) < 0.01
    for q in (case["q"], case["q"].to(torch.bfloat16), None):
        for options in ({}, {"accept_target": case["uniforms"].flip(0), "residual_excluded": excluded}):
            args = (case["drafts"], case["p"], q)
            assert_same(R.sampled_chain_verify(*args, lengths=case["lengths"], uniforms=case["uniforms"],
                                               exponentials=case["noise"], **options),
                        R.sampled_chain_reference(*args, case["uniforms"], case["noise"], lengths=case["lengths"],
                                                  **options))


def test_tree_kernels_equal_references_on_cuda():
    case = tree(1)
    for target in (case["logits"], case["logits"].to(torch.bfloat16), case["logits"].argmax(-1)):
        assert_same(T.greedy_tree_verify(case["tokens"], case["parents"], target, case["counts"]),
                    T.greedy_tree_reference(case["tokens"], case["parents"], target, case["counts"]))
    for q in (case["q"], None):
        for p in (case["p"], (case["logits"] / 8).softmax(-1)):  # a flatter target: more rejections
            args = (case["tokens"], case["parents"], p, q)
            assert_same(T.sampled_tree_verify(*args, case["counts"], uniforms=case["uniforms"],
                                              exponentials=case["noise"]),
                        T.sampled_tree_reference(*args, case["uniforms"], case["noise"], case["counts"]))


def test_a_cpu_generator_gives_the_cpu_result():
    case = chain(2, vocab=4099)
    cpu = {key: value.cpu() for key, value in case.items()}
    got = R.sampled_chain_verify(case["drafts"], case["p"], case["q"], generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    uniforms, noise = torch.rand(4, 5, generator=g), torch.empty(4, 4099).exponential_(generator=g)
    assert_same(got, R.sampled_chain_reference(cpu["drafts"], cpu["p"], cpu["q"], uniforms, noise))


def test_no_host_synchronisation():
    case, trees = chain(3), tree(4)
    generator = torch.Generator(CUDA).manual_seed(0)

    def verify_all():
        R.greedy_chain_verify(case["drafts"], case["logits"], case["lengths"])
        R.sampled_chain_verify(case["drafts"], case["p"], case["q"], lengths=case["lengths"], generator=generator)
        T.greedy_tree_verify(trees["tokens"], trees["parents"], trees["logits"], trees["counts"])
        T.sampled_tree_verify(trees["tokens"], trees["parents"], trees["p"], trees["q"], trees["counts"],
                              generator=generator)

    verify_all()  # compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        verify_all()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def captured(fn):
    """fn captured in a CUDA graph (after a warm-up on a side stream) and its static outputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


def test_cuda_graph_replay_follows_new_inputs():
    case, trees = chain(5), tree(6)
    static_chain = {key: value.clone() for key, value in case.items()}
    static_tree = {key: value.clone() for key, value in trees.items()}

    def verify_all():
        s, t = static_chain, static_tree
        return (R.sampled_chain_verify(s["drafts"], s["p"], s["q"], lengths=s["lengths"], uniforms=s["uniforms"],
                                       exponentials=s["noise"])
                + R.greedy_chain_verify(s["drafts"], s["logits"], s["lengths"])
                + T.sampled_tree_verify(t["tokens"], t["parents"], t["p"], t["q"], t["counts"], uniforms=t["uniforms"],
                                        exponentials=t["noise"])
                + T.greedy_tree_verify(t["tokens"], t["parents"], t["logits"], t["counts"]))

    graph, outputs = captured(verify_all)
    for seed in (7, 8):
        new_chain, new_tree = chain(seed), tree(seed + 10)
        for key in static_chain:
            static_chain[key].copy_(new_chain[key])
        for key in static_tree:
            static_tree[key].copy_(new_tree[key])
        graph.replay()
        torch.cuda.synchronize()
        expected = (R.sampled_chain_reference(new_chain["drafts"], new_chain["p"], new_chain["q"], new_chain["uniforms"],
                                              new_chain["noise"], lengths=new_chain["lengths"])
                    + R.greedy_chain_reference(new_chain["drafts"], new_chain["logits"], new_chain["lengths"])
                    + T.sampled_tree_reference(new_tree["tokens"], new_tree["parents"], new_tree["p"], new_tree["q"],
                                               new_tree["uniforms"], new_tree["noise"], new_tree["counts"])
                    + T.greedy_tree_reference(new_tree["tokens"], new_tree["parents"], new_tree["logits"],
                                              new_tree["counts"]))
        assert_same(outputs, expected)
