"""SJD, GSD and LANTERN acceptance rules: slow re-statements, neutral-setting reductions, distributions.

The `slow_*` functions restate each formula independently with Python loops over plain floats.
"""

from collections import Counter

import pytest
import torch

from mmspec import Proposal, SamplingConfig, speculative_sampling
from mmspec.errors import MMSpecError
from mmspec.image_ar.rules import (
    gsd_accept,
    gsd_decide,
    lantern_accept,
    lantern_decide,
    lantern_neighbours,
    sjd_accept,
    sjd_decide,
)
from mmspec.sampling import probabilities
from mmspec.testing import chi_square

V = 10


# ----------------------------------------------------------------------------- slow re-statements


def normalise(weights):
    total = sum(weights)
    return [w / total for w in weights] if total > 0 else None


def slow_chain(tokens, d, p, u, accept_prob, residual):
    """Generic left-to-right chain: accept draft i while u_i <= accept_prob(i); else residual(i)."""
    for i, x in enumerate(tokens):
        if u[i] > accept_prob(i, x):
            return i, residual(i, x)
    return len(tokens), list(p[len(tokens)])


def slow_sjd(tokens, d, p, u):
    def accept_prob(i, x):
        return min(1.0, p[i][x] / d[i][x])

    def residual(i, x):
        return normalise([max(p[i][v] - d[i][v], 0.0) for v in range(len(p[i]))]) or list(p[i])

    return slow_chain(tokens, d, p, u, accept_prob, residual)


def slow_gsd_group(x, p_row, window, prob_threshold, embeddings, distance_threshold):
    ranking = sorted(range(len(p_row)), key=lambda t: -p_row[t])  # stable: ties by token id
    r = ranking.index(x)
    group = {x}
    for g in ranking[max(0, r - window) : r + window + 1]:
        if prob_threshold is not None and not abs(p_row[g] - p_row[x]) < prob_threshold:
            continue
        if embeddings is not None and distance_threshold is not None:
            dist = sum((a - b) ** 2 for a, b in zip(embeddings[g], embeddings[x]))
            if not dist < distance_threshold:
                continue
        group.add(g)
    return group


def slow_gsd(tokens, d, p, u, window=7, prob_threshold=0.15, embeddings=None, distance_threshold=0.5):
    def accept_prob(i, x):
        group = slow_gsd_group(x, p[i], window, prob_threshold, embeddings, distance_threshold)
        return min(1.0, sum(p[i][g] for g in group) / sum(d[i][g] for g in group))

    def residual(i, x):
        return normalise([max(p[i][v] - d[i][v], 0.0) for v in range(len(p[i]))]) or list(p[i])

    return slow_chain(tokens, d, p, u, accept_prob, residual)


def slow_neighbours(codebook, k):
    table = []
    for x, ex in enumerate(codebook):
        others = [y for y in range(len(codebook)) if y != x]
        others.sort(key=lambda y: (sum((a - b) ** 2 for a, b in zip(ex, codebook[y])), y))
        table.append(others[:k])
    return table


def slow_lantern_merge(x, p_row, neighbours, delta, lam):
    budget = (lam - 1.0) * p_row[x] if lam is not None else delta
    merged, mass = [], 0.0
    for n in neighbours[x]:
        if mass + p_row[n] <= budget:
            mass += p_row[n]
            merged.append(n)
        else:
            break
    return p_row[x] + mass, merged


def slow_lantern_residual(x, p_row, q_row, neighbours, delta, lam):
    _, merged = slow_lantern_merge(x, p_row, neighbours, delta, lam)
    weights = [0.0 if v in merged else max(p_row[v] - q_row[v], 0.0) for v in range(len(p_row))]
    return normalise(weights) or list(p_row)


def slow_lantern(tokens, q, p, u, neighbours, delta=0.0, lam=None):
    def accept_prob(i, x):
        return min(1.0, slow_lantern_merge(x, p[i], neighbours, delta, lam)[0] / q[i][x])

    def residual(i, x):
        return slow_lantern_residual(x, p[i], q[i], neighbours, delta, lam)

    return slow_chain(tokens, q, p, u, accept_prob, residual)


# ----------------------------------------------------------------------------- random inputs


