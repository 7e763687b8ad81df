"""Acceptance rules for draft trees: which root-to-node path the target keeps, and the token after it.

`target_logits` [1, N + 1, V]: row 0 scores the token after the root (the newest committed token),
row i + 1 the token after node i. A tree rule returns a `Verdict` whose `path` lists the accepted
nodes (num_accepted = its length) and whose `next_token` is drawn at the path's last node.

Why `tree_speculative_sampling` keeps the target's distribution exactly. At a node with target
distribution p, let its children c_1, ..., c_m be drawn in that order from the drafter's q without
replacement, so c_i ~ q_i, where q_1 = q and q_{i+1} = q_i with c_i removed, renormalised. Set
p_1 = p and try the children in order: accept c_i with probability min(1, p_i(c_i) / q_i(c_i));
on rejection set p_{i+1} = norm(max(0, p_i - q_i)); if all m are rejected, draw the token from
p_{m+1}. Claim: the token that leaves the node (accepted child or final draw) has distribution p.

Lemma (Leviathan et al. 2023, Theorem 1): for any distributions r, s, drawing x ~ s, keeping it with
probability min(1, r(x)/s(x)), else drawing from norm(max(0, r - s)), yields exactly r.
Proof of the claim by induction from the last child: the procedure started at child i, given
everything before it, yields p_i. For i = m + 1 it is a draw from p_{m+1}. For i <= m, c_i ~ q_i
given the history (that is how it was drawn), it is kept with min(1, p_i/q_i), and otherwise the
rest of the procedure yields p_{i+1} = norm(max(0, p_i - q_i)) by induction; that is the lemma with
r = p_i, s = q_i. At i = 1 the output is p_1 = p. An accepted child then repeats the argument one
level down with the target's distribution at that child, so every committed token follows the
target's distribution given the tokens before it.

Deterministic children (the drafter's top-k, `probs` None) are the case q_i = one-hot on c_i: c_i
is kept with probability p_i(c_i), and p_{i+1} is p_i with c_i removed, renormalised, which is
sampling y from p and following the child equal to y, if any. Greedy (`greedy_tree_match`) follows
the child equal to the target's argmax, so its output is the target's greedy output.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .rule_capabilities import RuleCapabilities, declare_rule
from .sampling import SamplingConfig, probabilities, rand, sample
from .trees import DraftTree
from .types import Verdict


class TreeAcceptanceRule(Protocol):
    def __call__(self, tree: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig,
                 generator: torch.Generator | None) -> Verdict: ...


def children_lists(tree: DraftTree) -> dict[int, list[int]]:
    """Node -> its children, eldest first (the root is -1)."""
    kids: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents.tolist()):
        kids.setdefault(parent, []).append(node)
    return kids


def tree_verdict(path: list[int], next_token: torch.Tensor) -> Verdict:
    accepted = torch.tensor([len(path)], dtype=torch.long, device=next_token.device)
    return Verdict(num_accepted=accepted, next_token=next_token.reshape(1), path=path)


TREE_RULE = RuleCapabilities(trees=True)


@declare_rule(TREE_RULE)
def greedy_tree_match(tree: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig | None = None,
                      generator: torch.Generator | None = None) -> Verdict:
    """From the root, follow the child equal to the target's argmax while there is one; then take the argmax."""
    choice = target_logits[0].argmax(dim=-1)
    wanted, tokens, kids = choice.tolist(), tree.tokens.tolist(), children_lists(tree)
    node = -1
    path: list[int] = []
    while True:
        match = next((c for c in kids.get(node, []) if tokens[c] == wanted[node + 1]), None)
        if match is None:
            return tree_verdict(path, choice[node + 1])
        path.append(match)
        node = match


@declare_rule(TREE_RULE)
def tree_speculative_sampling(tree: DraftTree, target_logits: torch.Tensor, sampling: SamplingConfig,
                              generator: torch.Generator | None) -> Verdict:
    """Recursive rejection over siblings (SpecInfer, Miao et al. 2024; EAGLE, Li et al. 2024); lossless, see
    the module docstring. One uniform per tried child and one multinomial draw per call."""
    p_rows = probabilities(target_logits[0], sampling)
    tokens, kids = tree.tokens.tolist(), children_lists(tree)
    node = -1
    path: list[int] = []
    while True:
        child, p = try_children(kids.get(node, []), tokens, tree.probs, p_rows[node + 1], generator)
        if child is None:
            return tree_verdict(path, sample(p[None], generator))
        path.append(child)
        node = child


def try_children(children: list[int], tokens: list[int], probs: torch.Tensor | None, p: torch.Tensor,
                 generator: torch.Generator | None) -> tuple[int | None, torch.Tensor]:
    """Try `children` in order against target distribution `p` [V]: (the accepted child, p) or (None, the
    residual to draw from)."""
    q = None
    for child in children:
        x = tokens[child]
        if probs is None:
            q = torch.nn.functional.one_hot(torch.tensor(x, device=p.device), p.shape[-1]).to(p.dtype)
        elif q is None:
            q = probs[child].to(p.dtype)
            if not bool(torch.isfinite(q).all()) or bool((q < 0).any()):
                # Not a distribution: stop trying children here and draw from p, which is what trying
                # the rest would yield (see the module docstring), so the law is unchanged.
                return None, p
        u = rand((1,), generator, p.device)
        # Strict, as in the chain rule: a token the target gives probability 0 is never accepted.
        if bool(u * q[x] < p[x]):
            return child, p
        residual = (p - q).clamp(min=0)
        mass = residual.sum()
        p = residual / mass if mass > 0 else p  # no mass only through rounding (p == q): p is then right
        if probs is not None:  # the next sibling was drawn without this one
            q = q.clone()
            q[x] = 0
            q_mass = q.sum()
            q = q / q_mass if q_mass > 0 else q
    return None, p


def default_tree_rule(sampling: SamplingConfig) -> TreeAcceptanceRule:
    return tree_speculative_sampling if sampling.do_sample else greedy_tree_match
