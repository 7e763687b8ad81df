"""SJD, GSD and LANTERN acceptance rules: slow re-statements, neutral-setting reductions, distributions.

The `slow_*` functions restate each formula independently with Python loops over plain floats.
"""

from collections import Counter
from functools import partial

import pytest
import torch

from mmspec import Proposal, SamplingConfig, speculative_sampling
from mmspec.errors import MMSpecError
from mmspec.image_ar.rules import (
    gsd_accept,
    gsd_decide,
    gsd_group_mask,
    lantern_accept,
    lantern_decide,
    lantern_neighbours,
    lantern_output_law,
    sjd_accept,
    sjd_decide,
    total_variation,
)
from mmspec.sampling import probabilities
from mmspec.testing import chi_square

V = 10


# ----------------------------------------------------------------------------- slow re-statements


def normalise(weights):
    total = sum(weights)
    return [w / total for w in weights] if total > 0 else None


def slow_chain(tokens, d, p, u, accept_prob, residual):
    """Generic left-to-right chain: accept draft i while u_i < accept_prob(i) (strict); else residual(i)."""
    for i, x in enumerate(tokens):
        if not u[i] < accept_prob(i, x):
            return i, residual(i, x)
    return len(tokens), list(p[len(tokens)])


def slow_sjd(tokens, d, p, u):
    def accept_prob(i, x):
        return min(1.0, p[i][x] / d[i][x])

    def residual(i, x):
        return normalise([max(p[i][v] - d[i][v], 0.0) for v in range(len(p[i]))]) or list(p[i])

    return slow_chain(tokens, d, p, u, accept_prob, residual)


def slow_gsd_group(x, p_row, window, prob_threshold, embeddings, distance_threshold):
    """The authors' slice of an ascending sort, order[r - W : r + W] (clipped at 0): W below x, W - 1 above."""
    ranking = sorted(range(len(p_row)), key=lambda t: p_row[t])  # ascending; stable: ties by token id
    r = ranking.index(x)
    below, above = (window, window - 1) if isinstance(window, int) else window
    group = {x}
    for g in ranking[max(0, r - below) : r + above + 1]:
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


@pytest.mark.parametrize("sampling", [SamplingConfig(do_sample=True), SamplingConfig(do_sample=True, temperature=0.8, top_k=4)],
                         ids=["plain", "topk"])
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


# ----------------------------------------------------------------------------- strict acceptance


def test_a_zero_probability_draft_is_never_accepted_even_when_u_is_zero(monkeypatch):
    """u * q(x) < p(x), strictly: with every uniform exactly 0, a draft the target (or the rule's grouped /
    relaxed target) gives probability 0 is rejected; `<=` would accept it."""
    import mmspec.image_ar.rules as rules

    monkeypatch.setattr(rules, "draw_uniforms", lambda tokens, generator, device: torch.zeros(tokens.shape, device=device))
    p = torch.zeros(1, 2, V)
    p[:, :, 0] = 1.0  # the target is sure of token 0
    d = torch.full((1, 1, V), 1.0 / V)
    zero, sure = torch.tensor([[3]]), torch.tensor([[0]])
    neighbours = lantern_neighbours(torch.randn(V, 3, generator=torch.Generator().manual_seed(0)), 4)
    rules_under_test = {
        "sjd": partial(sjd_accept),
        "gsd": partial(gsd_accept),  # 0's probability gap to token 3 is 1 > 0.15: G(3) holds no target mass
        "gsd-no-filters": partial(gsd_accept, window=3, prob_threshold=None, distance_threshold=None,
                                  embeddings=None),  # ranks next to 3 are all zeros (0 is ranked first, far away)
        "lantern": partial(lantern_accept, neighbours=neighbours, delta=0.5),  # merging 0 would cost 1 > delta
    }
    for name, rule in rules_under_test.items():
        for probs in (d, None):  # a sampled draft and a deterministic (one-hot) one
            verdict = rule(zero, probs, p, torch.Generator().manual_seed(0))
            assert verdict.num_accepted.tolist() == [0], name
            assert verdict.next_token.tolist() == [0], name  # the residual puts everything on token 0
            assert rule(sure, probs, p, torch.Generator().manual_seed(0)).num_accepted.tolist() == [1], name  # control