def random_case(batch, width, seed, peaked=2.0, one_hot_rows=False):
    gen = torch.Generator().manual_seed(seed)
    p = (torch.randn(batch, width + 1, V, generator=gen) * peaked).softmax(-1)
    d = (torch.randn(batch, width, V, generator=gen) * peaked).softmax(-1)
    tokens = torch.multinomial(d.view(-1, V), 1, generator=gen).view(batch, width)
    if one_hot_rows:  # some freshly initialised (deterministic) drafts
        fresh = torch.rand(batch, width, generator=gen) < 0.3
        d = torch.where(fresh[..., None], torch.nn.functional.one_hot(tokens, V).float(), d)
    # push some drafts to the target's favourite so that chains get accepted
    favourite = torch.rand(batch, width, generator=gen) < 0.5
    tokens = torch.where(favourite, p[:, :width].argmax(-1), tokens)
    d = torch.where(favourite[..., None], p[:, :width] * 0.7 + d * 0.3, d)
    u = torch.rand(batch, width, generator=gen)
    return tokens, d, p, u


def compare_with_slow(decision, slow_fn, tokens, d, p, u):
    for b in range(tokens.shape[0]):
        n, probs = slow_fn(tokens[b].tolist(), d[b].tolist(), p[b].tolist(), u[b].tolist())
        assert int(decision.num_accepted[b]) == n, f"row {b}"
        assert torch.allclose(decision.next_probs[b].double(), torch.tensor(probs, dtype=torch.double), atol=1e-5), f"row {b}"


def test_slow_chain_semantics():
    # accept while u < ratio; reject at the first failure and return the residual
    tokens, d, p = [1, 0], [[0.5, 0.5], [0.5, 0.5]], [[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]]
    n, probs = slow_sjd(tokens, d, p, [0.3, 0.5])
    assert n == 0 and probs == pytest.approx([1.0, 0.0])
    assert slow_sjd([0, 1], d, p, [0.99, 0.99])[0] == 2


@pytest.mark.parametrize("seed", range(3))
def test_sjd_matches_slow_restatement(seed):
    tokens, d, p, u = random_case(40, 5, seed, one_hot_rows=True)
    compare_with_slow(sjd_decide(tokens, d, p, u), slow_sjd, tokens, d, p, u)
    # deterministic drafts: draft_probs=None means one-hot
    one_hot = torch.nn.functional.one_hot(tokens, V).float()
    compare_with_slow(sjd_decide(tokens, None, p, u), slow_sjd, tokens, one_hot, p, u)


@pytest.mark.parametrize(
    "options",
    [
        dict(window=7, prob_threshold=0.15),
        dict(window=2, prob_threshold=None),
        dict(window=3, prob_threshold=0.3, distance_threshold=1.5),
    ],
    ids=["default", "rank-only", "with-embeddings"],
)
def test_gsd_matches_slow_restatement(options):
    embeddings = torch.randn(V, 3, generator=torch.Generator().manual_seed(7)) if "distance_threshold" in options else None
    for seed in range(3):
        tokens, d, p, u = random_case(40, 5, seed + 10, peaked=1.0, one_hot_rows=True)
        decision = gsd_decide(tokens, d, p, u, embeddings=embeddings, **options)
        emb = embeddings.tolist() if embeddings is not None else None

        def slow(t, dd, pp, uu):
            return slow_gsd(t, dd, pp, uu, embeddings=emb, **options)

        compare_with_slow(decision, slow, tokens, d, p, u)


@pytest.mark.parametrize("mode", [dict(delta=0.0), dict(delta=0.1), dict(delta=0.4), dict(lam=3.0)], ids=str)
def test_lantern_matches_slow_restatement(mode):
    codebook = torch.randn(V, 4, generator=torch.Generator().manual_seed(3))
    neighbours = lantern_neighbours(codebook, 5)
    table = neighbours.tolist()
    for seed in range(3):
        tokens, q, p, u = random_case(40, 5, seed + 20, peaked=1.0, one_hot_rows=True)
        decision = lantern_decide(tokens, q, p, u, neighbours=neighbours, **mode)

        def slow(t, qq, pp, uu):
            return slow_lantern(t, qq, pp, uu, table, **mode)

        compare_with_slow(decision, slow, tokens, q, p, u)


def test_lantern_neighbours_match_brute_force():
    codebook = torch.randn(14, 3, generator=torch.Generator().manual_seed(1))
    assert lantern_neighbours(codebook, 6, chunk=5).tolist() == slow_neighbours(codebook.tolist(), 6)
    with pytest.raises(MMSpecError):
        lantern_neighbours(codebook, 14)


