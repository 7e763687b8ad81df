"""`CertifiedHead`: greedy choices from a bfloat16 head product equal the float32 head's, near ties included."""

import pytest
import torch
import torch.nn.functional as F

from mmspec.kernels.certified_head import CertifiedHead, certified_head_available, certified_head_for


def near_tie_case(seed: int = 0, vocab: int = 3000, width: int = 64, rows: int = 300):
    """A head whose rows come in pairs that bfloat16 often cannot tell apart, and hidden states pointing at pairs:
    each row's best two logits are a pair, apart by more than float32's rounding but less than bfloat16's."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, width, generator=g) * 0.2
    weight[1::2] = weight[0::2] + 1e-3 * torch.randn(vocab // 2, width, generator=g)
    pairs = torch.randint(0, vocab // 2, (rows,), generator=g) * 2
    hidden = 3 * weight[pairs] + 0.05 * torch.randn(rows, width, generator=g)
    return weight, hidden


def test_argmax_equals_the_float32_heads_where_bfloat16_alone_does_not():
    weight, hidden = near_tie_case()
    exact = F.linear(hidden, weight)
    head = CertifiedHead(weight)
    assert torch.equal(head.logits(hidden).argmax(-1), exact.argmax(-1))
    assert head.fallbacks == 0 and head.candidates < 4 * hidden.shape[0]  # a few candidates a row, no full product
    # Control: the bfloat16 product's own argmax picks the wrong one of a pair in many rows.
    rough = F.linear(hidden.bfloat16(), weight.bfloat16()).float()
    assert (rough.argmax(-1) != exact.argmax(-1)).sum() > 20


def test_without_the_rounding_radius_it_would_be_wrong():
    """Control: with the radius set to zero only the bfloat16 best is recomputed, and near ties go wrong."""
    weight, hidden = near_tie_case(seed=1)
    head = CertifiedHead(weight)
    head.scale = head.output = 0.0
    assert (head.logits(hidden).argmax(-1) != F.linear(hidden, weight).argmax(-1)).sum() > 0


def test_candidates_hold_float32_logits_and_the_rest_stay_below_the_best():
    weight, hidden = near_tie_case(seed=2, rows=40)
    exact = F.linear(hidden, weight)
    got = CertifiedHead(weight).logits(hidden)
    best = exact.argmax(-1, keepdim=True)
    torch.testing.assert_close(got.gather(1, best), exact.gather(1, best), rtol=0, atol=1e-5)
    others = got.scatter(1, best, float("-inf"))
    assert bool((others < exact.gather(1, best)).all())


def test_masking_processors_pick_among_the_tokens_left():
    weight, hidden = near_tie_case(seed=3, rows=60)
    exact = F.linear(hidden, weight)
    banned = exact.topk(3, dim=-1).indices.flatten().unique()  # suppress every row's best three

    def suppress(logits):
        return logits.index_fill(-1, banned, float("-inf"))

    got = CertifiedHead(weight).logits(hidden[None], suppress)
    assert got.shape == (1, 60, weight.shape[0])
    assert torch.equal(got[0].argmax(-1), suppress(exact).argmax(-1))
    assert bool(torch.isinf(got[0][:, banned]).all())


def test_rows_it_cannot_bound_take_the_float32_head():
    weight, hidden = near_tie_case(seed=4, rows=4)
    head = CertifiedHead(weight)
    hidden[1, 0] = float("nan")
    exact = F.linear(hidden, weight)
    torch.testing.assert_close(head.logits(hidden), exact, equal_nan=True)
    all_masked = head.logits(hidden[[0]], lambda logits: torch.full_like(logits, float("-inf")))
    assert bool(torch.isinf(all_masked).all())
    assert head.fallbacks == 2


def test_the_largest_row_norm_is_the_whole_heads_in_float64():
    # More rows than one float64 slice, the largest in the last, partial slice: the bound is the same number.
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(9000, 48, generator=g)
    weight[8999] *= 3
    expected = float(weight.double().norm(dim=1).max()) * (1 + 1e-6)
    assert CertifiedHead(weight).max_row_norm == expected


def test_one_head_per_weight_remade_when_the_weight_changes():
    weight, hidden = near_tie_case(seed=5, rows=20)
    first = certified_head_for(weight)
    assert certified_head_for(weight) is first
    with torch.no_grad():
        weight.mul_(-1)  # in place: the bfloat16 copy is stale
    second = certified_head_for(weight)
    assert second is not first
    assert torch.equal(second.logits(hidden).argmax(-1), F.linear(hidden, weight).argmax(-1))


def test_only_float32_cpu_heads():
    assert certified_head_available(torch.zeros(4, 4))
    assert not certified_head_available(torch.zeros(4, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="float32"):
        CertifiedHead(torch.zeros(4, 4, dtype=torch.bfloat16))


def test_greedy_loops_take_it_on_large_plain_heads_only(target, prompt):
    """Through the loop: a plain Llama head is certified (the test session lowers the size rule to 0); at the
    default size rule this tiny head keeps the float32 head; sampling never takes it."""
    from mmspec import NoDrafter, SpeculativeDecoder
    from mmspec.targets import as_target

    reference = target.generate(prompt, do_sample=False, max_new_tokens=12)
    wrapped = as_target(target)
    out = SpeculativeDecoder(wrapped, NoDrafter()).generate(prompt, max_new_tokens=12, do_sample=False)
    # Each call's own working copy of the target is where its head was chosen.
    assert torch.equal(out.sequences, reference) and out.target.certified_head is not None
    small = as_target(target)
    small.certified_head_min_size = 1 << 22  # the default outside the tests
    out = SpeculativeDecoder(small, NoDrafter()).generate(prompt, max_new_tokens=4, do_sample=False)
    assert out.target.certified_head is None
    out = SpeculativeDecoder(as_target(target), NoDrafter()).generate(prompt, max_new_tokens=4, do_sample=True)
    assert out.target.certified_head is None
