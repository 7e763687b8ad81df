"""Draft trees on the static-shape path (`compile=True`, `mmspec.static_trees`): the padded tree verification scores
what the eager tree verification scores, the accepted path lands where a fresh prefill puts it, and greedy output is
the target's `generate` and the eager tree path's, round for round.

Compiled with dynamo's "eager" backend (the same captured graphs without inductor's code generation), as most of
`test_static_compiled.py`; one test runs inductor itself.
"""

import pytest
import torch

from mmspec import FixedDraftLength, MMSpecError, SamplingConfig, TreeConfig, speculative_generate, static_steps
from mmspec import static_target as st
from mmspec.static_target import StaticCachedModel, StaticModelDrafter, StaticTarget, compiled_pair, static_variant
from mmspec.static_trees import static_tree_mask
from mmspec.targets import Target
from mmspec.testing import assert_distribution_preserved, exact_continuation_distribution, tiny_llama
from mmspec.trees import DraftTree
from mmspec.types import Verdict
from tests.test_tree_drafting import tiny_qwen2

TREES = [TreeConfig(num_nodes=8, top_k=2, depth=4), TreeConfig(num_nodes=20, top_k=4, depth=5),
         TreeConfig(num_nodes=3, top_k=3, depth=1)]


@pytest.fixture(autouse=True, scope="module")
def forget_compiled_graphs():
    """As in `test_static_compiled.py`: this module's graphs would crowd later tests' compiled calls."""
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def eager_backend(monkeypatch):
    monkeypatch.setattr(st, "DEFAULT_BACKEND", "eager")


@pytest.fixture(scope="module")
def models():
    return {
        "llama": (tiny_llama(seed=0, initializer_range=0.3), tiny_llama(seed=0, num_layers=1, initializer_range=0.3)),
        "qwen2": (tiny_qwen2(seed=0), tiny_qwen2(seed=2)),
    }


def prompt(seed, vocab=97, length=8):
    return torch.randint(4, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def recording(static_target):
    """Record the width of every compiled tree forward of `static_target` (forwards with a tree mask)."""
    widths = []
    compiled = static_target._steps.forward

    def forward(**inputs):
        if "attention_mask" in inputs:
            widths.append(inputs["input_ids"].shape[1])
        return compiled(**inputs)

    static_target._steps.forward = forward
    return widths


def test_mask_sees_prefix_root_and_ancestors_never_padding():
    tree = DraftTree(tokens=torch.tensor([5, 6, 7]), parents=torch.tensor([-1, -1, 0]))
    allowed = static_tree_mask(tree, past=2, width=6, capacity=10, dtype=torch.float32, device=torch.device("cpu"))[0, 0] == 0
    expected = torch.tensor([
        # prefix  root n0 n1 n2 pad pad | unused slots
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],  # root
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # node 0
        [1, 1, 1, 0, 1, 0, 0, 0, 0, 0],  # node 1
        [1, 1, 1, 1, 0, 1, 0, 0, 0, 0],  # node 2, child of node 0
        [1, 1, 0, 0, 0, 0, 1, 0, 0, 0],  # padding: the prefix and itself
        [1, 1, 0, 0, 0, 0, 0, 1, 0, 0],
    ], dtype=torch.bool)
    assert torch.equal(allowed, expected)


