"""Draft trees (EAGLE-2) in the core loop: greedy output equals the target's `generate`, the tree rule
keeps the sampled distribution exactly, and the cache after a tree round equals a fresh prefill."""

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, Qwen2Config

from mmspec import MMSpecError, SamplingConfig, speculative_generate
from mmspec.drafters import ModelDrafter, PromptLookupDrafter
from mmspec.rule_capabilities import declare_rule
from mmspec.sampling import probabilities, rand, sample
from mmspec.targets import as_target
from mmspec.testing import assert_distribution_preserved, exact_continuation_distribution, reload_from_disk, tiny_llama
from mmspec.tree_rules import TREE_RULE, children_lists, greedy_tree_match, tree_verdict
from mmspec.trees import DraftTree, TreeConfig, keep_cache_positions

TREES = [TreeConfig(num_nodes=8, top_k=2, depth=4), TreeConfig(num_nodes=20, top_k=4, depth=5),
         TreeConfig(num_nodes=3, top_k=3, depth=1)]


def tiny_qwen2(seed=0, vocab_size=97):
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.3, eos_token_id=3, bos_token_id=1, pad_token_id=0)
    return reload_from_disk(AutoModelForCausalLM.from_config(config))


@pytest.fixture(scope="module")
def models():
    return {
        "llama": (tiny_llama(seed=0, initializer_range=0.3), tiny_llama(seed=0, num_layers=1, initializer_range=0.3)),
        "qwen2": (tiny_qwen2(seed=0), tiny_qwen2(seed=2)),
    }