# ----------------------------------------------------------------------------- neutral settings


@pytest.mark.parametrize("neutral", [dict(window=0), dict(prob_threshold=0.0), dict(distance_threshold=0.0)], ids=str)
@pytest.mark.parametrize("seed", range(3))
def test_gsd_with_singleton_group_is_sjd_draw_for_draw(neutral, seed):
    tokens, d, p, _ = random_case(200, 6, seed + 30, one_hot_rows=True)
    embeddings = torch.randn(V, 2) if "distance_threshold" in neutral else None
    sjd = sjd_accept(tokens, d, p, torch.Generator().manual_seed(seed))
    gsd = gsd_accept(tokens, d, p, torch.Generator().manual_seed(seed), embeddings=embeddings, **neutral)
    assert torch.equal(sjd.num_accepted, gsd.num_accepted)
    assert torch.equal(sjd.next_token, gsd.next_token)


@pytest.mark.parametrize("sampling", [SamplingConfig(do_sample=True), SamplingConfig(do_sample=True, temperature=0.8, top_k=4)], ids=["plain", "topk"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-q", "one-hot-q"])
@pytest.mark.parametrize("neutral", [dict(delta=0.0), dict(lam=1.0)], ids=["delta0", "lambda1"])
def test_lantern_neutral_is_core_speculative_sampling(sampling, deterministic, neutral):
    gen = torch.Generator().manual_seed(4)
    batch, k = 300, 5
    logits = torch.randn(batch, k + 1, V, generator=gen) * 2
    q = (torch.randn(batch, k, V, generator=gen) * 2).softmax(-1)
    tokens = torch.multinomial(q.view(-1, V), 1, generator=gen).view(batch, k)
    p = probabilities(logits, sampling)  # what the core rule computes internally
    neighbours = lantern_neighbours(torch.randn(V, 3, generator=gen), 6)
    probs = None if deterministic else q
    core = speculative_sampling(Proposal(tokens=tokens, probs=probs), logits, sampling, torch.Generator().manual_seed(9))
    mine = lantern_accept(tokens, probs, p, torch.Generator().manual_seed(9), neighbours=neighbours, **neutral)
    assert torch.equal(core.num_accepted, mine.num_accepted)
    assert torch.equal(core.next_token, mine.next_token)
    assert 0 < core.num_accepted.float().mean() < k  # the comparison exercised both branches


def test_sjd_is_core_speculative_sampling():
    tokens, d, p, _ = random_case(300, 4, 40)
    core = speculative_sampling(Proposal(tokens=tokens, probs=d), p.log(), SamplingConfig(do_sample=True), torch.Generator().manual_seed(1))
    mine = sjd_accept(tokens, d, p, torch.Generator().manual_seed(1))
    # p.log() re-normalised by softmax differs from p in the last bits only: allow a rare flip
    assert (core.num_accepted == mine.num_accepted).float().mean() > 0.99


def test_lantern_acceptance_grows_with_the_budget():
    tokens, q, p, u = random_case(300, 6, 50, peaked=1.0)
    neighbours = lantern_neighbours(torch.randn(V, 4, generator=torch.Generator().manual_seed(2)), 9)
    counts = [lantern_decide(tokens, q, p, u, neighbours=neighbours, delta=delta).num_accepted for delta in (0.0, 0.05, 0.2, 0.5)]
    for smaller, larger in zip(counts, counts[1:]):
        assert bool((larger >= smaller).all())
    assert counts[-1].sum() > counts[0].sum()


def test_shape_errors():
    tokens, d, p, _ = random_case(2, 3, 0)
    with pytest.raises(MMSpecError, match="W \\+ 1"):
        sjd_accept(tokens, d, p[:, :3])
    with pytest.raises(MMSpecError, match="draft_probs"):
        sjd_accept(tokens, d[..., :5], p)
    with pytest.raises(MMSpecError, match="delta"):
        lantern_accept(tokens, d, p, neighbours=torch.zeros(V, 2, dtype=torch.long), delta=-0.1)


def test_zero_drafts_give_a_plain_sample():
    p = torch.tensor([[[0.0, 1.0, 0.0]]])
    for rule in (sjd_accept, gsd_accept):
        verdict = rule(torch.empty(1, 0, dtype=torch.long), None, p, torch.Generator().manual_seed(0))
        assert verdict.num_accepted.tolist() == [0] and verdict.next_token.tolist() == [1]


# ----------------------------------------------------------------------------- output distributions

P_ROW = torch.tensor([0.30, 0.22, 0.15, 0.10, 0.08, 0.06, 0.04, 0.03, 0.015, 0.005])
D_ROW = torch.tensor([0.05, 0.05, 0.30, 0.05, 0.20, 0.05, 0.10, 0.10, 0.05, 0.05])
DRAWS = 200_000


def first_token_counts(rule, d_row, seed=0, **options):
    """One draft per row (x ~ d_row) and its verdict; the first committed token of every row."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.multinomial(d_row, DRAWS, replacement=True, generator=gen)[:, None]
    d = d_row[None, None].expand(DRAWS, 1, V)
    p = torch.stack([P_ROW, P_ROW])[None].expand(DRAWS, 2, V)
    verdict = rule(tokens, d, p, gen, **options)
    first = torch.where(verdict.num_accepted > 0, tokens[:, 0], verdict.next_token)
    return Counter(first.tolist())


def mixture(d_row, accept_prob, residual):
    """Exact first-token law: sum_x d(x) [a(x) 1{y = x} + (1 - a(x)) r_x(y)]."""
    out = [0.0] * V
    for x in range(V):
        a = accept_prob(x)
        out[x] += float(d_row[x]) * a
        for y, r in enumerate(residual(x)):
            out[y] += float(d_row[x]) * (1 - a) * r
    return out


def wrong_residual_sjd(tokens, d, p, generator):
    """Control: on rejection resample from p instead of norm(max(p - d, 0))."""
    verdict = sjd_accept(tokens, d, p, generator)
    resampled = torch.multinomial(p[:, 0], 1, generator=generator).squeeze(-1)
    verdict.next_token = torch.where(verdict.num_accepted == 0, resampled, verdict.next_token)
    return verdict


def test_sjd_preserves_the_target_distribution():
    counts = first_token_counts(sjd_accept, D_ROW)
    assert chi_square(counts, dict(enumerate(P_ROW.tolist()))).p_value > 1e-3


def test_sjd_with_one_hot_drafts_preserves_the_target_distribution():
    # every row drafts token 2 deterministically (a freshly initialised Jacobi token)
    counts = first_token_counts(sjd_accept, torch.nn.functional.one_hot(torch.tensor(2), V).float())
    assert chi_square(counts, dict(enumerate(P_ROW.tolist()))).p_value > 1e-3


def test_control_wrong_residual_is_detected():
    counts = first_token_counts(wrong_residual_sjd, D_ROW)
    assert chi_square(counts, dict(enumerate(P_ROW.tolist()))).p_value < 1e-6


def test_gsd_output_follows_its_formula():
    options = dict(window=2, prob_threshold=0.1)
    p, d = P_ROW.tolist(), D_ROW.tolist()

    def accept_prob(x):
        group = slow_gsd_group(x, p, 2, 0.1, None, None)
        return min(1.0, sum(p[g] for g in group) / sum(d[g] for g in group))

    residual = normalise([max(a - b, 0.0) for a, b in zip(p, d)])
    expected = mixture(D_ROW, accept_prob, lambda x: residual)
    counts = first_token_counts(gsd_accept, D_ROW, **options)
    assert chi_square(counts, dict(enumerate(expected))).p_value > 1e-3
    # and it is relaxed: the plain target law is rejected
    assert chi_square(counts, dict(enumerate(p))).p_value < 1e-6


@pytest.mark.parametrize("mode", [dict(delta=0.12), dict(lam=2.0)], ids=["delta", "lambda"])
def test_lantern_output_follows_its_formula(mode):
    codebook = torch.randn(V, 3, generator=torch.Generator().manual_seed(11))
    neighbours = lantern_neighbours(codebook, 4)
    table = neighbours.tolist()
    p, q = P_ROW.tolist(), D_ROW.tolist()
    delta, lam = mode.get("delta", 0.0), mode.get("lam")

    def accept_prob(x):
        return min(1.0, slow_lantern_merge(x, p, table, delta, lam)[0] / q[x])

    expected = mixture(D_ROW, accept_prob, lambda x: slow_lantern_residual(x, p, q, table, delta, lam))
    counts = first_token_counts(lantern_accept, D_ROW, neighbours=neighbours, **mode)
    assert chi_square(counts, dict(enumerate(expected))).p_value > 1e-3