def test_strict_acceptance_keeps_the_acceptance_probability():
    """u < r and u <= r have the same probability for u ~ U[0, 1): the decision at u = r itself flips."""
    tokens, d, p, _ = random_case(1, 1, 0)
    ratio = float(p[0, 0, tokens[0, 0]] / d[0, 0, tokens[0, 0]])
    assert ratio < 1
    at = torch.tensor([[ratio]]) * (1 + 1e-6)
    below = torch.tensor([[ratio]]) * (1 - 1e-6)
    assert sjd_decide(tokens, d, p, at).num_accepted.tolist() == [0]
    assert sjd_decide(tokens, d, p, below).num_accepted.tolist() == [1]


# ----------------------------------------------------------------------------- GSD's rank window


def test_gsd_rank_window_is_the_authors_asymmetric_slice():
    """The authors take order[r - 7 : r + 7] of an ascending sort: 7 less probable tokens and 6 more probable."""
    vocab = 30
    p = torch.arange(1, vocab + 1, dtype=torch.float32).flip(0)  # token t has rank t in the descending order
    p = (p / p.sum())[None, None].expand(1, 2, vocab)
    x = 15
    group = gsd_group_mask(torch.tensor([[x]]), p, prob_threshold=None, embeddings=None)[0, 0]
    members = set(torch.nonzero(group).flatten().tolist())
    assert members == set(range(x - 6, x + 8))  # 6 more probable (9..14), x, 7 less probable (16..22)
    more, less = [t for t in members if t < x], [t for t in members if t > x]
    assert (len(more), len(less)) == (6, 7)
    # a pair is (below, above): the symmetric window of earlier versions is (7, 7)
    symmetric = gsd_group_mask(torch.tensor([[x]]), p, window=(7, 7), prob_threshold=None)[0, 0]
    assert set(torch.nonzero(symmetric).flatten().tolist()) == set(range(x - 7, x + 8))
    # clipped at both ends: the most probable token has only less probable neighbours, the least probable only more
    top = gsd_group_mask(torch.tensor([[0]]), p, prob_threshold=None)[0, 0]
    bottom = gsd_group_mask(torch.tensor([[vocab - 1]]), p, prob_threshold=None)[0, 0]
    assert set(torch.nonzero(top).flatten().tolist()) == set(range(0, 8))
    assert set(torch.nonzero(bottom).flatten().tolist()) == set(range(vocab - 7, vocab))
    assert gsd_group_mask(torch.tensor([[x]]), p, window=0, prob_threshold=None)[0, 0].sum() == 1  # {x}: SJD


def test_gsd_distance_filter_uses_the_given_latents():
    """||e_g - e_x||^2 < threshold on the rows of `embeddings` (the AR model's input embeddings by default)."""
    vocab = 6
    p = torch.tensor([0.3, 0.25, 0.2, 0.12, 0.08, 0.05])[None, None].expand(1, 2, vocab)
    e = torch.tensor([[0.0], [0.6], [0.8], [3.0], [0.5], [0.1]])
    group = gsd_group_mask(torch.tensor([[0]]), p, prob_threshold=None, embeddings=e, distance_threshold=0.5)[0, 0]
    assert torch.nonzero(group).flatten().tolist() == [0, 1, 4, 5]  # 0.36, 0.25, 0.01 < 0.5; 0.64 and 9 are not
    with pytest.raises(MMSpecError, match="latent table"):
        gsd_group_mask(torch.tensor([[0]]), p, embeddings=e[:4])


# ----------------------------------------------------------------------------- what LANTERN's delta bounds