def prompt(seed, vocab=97, length=8):
    return torch.randint(4, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("config", TREES, ids=["n8k2d4", "n20k4d5", "n3k3d1"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_tree_equals_generate(models, name, config, seed):
    target, drafter = models[name]
    ids = prompt(seed)
    reference = target.generate(ids, max_new_tokens=24, do_sample=False)
    for source in (drafter, target):  # a weak drafter (rejections) and the target itself (long paths)
        out = speculative_generate(target, source, ids, max_new_tokens=24, tree=config)
        assert torch.equal(out.sequences, reference[:, : out.sequences.shape[1]])
        assert out.sequences.shape == reference.shape or int(out.sequences[0, -1]) == 3
    assert out.stats.accepted > 0 and out.stats.target_forwards < 24  # trees were accepted, fewer forwards


def test_greedy_tree_with_eager_attention():
    """Eager attention adds the float tree mask to its scores as sdpa takes it."""
    target, drafter = tiny_llama(seed=5, initializer_range=0.3), tiny_llama(seed=6, num_layers=1, initializer_range=0.3)
    target.set_attn_implementation("eager")
    drafter.set_attn_implementation("eager")
    ids = prompt(2)
    reference = target.generate(ids, max_new_tokens=20, do_sample=False)
    for source in (drafter, target):
        out = speculative_generate(target, source, ids, max_new_tokens=20, tree=TREES[1])
        assert torch.equal(out.sequences, reference)
    assert out.stats.tau > 2


def test_greedy_tree_with_repetition_penalty_and_min_length(models):
    """Logits processors see each node's own prefix (committed tokens + its path)."""
    target, drafter = models["llama"]
    ids = prompt(5)
    settings = dict(repetition_penalty=1.8, no_repeat_ngram_size=2, min_new_tokens=10)
    reference = target.generate(ids, max_new_tokens=20, do_sample=False, **settings)
    for source in (drafter, target):
        out = speculative_generate(target, source, ids, max_new_tokens=20, tree=TREES[1], **settings)
        assert torch.equal(out.sequences, reference)


@declare_rule(TREE_RULE)
def accept_eldest_child(tree, target_logits, sampling=None, generator=None):
    """Control: follows the drafter's first choice one step even when it is not the target's argmax."""
    verdict = greedy_tree_match(tree, target_logits)
    kids = children_lists(tree)
    if not verdict.path and kids.get(-1):
        eldest = kids[-1][0]
        return tree_verdict([eldest], target_logits[0, eldest + 1].argmax(-1))
    return verdict


def test_control_non_argmax_path_is_caught(models):
    target, drafter = models["llama"]
    ids = prompt(0)
    reference = target.generate(ids, max_new_tokens=24, do_sample=False)
    out = speculative_generate(target, drafter, ids, max_new_tokens=24, tree=TREES[0], rule=accept_eldest_child)
    assert not torch.equal(out.sequences, reference)


def test_cache_after_tree_rounds_equals_fresh_prefill(models):
    """Target and drafter caches after each round hold exactly the committed prefix's entries."""
    target_model, drafter_model = models["llama"]
    target = as_target(target_model)
    drafter = ModelDrafter(drafter_model)
    out = speculative_generate(target, drafter, prompt(3), max_new_tokens=20, tree=TREES[1])
    assert out.stats.accepted > 0 and out.stats.rounds > 2  # paths were kept and rolled back several times
    sequence = out.sequences
    # The loop keeps the cache one token behind the committed sequence (the newest is fed next round).
    # The call's own working target and drafter hold its caches (the shared ones are left as they were).
    for cache, model, tokens in ((out.target.cache, target_model, sequence[:, :-1]),
                                 (out.drafter.lm.cache, drafter_model, out.drafter.cached_tokens[None])):
        with torch.no_grad():
            fresh = model(tokens, use_cache=True).past_key_values
        assert cache.get_seq_length() == tokens.shape[1]
        for ours, theirs in zip(cache.layers, fresh.layers):
            torch.testing.assert_close(ours.keys, theirs.keys, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(ours.values, theirs.values, atol=1e-5, rtol=1e-4)


def test_keep_cache_positions_gathers_every_layer():
    cache = DynamicCache()
    for layer in range(2):
        keys = torch.arange(10.0).view(1, 1, 10, 1).expand(1, 2, 10, 3) + layer
        cache.update(keys, keys * 2, layer)
    keep_cache_positions(cache, torch.tensor([0, 1, 4, 7]))
    assert cache.get_seq_length() == 4
    assert cache.layers[1].keys[0, 0, :, 0].tolist() == [1.0, 2.0, 5.0, 8.0]
    assert cache.layers[1].values[0, 0, :, 0].tolist() == [2.0, 4.0, 10.0, 16.0]


# --- sampling -----------------------------------------------------------------------------------------

VOCAB = 5
NEW_TOKENS = 4
PROMPT = torch.tensor([[1, 2, 0, 4]])


@pytest.fixture(scope="module")
def peaked_pair():
    target = tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=3, initializer_range=0.6, eos_token_id=None)
    drafter = tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=4, initializer_range=0.6, eos_token_id=None)
    return target, drafter


class SampledTreeDrafter(ModelDrafter):
    """Draws each expanded node's children WITHOUT replacement from the drafter's warped q (Gumbel top-k gives
    the sequential draws in order), a full tree of `top_k` children per node to `depth`, and hands q to the
    rule: the case the recursive rule's q renormalisation is for. Uncached forwards: tests only."""

    def propose(self, view):
        if view.tree is None:
            return super().propose(view)
        sequence, config, sampling, generator = view.sequence, view.tree, view.sampling, view.generator
        tokens, parents, probs = [], [], []
        frontier = [(-1, sequence[0])]
        for _ in range(config.depth):
            next_frontier = []
            for parent, prefix in frontier:
                q = self.warped(prefix, sampling)
                gumbel = -torch.log(-torch.log(torch.rand(q.shape, generator=generator).clamp(min=1e-20)))
                children = (q.log() + gumbel).topk(config.top_k).indices
                for child in children.tolist():
                    if q[child] == 0:
                        break  # q has no more support: the draws without replacement end here
                    tokens.append(child)
                    parents.append(parent)
                    probs.append(q)
                    next_frontier.append((len(tokens) - 1, torch.cat([prefix, torch.tensor([child])])))
            frontier = next_frontier
        return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.stack(probs))

    def warped(self, prefix, sampling):
        return probabilities(self.lm.model(prefix[None]).logits[0, -1], sampling)


def draw_with(target, drafter, tree, rule=None, **sampling):
    def draw(generator):
        out = speculative_generate(target, drafter, PROMPT, max_new_tokens=NEW_TOKENS, do_sample=True,
                                   generator=generator, tree=tree, rule=rule, **sampling)
        return tuple(out.sequences[0, PROMPT.shape[1]:].tolist())
    return draw


SMALL_TREE = TreeConfig(num_nodes=6, top_k=2, depth=2)


# Each draw is one speculative_generate call: the fast tier draws 600 once; the slow tier draws 3000, as the control does.
@pytest.mark.parametrize(
    "sampling, num_draws",
    [pytest.param({}, 600, id="plain-600"), pytest.param({}, 3000, id="plain-3000", marks=pytest.mark.slow),
     pytest.param({"temperature": 0.7, "top_k": 4}, 3000, id="temp-topk-3000", marks=pytest.mark.slow)],
)
def test_tree_sampling_with_top_k_tree_matches_target(peaked_pair, sampling, num_draws):
    target, drafter = peaked_pair
    exact = exact_continuation_distribution(target, PROMPT, NEW_TOKENS, SamplingConfig(do_sample=True, **sampling))
    assert_distribution_preserved(draw_with(target, drafter, SMALL_TREE, **sampling), exact, num_draws=num_draws, seed=11)


@pytest.mark.slow
def test_tree_sampling_with_sampled_children_matches_target(peaked_pair):
    target, drafter = peaked_pair
    exact = exact_continuation_distribution(target, PROMPT, NEW_TOKENS, SamplingConfig(do_sample=True))
    assert_distribution_preserved(draw_with(target, SampledTreeDrafter(drafter), SMALL_TREE), exact,
                                  num_draws=3000, seed=11)


@declare_rule(TREE_RULE)
def q_not_renormalised_rule(tree, target_logits, sampling, generator):
    """Control: recursive rejection that keeps trying later siblings against the ORIGINAL q (an earlier
    sibling's mass not removed), although they were drawn without replacement."""
    p_rows = probabilities(target_logits[0], sampling)
    tokens, kids = tree.tokens.tolist(), children_lists(tree)
    node, path = -1, []
    while True:
        p, chosen = p_rows[node + 1], None
        for child in kids.get(node, []):
            q, x = tree.probs[child], tokens[child]
            if bool(rand((1,), generator, p.device) * q[x] < p[x]):
                chosen = child
                break
            residual = (p - q).clamp(min=0)
            p = residual / residual.sum() if residual.sum() > 0 else p
        if chosen is None:
            return tree_verdict(path, sample(p[None], generator))
        path.append(chosen)
        node = chosen


@pytest.mark.slow
def test_control_q_not_renormalised_fails(peaked_pair):
    target, drafter = peaked_pair
    exact = exact_continuation_distribution(target, PROMPT, NEW_TOKENS, SamplingConfig(do_sample=True))
    with pytest.raises(AssertionError, match="differs from the reference"):
        assert_distribution_preserved(draw_with(target, SampledTreeDrafter(drafter), SMALL_TREE,
                                                rule=q_not_renormalised_rule), exact, num_draws=3000, seed=11)


# --- refusals --------------------------------------------------------------------------------------------

def test_drafter_without_trees_is_refused(models):
    target, _ = models["llama"]
    with pytest.raises(MMSpecError, match="cannot draft trees"):
        speculative_generate(target, PromptLookupDrafter(), prompt(0), max_new_tokens=4, tree=TreeConfig())


@pytest.mark.parametrize("field", ["num_nodes", "top_k", "depth"])
def test_bad_tree_config_is_refused(field):
    with pytest.raises(MMSpecError, match=f"tree {field} must be an integer >= 1"):
        TreeConfig(**{field: 0})


def test_flash_attention_target_is_refused(models):
    target, drafter = models["llama"]
    target.config._attn_implementation_internal = "flash_attention_2"
    try:
        with pytest.raises(MMSpecError, match="flash_attention_2 cannot take"):
            speculative_generate(target, drafter, prompt(0), max_new_tokens=4, tree=TreeConfig())
    finally:
        target.config._attn_implementation_internal = "sdpa"


def test_round_hook_gets_the_accepted_path_and_the_rejected_branch(models):
    """on_round(tokens, drafted, accepted, proposed): proposed[:accepted] is the kept path (the committed
    tokens but the last), proposed[accepted] the drafter's rejected first choice after it."""
    target, drafter = models["llama"]
    rounds = []
    out = speculative_generate(target, drafter, prompt(4), max_new_tokens=24, tree=TREES[1],
                               on_round=lambda tokens, drafted, accepted, proposed: rounds.append(
                                   (tokens.tolist(), drafted, accepted, proposed.tolist())))
    committed = [t for tokens, *_ in rounds for t in tokens]
    assert committed == out.sequences[0, prompt(4).shape[1]:].tolist()
    tree_rounds = rounds[1:]  # the first is the prefill's token
    assert any(accepted > 0 for _, _, accepted, _ in tree_rounds)
    for tokens, drafted, accepted, proposed in tree_rounds:
        assert proposed[:accepted] == tokens[:accepted] and accepted <= drafted
        if len(proposed) > accepted and len(tokens) > accepted:
            assert proposed[accepted] != tokens[accepted]  # greedy: the drafter's choice there was rejected


def test_grow_tree_keeps_the_most_confident_nodes_as_a_tree():
    """EAGLE-2 growth on a fixed table of log-probabilities: one expand call per level after the first, the
    kept nodes are the num_nodes best cumulative scores, parents come first, depth is bounded."""
    from mmspec.trees import grow_tree

    torch.manual_seed(0)
    vocab, calls, seen = 7, [], {}
    table = torch.randn(50, vocab).log_softmax(-1)  # row = a node's grown index + 1 (row 0: the root)

    def expand(level, tokens, parents):
        calls.append(list(level))
        seen["tokens"], seen["parents"] = tokens.tolist(), parents.tolist()
        return table[torch.tensor(level) + 1]

    config = TreeConfig(num_nodes=6, top_k=3, depth=4)
    tree, grown = grow_tree(table[0], config, expand)
    assert len(calls) == config.depth - 1 and all(len(level) <= config.top_k for level in calls)
    assert tree.size == config.num_nodes and int(tree.depths().max()) <= config.depth
    assert all(parent < node for node, parent in enumerate(tree.parents.tolist()))
    assert [int(tree.tokens[i]) for i in range(tree.size) if grown[i] < len(seen["tokens"])] == \
        [seen["tokens"][g] for g in grown if g < len(seen["tokens"])]

    def score(g):  # cumulative log-probability of grown node g, recomputed from the table
        total = 0.0
        while g >= 0:
            parent = seen["parents"][g]
            total += float(table[parent + 1, seen["tokens"][g]])
            g = parent
        return total

    known = range(len(seen["tokens"]))  # every node grown before the last level
    worst_kept = min(score(g) for g in grown if g in known)
    assert all(score(g) <= worst_kept + 1e-6 for g in known if g not in grown)
    assert any(g not in grown for g in known)  # some were dropped: the selection was exercised