@pytest.mark.parametrize("tree_width", [6, 9, 4], ids=["exact", "padded", "wider-than-built-eager"])
def test_static_tree_verify_matches_eager_and_keeps_the_path(models, tree_width):
    """The padded, compiled tree forward gives the eager tree forward's logits; after the verdict the static cache
    holds the committed prefix and the accepted path (moved into place) as a fresh prefill of them does."""
    model, _ = models["llama"]
    static = StaticTarget(model, widths=(4,), backend="eager", tree_width=tree_width)
    widths = recording(static)
    eager = Target(model)
    ids = prompt(4)
    for wrapped in (static, eager):
        wrapped.start(ids)
    tree = DraftTree(tokens=torch.tensor([11, 12, 13, 14, 15]), parents=torch.tensor([-1, -1, 0, 2, 1]))
    sequence = torch.cat([ids, torch.tensor([[19]])], dim=1)  # the cache holds the prompt; 19 is the newest token
    for path in ([0, 2, 3], [1]):  # two rounds: the second reads the first's kept path, over stale padded slots
        steps = [t.verify(sequence, tree) for t in (static, eager)]
        torch.testing.assert_close(steps[0].logits, steps[1].logits, atol=1e-5, rtol=1e-4)
        verdict = Verdict(num_accepted=torch.tensor([len(path)]), next_token=torch.tensor([20]), path=path)
        for wrapped in (static, eager):
            wrapped.rollback(tree, verdict)
        sequence = torch.cat([sequence, tree.path_tokens(path)[None], torch.tensor([[20]])], dim=1)
        assert static.length == eager.length == sequence.shape[1] - 1
        with torch.no_grad():
            fresh = model(sequence[:, :-1], use_cache=True).past_key_values
        for ours, theirs in zip(static.cache.layers, fresh.layers):
            torch.testing.assert_close(ours.keys[:, :, :static.length], theirs.keys, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(ours.values[:, :, :static.length], theirs.values, atol=1e-5, rtol=1e-4)
    assert widths == ([tree_width] * 2 if tree_width >= tree.size + 1 else [])  # too narrow: eager, unpadded


@pytest.mark.parametrize("config", TREES, ids=["n8k2d4", "n20k4d5", "n3k3d1"])
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_greedy_compiled_tree_equals_generate_and_the_eager_tree(models, name, config):
    target, drafter = models[name]
    ids = prompt(1)
    reference = target.generate(ids, max_new_tokens=24, do_sample=False)
    for source in (drafter, target):  # a weak drafter (rejections) and the target itself (long paths)
        eager = speculative_generate(target, source, ids, max_new_tokens=24, tree=config)
        out = speculative_generate(target, source, ids, max_new_tokens=24, tree=config, compile=True)
        assert isinstance(out.target, StaticTarget) and out.target.tree_width == config.num_nodes + 1
        assert isinstance(out.drafter.lm, StaticCachedModel)
        assert torch.equal(out.sequences, reference[:, : out.sequences.shape[1]])
        assert out.sequences.shape == reference.shape or int(out.sequences[0, -1]) == 3
        assert torch.equal(out.sequences, eager.sequences)
        for count in ("rounds", "drafted", "accepted", "new_tokens", "target_forwards", "drafter_forwards"):
            assert getattr(out.stats, count) == getattr(eager.stats, count), count
    assert out.stats.accepted > 0 and out.stats.target_forwards < 24


def test_every_tree_round_runs_the_compiled_forward(models):
    target, _ = models["llama"]
    config = TREES[1]
    static, _ = compiled_pair(target, target, FixedDraftLength(5), config)
    widths = recording(static)
    ids = prompt(2)
    out = speculative_generate(static, target, ids, max_new_tokens=30, tree=config)
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=30, do_sample=False))
    assert widths == [config.num_nodes + 1] * (out.stats.target_forwards - 1)  # all but the prefill


def test_drafter_levels_run_compiled_and_its_cache_keeps_the_path(models):
    """A model drafter's tree levels are padded to top_k nodes and run compiled over its static cache; after the call
    its cache holds what a fresh prefill of the tokens it recorded holds."""
    target, drafter = models["llama"]
    config = TREES[1]
    _, static_drafter = compiled_pair(target, drafter, FixedDraftLength(5), config)
    assert isinstance(static_drafter, StaticModelDrafter) and static_drafter.lm.widths == (1, 2, config.top_k)
    widths = recording(static_drafter.lm)
    ids = prompt(3)
    out = speculative_generate(target, static_drafter, ids, max_new_tokens=24, tree=config, compile=True)
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=24, do_sample=False)[:, :out.sequences.shape[1]])
    assert widths and set(widths) <= {1, 2, config.top_k} and config.top_k in widths
    assert out.stats.accepted > 0 and out.stats.rounds > 2
    lm = out.drafter.lm
    tokens = out.drafter.cached_tokens[None]
    with torch.no_grad():
        fresh = drafter(tokens, use_cache=True).past_key_values
    assert lm.length == tokens.shape[1]
    for ours, theirs in zip(lm.cache.layers, fresh.layers):
        torch.testing.assert_close(ours.keys[:, :, :lm.length], theirs.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ours.values[:, :, :lm.length], theirs.values, atol=1e-5, rtol=1e-4)


def test_greedy_compiled_tree_with_processors(models):
    """Logits processors see each node's own prefix, as on the eager tree path."""
    target, drafter = models["llama"]
    ids = prompt(5)
    settings = dict(repetition_penalty=1.8, no_repeat_ngram_size=2, min_new_tokens=10)
    reference = target.generate(ids, max_new_tokens=20, do_sample=False, **settings)
    for source in (drafter, target):
        out = speculative_generate(target, source, ids, max_new_tokens=20, tree=TREES[1], compile=True, **settings)
        assert torch.equal(out.sequences, reference)