def test_lantern_delta_bounds_each_candidate_not_the_output_law():
    """Exact output law of one acceptance step, V = 40, delta = 0.1.

    True: for every candidate x, TV(p, p~_x) <= delta, where p~_x moves the mass of x's merged
    neighbours onto x. Not true: TV(p, law of the output) <= delta; here it is about 0.4."""
    vocab, delta = 40, 0.1
    gen = torch.Generator().manual_seed(0)
    p = (torch.randn(vocab, generator=gen) * 2).double().softmax(-1)
    q = (torch.randn(vocab, generator=gen) * 2).double().softmax(-1)
    neighbours = lantern_neighbours(torch.randn(vocab, 4, generator=gen), 16)
    table, p_list, q_list = neighbours.tolist(), p.tolist(), q.tolist()
    for x in range(vocab):
        boosted_x, merged = slow_lantern_merge(x, p_list, table, delta, None)
        boosted = list(p_list)
        for n in merged:
            boosted[n] = 0.0
        boosted[x] = boosted_x
        assert abs(sum(boosted) - 1) < 1e-9
        assert 0.5 * sum(abs(a - b) for a, b in zip(boosted, p_list)) <= delta + 1e-12  # the bound that holds
    law = lantern_output_law(q[None], p[None], neighbours, delta=delta)[0]
    # the law by its definition, with the slow restatement of accept and residual
    expected = [0.0] * vocab
    for x in range(vocab):
        a = min(1.0, slow_lantern_merge(x, p_list, table, delta, None)[0] / q_list[x])
        expected[x] += q_list[x] * a
        for y, r in enumerate(slow_lantern_residual(x, p_list, q_list, table, delta, None)):
            expected[y] += q_list[x] * (1 - a) * r
    assert torch.allclose(law, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    assert float(total_variation(law, p)) > 3 * delta  # the output law is far outside delta (0.42 here)
    assert float(total_variation(lantern_output_law(q[None], p[None], neighbours, delta=0.0)[0], p)) < 1e-12  # exact SD


def test_lantern_output_law_is_what_the_rule_samples():
    """Monte Carlo check of `lantern_output_law` against `lantern_accept` (one draft per row, x ~ q)."""
    vocab, draws = 12, 200_000
    gen = torch.Generator().manual_seed(1)
    p = (torch.randn(vocab, generator=gen) * 1.5).softmax(-1)
    q = (torch.randn(vocab, generator=gen) * 1.5).softmax(-1)
    neighbours = lantern_neighbours(torch.randn(vocab, 3, generator=gen), 5)
    tokens = torch.multinomial(q, draws, replacement=True, generator=gen)[:, None]
    verdict = lantern_accept(tokens, q.expand(draws, 1, vocab), p.expand(draws, 2, vocab), gen, neighbours=neighbours,
                             delta=0.2)
    first = torch.where(verdict.num_accepted > 0, tokens[:, 0], verdict.next_token)
    law = lantern_output_law(q[None], p[None], neighbours, delta=0.2)[0]
    assert chi_square(Counter(first.tolist()), dict(enumerate(law.tolist()))).p_value > 1e-3
    assert chi_square(Counter(first.tolist()), dict(enumerate(p.tolist()))).p_value < 1e-6  # and it is not p
    # one-hot drafts (fresh Jacobi tokens) too
    one_hot = torch.nn.functional.one_hot(torch.tensor(4), vocab).float()
    law = lantern_output_law(one_hot[None], p[None], neighbours, delta=0.2)[0]
    verdict = lantern_accept(torch.full((draws, 1), 4), None, p.expand(draws, 2, vocab), gen, neighbours=neighbours,
                             delta=0.2)
    first = torch.where(verdict.num_accepted > 0, torch.tensor(4), verdict.next_token)
    assert chi_square(Counter(first.tolist()), dict(enumerate(law.tolist()))).p_value > 1e-3
