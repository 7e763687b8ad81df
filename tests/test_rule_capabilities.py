"""Rules declare what they can judge; the decoder refuses mismatches with one MMSpecError; drafts from a
non-finite draft distribution count as rejected, so the target's law is kept."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from mmspec import (
    MMSpecError,
    PromptLookupDrafter,
    SpeculativeDecoder,
    speculative_generate,
)
from mmspec.drafters import Drafter, ModelDrafter
from mmspec.rule_capabilities import RuleCapabilities, capabilities_of, declare_rule
from mmspec.rules import (
    drop_nonfinite_drafts,
    greedy_match,
    speculative_sampling,
    target_choice,
)
from mmspec.sampling import SamplingConfig
from mmspec.testing import chi_square, tiny_llama
from mmspec.tree_rules import greedy_tree_match, tree_speculative_sampling
from mmspec.trees import DraftTree, TreeConfig
from mmspec.types import Proposal

PROMPT = torch.tensor([[1, 17, 5, 44, 9, 61, 23, 8]])


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, initializer_range=0.3, eos_token_id=3)


def undeclared_rule(proposal, target_logits, sampling, generator):
    return greedy_match(proposal, target_logits, sampling, generator)


def test_core_rules_declare_their_capabilities():
    assert capabilities_of(greedy_match).ragged_drafts and not capabilities_of(greedy_match).trees
    assert capabilities_of(speculative_sampling).ragged_drafts
    assert capabilities_of(target_choice).ragged_drafts
    assert capabilities_of(greedy_tree_match).trees and capabilities_of(tree_speculative_sampling).trees
    assert capabilities_of(undeclared_rule) == RuleCapabilities()


def test_a_rule_class_declares_capabilities():
    class Strict:
        capabilities = RuleCapabilities(ragged_drafts=True, settings={"strict": True})

        def __call__(self, proposal, target_logits, sampling, generator):
            return greedy_match(proposal, target_logits, sampling, generator)

    assert capabilities_of(Strict()).settings == {"strict": True}


def test_tree_rule_on_chains_is_refused(target):
    with pytest.raises(MMSpecError, match="judges draft trees"):
        SpeculativeDecoder(target, target, rule=greedy_tree_match)


def test_chain_rule_on_trees_is_refused(target):
    with pytest.raises(MMSpecError, match="judges chains, not draft trees"):
        speculative_generate(target, target, PROMPT, max_new_tokens=4, rule=greedy_match, tree=TreeConfig(8, 2, 3))


def test_chain_only_rule_on_ragged_batch_is_refused(target):
    prompts = torch.tensor([[5, 6, 5, 6, 5, 6, 5], [0, 9, 10, 11, 12, 13, 14]])
    mask = torch.tensor([[1] * 7, [0] + [1] * 6])
    with pytest.raises(MMSpecError, match="does not declare ragged_drafts"):
        speculative_generate(target, PromptLookupDrafter(), prompts, attention_mask=mask, max_new_tokens=6,
                             rule=undeclared_rule)


def test_rule_needing_draft_probs_with_deterministic_drafter_is_refused(target):
    @declare_rule(RuleCapabilities(needs_draft_probs=True))
    def needs_q(proposal, target_logits, sampling, generator):
        return speculative_sampling(proposal, target_logits, sampling, generator)

    with pytest.raises(MMSpecError, match="needs the drafter's probabilities"):
        speculative_generate(target, PromptLookupDrafter(), torch.tensor([[5, 6, 5, 6, 5, 6, 5]]), max_new_tokens=6,
                             rule=needs_q)


# --- non-finite draft distributions --------------------------------------------------------------------------

V = 6
P_LOGITS = torch.tensor([1.2, 0.3, -0.5, 0.9, 0.0, -1.0])


def first_token_law(rule_input, draws=40000, seed=0):
    """The law of the first committed token when every row drafts token 0 from q (NaN in entry 5)."""
    q = torch.full((draws, 1, V), 0.1)
    q[:, 0, 0] = 0.5
    q[:, 0, 5] = float("nan")  # not the drafted token: a rule reading q_draft alone would not notice
    proposal = rule_input(Proposal(tokens=torch.zeros(draws, 1, dtype=torch.long), probs=q))
    logits = P_LOGITS.expand(draws, 2, V)
    verdict = speculative_sampling(proposal, logits, SamplingConfig(do_sample=True), torch.Generator().manual_seed(seed))
    first = torch.where(verdict.num_accepted > 0, proposal.tokens[:, 0], verdict.next_token)
    return chi_square(Counter(first.tolist()), dict(enumerate(P_LOGITS.softmax(-1).tolist())))


def test_nonfinite_draft_probs_count_as_rejected_and_keep_the_law():
    assert first_token_law(drop_nonfinite_drafts).p_value > 1e-3


def test_control_nonfinite_draft_probs_reaching_the_rule_break_the_law():
    assert first_token_law(lambda proposal: proposal).p_value < 1e-6


def test_drop_nonfinite_drafts_cuts_one_row_and_shortens_batch_rows():
    q = torch.full((1, 3, V), 1 / V)
    q[0, 1, 2] = float("inf")
    one = drop_nonfinite_drafts(Proposal(tokens=torch.tensor([[1, 2, 3]]), probs=q))
    assert one.tokens.tolist() == [[1]] and one.lengths is None
    both = drop_nonfinite_drafts(Proposal(tokens=torch.tensor([[1, 2, 3], [4, 5, 0]]), probs=torch.cat([q, torch.full((1, 3, V), 1 / V)]),
                                          lengths=torch.tensor([3, 2])))
    assert both.lengths.tolist() == [1, 2] and bool(torch.isfinite(both.probs).all())


class NanDrafter(Drafter):
    """A sampling model drafter whose q turns NaN at its second draft."""

    def __init__(self, model):
        self.inner = ModelDrafter(model)
        self.vocab_size = self.inner.vocab_size

    def begin(self, view, model_inputs):
        self.inner.begin(view, model_inputs)

    def propose(self, view):
        proposal = self.inner.propose(view)
        if proposal.probs is not None and proposal.length > 1:
            probs = proposal.probs.clone()
            probs[:, 1:, -1] = float("nan")
            proposal = Proposal(tokens=proposal.tokens, probs=probs)
        return proposal

    def observe(self, view, verdict, target_step):
        self.inner.observe(view, verdict, target_step)


def test_loop_survives_nan_draft_probs(target):
    small = tiny_llama(seed=1, num_layers=1, hidden_size=32, initializer_range=0.3, eos_token_id=3)
    out = speculative_generate(target, NanDrafter(small), PROMPT, max_new_tokens=12, do_sample=True,
                               generator=torch.Generator().manual_seed(0), num_draft_tokens=4)
    assert out.sequences.shape[1] > PROMPT.shape[1]
    assert out.stats.accepted <= out.stats.rounds  # no draft past the first of a round was ever judged


def test_tree_rule_stops_at_a_nonfinite_child_distribution():
    tree = DraftTree(tokens=torch.tensor([0, 1]), parents=torch.tensor([-1, -1]),
                     probs=torch.tensor([[float("nan")] * V, [1 / V] * V]))
    logits = P_LOGITS.expand(1, 3, V)
    counts = Counter()
    generator = torch.Generator().manual_seed(0)
    for _ in range(4000):
        verdict = tree_speculative_sampling(tree, logits, SamplingConfig(do_sample=True), generator)
        assert verdict.path == []
        counts[int(verdict.next_token)] += 1
    assert chi_square(counts, dict(enumerate(P_LOGITS.softmax(-1).tolist()))).p_value > 1e-3