def test_the_cache_grows_mid_call(models):
    """A call longer than the first cache bucket moves its states into a larger static cache between tree rounds."""
    target = tiny_llama(seed=0, initializer_range=0.3, eos_token_id=None)
    ids = prompt(6)
    config = TreeConfig(num_nodes=6, top_k=2, depth=3)
    out = speculative_generate(target, target, ids, max_new_tokens=160, tree=config, compile=True)
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=160, do_sample=False))
    assert out.target.cache.get_max_length() == 256 and out.target.length == out.sequences.shape[1] - 1


def test_inductor_compiled_tree(models, monkeypatch):
    monkeypatch.setattr(st, "DEFAULT_BACKEND", "inductor")
    target, drafter = models["llama"]
    ids = prompt(7)
    config = TreeConfig(num_nodes=5, top_k=2, depth=3)
    out = speculative_generate(target, drafter, ids, max_new_tokens=16, tree=config, compile=True)
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=16, do_sample=False))
    assert out.target._steps.backend == "inductor"


VOCAB = 5
NEW_TOKENS = 4
SAMPLING_PROMPT = torch.tensor([[1, 2, 0, 4]])


def test_tree_sampling_matches_target():
    target = tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=3, initializer_range=0.6, eos_token_id=None)
    drafter = tiny_llama(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=4, initializer_range=0.6, eos_token_id=None)
    tree = TreeConfig(num_nodes=6, top_k=2, depth=2)
    static, static_drafter = compiled_pair(target, drafter, FixedDraftLength(5), tree)
    assert isinstance(static_drafter, StaticModelDrafter)

    def draw(generator):
        out = speculative_generate(static, static_drafter, SAMPLING_PROMPT, max_new_tokens=NEW_TOKENS, do_sample=True,
                                   generator=generator, tree=tree)
        return tuple(out.sequences[0, SAMPLING_PROMPT.shape[1]:].tolist())

    exact = exact_continuation_distribution(target, SAMPLING_PROMPT, NEW_TOKENS, SamplingConfig(do_sample=True))
    assert_distribution_preserved(draw, exact, num_draws=600, seed=11)


def test_trees_on_other_targets_are_refused(models):
    target, drafter = models["llama"]

    class CustomTarget(Target):
        pass

    with pytest.raises(MMSpecError, match="draft trees only on plain text targets"):
        speculative_generate(CustomTarget(target), drafter, prompt(0), max_new_tokens=4, tree=TREES[0], compile=True)
    variant = static_variant(CustomTarget)(target)
    variant.setup_static((4,), backend="eager")
    with pytest.raises(MMSpecError, match="draft trees only on plain text targets"):
        speculative_generate(variant, drafter, prompt(0), max_new_tokens=4, tree=TREES[0])
    with pytest.raises(MMSpecError, match="one sequence"):
        speculative_generate(target, drafter, torch.cat([prompt(0), prompt(1)]), max_new_tokens=4, tree=TREES[0],
                             compile=True, attention_mask=torch.ones(2, 8, dtype=torch.long))


def test_levels_wider_than_the_drafter_was_built_for_run_eagerly(models, monkeypatch):
    """A static drafter built for chains (widths 1 and 2) still grows a top_k = 4 tree: the wider levels run eagerly
    over its static cache, with the mask widened the same way; the output is generate's."""
    target, drafter = models["llama"]
    chain_drafter = StaticModelDrafter(drafter, backend="eager")
    widths = recording(chain_drafter.lm)
    eager_levels = []
    real = static_steps.eager_forward

    def eager_forward(model, head, logits_to_keep, **inputs):
        if "attention_mask" in inputs:
            eager_levels.append(inputs["input_ids"].shape[1])
        return real(model, head, logits_to_keep, **inputs)

    monkeypatch.setattr(static_steps, "eager_forward", eager_forward)
    ids = prompt(8)
    out = speculative_generate(target, chain_drafter, ids, max_new_tokens=20, tree=TREES[1], compile=True)
    eager = speculative_generate(target, drafter, ids, max_new_tokens=20, tree=TREES[1])
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=20, do_sample=False)[:, :out.sequences.shape[1]])
    assert torch.equal(out.sequences, eager.sequences) and out.stats.accepted == eager.stats.accepted
    assert set(widths) <= {1, 2} and eager_levels and min(eager_levels) > 2  # the wider levels, eagerly
