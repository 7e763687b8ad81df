"""`mmspec generate` with the zoo's text pair: prints what the target's own greedy `generate` gives, and drafts
with the policy the target's card measured best for its drafter unless `--policy` or `-k` says otherwise."""

from __future__ import annotations

import argparse
import json

import pytest

from mmspec.cli import main
from mmspec.cli.generate import draft_policy
from mmspec.policies import ConfidenceStopDraftLength, FixedDraftLength, HeuristicDraftLength
from mmspec.world import heldout_prompts
from mmspec.zoo import entries, load_causal_lm

pytestmark = pytest.mark.skipif("shapes-caption-lm" not in {e.name for e in entries()}, reason="no zoo text pair")


def args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"model": "shapes-caption-lm", "drafter": "shapes-caption-drafter", "policy": None,
                                 "num_draft_tokens": None, **given})


def test_the_default_policy_is_the_cards_and_flags_override_it():
    carded = draft_policy(args())
    assert isinstance(carded, ConfidenceStopDraftLength) and (carded.num_tokens, carded.threshold) == (5, 0.4)
    fixed = draft_policy(args(num_draft_tokens=3))
    assert type(fixed) is FixedDraftLength and fixed.num_tokens == 3
    assert type(draft_policy(args(policy="heuristic"))) is HeuristicDraftLength
    # The card's policy was measured with its own drafter: another drafter drafts a fixed length.
    assert type(draft_policy(args(drafter="prompt-lookup"))) is FixedDraftLength


def test_generate_prints_the_targets_own_greedy_tokens(capsys):
    prompt = heldout_prompts(1, seed=3, scenes="detailed")[0]
    assert main(["generate", prompt, "--json", "--max-new-tokens", "24", "--threads", "1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    target, tokenizer = load_causal_lm("shapes-caption-lm")
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    expected = target.generate(ids, do_sample=False, max_new_tokens=24)[0].tolist()
    assert shown["tokens"] == expected and shown["stats"]["new_tokens"] == len(expected) - ids.shape[1]
    assert shown["stats"]["accepted"] > 0  # the drafter did draft (and the target took some)
