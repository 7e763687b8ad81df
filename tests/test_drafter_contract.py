"""The drafter contract: a drafter written for the retired hooks is refused with one line naming the new one."""

import pytest
import torch

from mmspec import Drafter, MMSpecError, Proposal, speculative_generate
from mmspec.drafters import DraftView
from mmspec.testing import tiny_llama


def test_a_retired_hook_is_refused_naming_its_successor():
    with pytest.raises(MMSpecError, match=r"OldDrafter.propose_batch is never called.*propose \(view.batch\)"):
        class OldDrafter(Drafter):
            def propose(self, view):
                return Proposal.empty(view.sequence)

            def propose_batch(self, batch, max_tokens, sampling, generator):
                return Proposal.empty(batch.tokens)


def test_one_propose_hook_drafts_a_chain():
    class RepeatLast(Drafter):
        def propose(self, view: DraftView) -> Proposal:
            return Proposal(tokens=view.sequence[:, -1:].repeat(1, max(view.max_tokens, 0)))

    target = tiny_llama(num_layers=2, seed=0)
    prompt = torch.tensor([[1, 17, 42, 8, 66, 17, 42, 9]])
    out = speculative_generate(target, RepeatLast(), prompt, max_new_tokens=12, num_draft_tokens=3)
    assert torch.equal(out.sequences, target.generate(prompt, max_new_tokens=12, do_sample=False))
    assert out.stats.drafted > 0
