"""What an acceptance rule can judge, declared once, so the loop can refuse a mismatch up front.

A rule is any callable `(proposal or tree, target_logits, sampling, generator) -> Verdict`. It declares
its capabilities either as a `capabilities` class attribute (a rule written as a class) or with the
`declare_rule` decorator (a rule written as a function or closure). A rule that declares nothing is a
chain rule that judges every row's k drafts and needs no draft distribution.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .errors import MMSpecError


@dataclass(frozen=True)
class RuleCapabilities:
    """`ragged_drafts`: honours `Proposal.lengths` (rows of a batch drafting different numbers of tokens).
    `trees`: judges a `DraftTree` (a tree rule) instead of a chain `Proposal`.
    `needs_draft_probs`: reads the drafter's distribution q (`Proposal.probs`); a drafter giving none is refused.
    `settings`: the rule's own parameters (a relaxed rule's thresholds), for reports."""

    ragged_drafts: bool = False
    trees: bool = False
    needs_draft_probs: bool = False
    settings: Mapping[str, Any] = field(default_factory=dict)


CHAIN_RULE = RuleCapabilities()
_DECLARED: weakref.WeakKeyDictionary[Any, RuleCapabilities] = weakref.WeakKeyDictionary()

RuleT = TypeVar("RuleT", bound=Callable[..., Any])


def declare_rule(capabilities: RuleCapabilities) -> Callable[[RuleT], RuleT]:
    """Decorator: record `capabilities` for a rule function (the function itself is returned unchanged)."""

    def register(rule: RuleT) -> RuleT:
        _DECLARED[rule] = capabilities
        return rule

    return register


def capabilities_of(rule: Any) -> RuleCapabilities:
    """A rule's declared capabilities (a chain rule's defaults when it declares none)."""
    declared = getattr(type(rule), "capabilities", None)
    if isinstance(declared, RuleCapabilities):
        return declared
    try:
        return _DECLARED.get(rule, CHAIN_RULE)
    except TypeError:  # not weak-referenceable: it cannot have been declared
        return CHAIN_RULE


def check_rule_shape(rule: Any, *, tree: bool) -> RuleCapabilities:
    """Refuse, with one line, what is not a rule, a tree rule on chains and a chain rule on trees."""
    if not callable(rule):
        raise MMSpecError(f"rule must be an acceptance rule (a callable such as mmspec.greedy_match or "
                          f"mmspec.speculative_sampling), got {type(rule).__name__} {rule!r:.60}")
    capabilities = capabilities_of(rule)
    name = getattr(rule, "__name__", type(rule).__name__)
    if tree and not capabilities.trees:
        raise MMSpecError(f"the acceptance rule {name} judges chains, not draft trees; pass a tree rule "
                          "(greedy_tree_match, tree_speculative_sampling) or leave tree unset")
    if not tree and capabilities.trees:
        raise MMSpecError(f"the acceptance rule {name} judges draft trees; pass tree=TreeConfig(...) or a chain rule")
    return capabilities


def check_proposal(capabilities: RuleCapabilities, rule: Any, proposal: Any) -> None:
    """Refuse a round's proposal the rule cannot judge: ragged rows, or no draft distribution when it needs one."""
    name = getattr(rule, "__name__", type(rule).__name__)
    if proposal.lengths is not None and not capabilities.ragged_drafts:
        raise MMSpecError(f"rows drafted different numbers of tokens, which the acceptance rule {name} cannot judge "
                          "(it does not declare ragged_drafts); use the default rule or a batch of one")
    if capabilities.needs_draft_probs and proposal.length and proposal.probs is None:
        raise MMSpecError(f"the acceptance rule {name} needs the drafter's probabilities, which this drafter does not "
                          "give (deterministic drafts); use a rule that takes one-hot drafts or a sampling drafter")
