"""Draft trees: what a tree proposal is, how the target sees it in one forward, and EAGLE-2's expansion.

A tree of N draft nodes hangs below the newest committed token (the root, which is not a node).
Nodes are stored in an order where every parent comes before its children; `parents[i]` is the
index of node i's parent, or -1 when its parent is the root. The target scores the root and all N
nodes in ONE forward: position = committed length - 1 + depth, and each query sees the committed
prefix, the root and its own ancestors (Miao et al. 2024, "SpecInfer"; Li et al. 2024, "EAGLE-2:
Faster Inference of Language Models with Dynamic Draft Trees").

EAGLE-2's dynamic tree: grow the tree level by level, expanding the `top_k` nodes of the newest level
with the highest cumulative confidence (product of the drafter's probabilities along the path) into
their `top_k` most probable children each; after `depth` levels keep the `num_nodes` nodes of
highest cumulative confidence (an ancestor's is never lower than its descendant's, so the kept set
is a tree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .compat import attention_implementation, keep_cache_positions
from .errors import MMSpecError

__all__ = ["DraftTree", "TreeConfig", "grow_tree", "keep_cache_positions", "tree_attention_mask"]


@dataclass(frozen=True)
class TreeConfig:
    """How large a draft tree to grow (EAGLE-2): `depth` levels, `top_k` children per expanded node and
    `top_k` expanded nodes per level, `num_nodes` nodes kept for the target to verify."""

    num_nodes: int = 16
    top_k: int = 4
    depth: int = 5

    def __post_init__(self) -> None:
        for name in ("num_nodes", "top_k", "depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise MMSpecError(f"tree {name} must be an integer >= 1, got {value!r}")

    def limited(self, max_tokens: int) -> "TreeConfig":
        """This config with no path longer than `max_tokens` (the tokens still allowed this call)."""
        return TreeConfig(num_nodes=self.num_nodes, top_k=self.top_k, depth=min(self.depth, max_tokens))


@dataclass
class DraftTree:
    """N draft nodes below the newest committed token.

    tokens [N]; parents [N] (-1: child of the root; a parent always comes before its children);
    probs [N, V] or None: for sampled children, the distribution node i was drawn from, without
    replacement after its elder siblings (earlier nodes with the same parent), as the acceptance rule
    assumes; None when the nodes are deterministic (e.g. a drafter's top-k).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        if self.tokens.dim() != 1 or self.parents.shape != (n,):
            raise MMSpecError(f"a draft tree needs 1-D tokens and parents of one length, got {tuple(self.tokens.shape)} "
                              f"and {tuple(self.parents.shape)}")
        ahead = self.parents >= torch.arange(n, device=self.parents.device)
        if bool(ahead.any()) or bool((self.parents < -1).any()):
            raise MMSpecError("every parent of a draft tree node must come before the node (or be -1, the root)")

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @classmethod
    def empty(cls, device: torch.device) -> "DraftTree":
        nothing = torch.empty(0, dtype=torch.long, device=device)
        return cls(tokens=nothing, parents=nothing.clone())

    def depths(self) -> torch.Tensor:
        """Depth of every node [N] (children of the root: 1)."""
        depth = [0] * self.size
        for i, parent in enumerate(self.parents.tolist()):
            depth[i] = 1 if parent < 0 else depth[parent] + 1
        return torch.tensor(depth, dtype=torch.long, device=self.tokens.device)

    def ancestors(self) -> torch.Tensor:
        """[N, N]: entry (i, j) is True when node j is node i or one of its ancestors."""
        n = self.size
        seen = torch.eye(n, dtype=torch.bool, device=self.tokens.device)
        for i, parent in enumerate(self.parents.tolist()):
            if parent >= 0:
                seen[i] |= seen[parent]
        return seen

    def children(self, node: int) -> list[int]:
        """Indices of the children of `node` (-1: the root), eldest first."""
        return (self.parents == node).nonzero().flatten().tolist()

    def path_tokens(self, path: list[int]) -> torch.Tensor:
        return self.tokens[torch.tensor(path, dtype=torch.long, device=self.tokens.device)] if path else self.tokens[:0]

    def best_branch(self, node: int) -> list[int]:
        """From `node` (-1: the root) down its eldest children: the drafter's own first choice below it."""
        branch = []
        while kids := self.children(node):
            node = kids[0]
            branch.append(node)
        return branch

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node` (empty for the root, -1)."""
        return node_path(node, self.parents.tolist())


def tree_attention_mask(tree: DraftTree, past_length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask [1, 1, N + 1, past + N + 1] for a forward over (root, nodes) on top of `past_length` cached
    positions.

    Every query sees the cached prefix, the root and its own ancestors (itself included). A float mask
    (0 / dtype's min) works with both eager attention (added to the scores) and sdpa.
    """
    n = tree.size
    within = torch.zeros((n + 1, n + 1), dtype=torch.bool, device=device)
    within[:, 0] = True
    within[1:, 1:] = tree.ancestors().to(device)
    queries = n + 1
    allowed = torch.cat([torch.ones((queries, past_length), dtype=torch.bool, device=device), within], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def refuse_flash_attention(model: torch.nn.Module, role: str) -> None:
    """Tree attention needs a 4-D mask; flash-attention kernels take none (they only know causal masks)."""
    config = getattr(model, "config", None)
    implementation = attention_implementation(config) if config is not None else ""
    if "flash" in implementation or "flex" in implementation:
        raise MMSpecError(
            f"tree drafting needs a tree attention mask, which {implementation} cannot take: load the {role} with "
            "attn_implementation='sdpa' or 'eager', or draft chains"
        )


def node_path(node: int, parents: list[int]) -> list[int]:
    """Node indices from the root's child down to `node` (-1, the root: empty), given every node's parent."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


# expand(nodes, tokens, parents) feeds the given new nodes (indices into the growing tree) to the
# drafter and returns their next-token log-probabilities [len(nodes), V].
ExpandFn = Callable[[list[int], torch.Tensor, torch.Tensor], torch.Tensor]


def grow_tree(root_logprobs: torch.Tensor, config: TreeConfig, expand: ExpandFn,
              stop_ids: frozenset[int] | set[int] = frozenset()) -> tuple[DraftTree, list[int]]:
    """EAGLE-2's dynamic tree from the drafter's log-probabilities after the root [V], and for each kept
    node its index in the order nodes were grown (the order `expand` saw them in).

    `expand` is called once per level after the first (at most depth - 1 drafter forwards), with that
    level's `top_k` nodes of highest cumulative confidence. A node holding an end token is never
    expanded (the target stops there). Deterministic: the candidates are the drafter's top-k, so
    `probs` is None and the acceptance rule treats each node as a fixed guess.
    """
    device = root_logprobs.device
    k = min(config.top_k, root_logprobs.shape[-1])
    first = root_logprobs.float().topk(k)
    # Tokens the drafter rules out (-inf: masked or filtered) never become nodes.
    tokens: list[int] = [t for t, s in zip(first.indices.tolist(), first.values.tolist()) if s > float("-inf")]
    scores: list[float] = [s for s in first.values.tolist() if s > float("-inf")]
    parents: list[int] = [-1] * len(tokens)
    level = list(range(len(tokens)))
    for _ in range(2, config.depth + 1):
        level = [i for i in level if tokens[i] not in stop_ids]
        level = sorted(level, key=lambda i: -scores[i])[: config.top_k]
        if not level:
            break
        logprobs = expand(level, torch.tensor(tokens, device=device), torch.tensor(parents, device=device)).float()
        best = logprobs.topk(k, dim=-1)
        candidates = (torch.tensor([scores[i] for i in level], device=device)[:, None] + best.values).flatten()
        # Of the top_k * top_k children, EAGLE-2 carries the top_k best into the tree as the next level.
        keep = candidates.topk(min(config.top_k, candidates.shape[0])).indices.tolist()
        expanded, level = level, []
        for flat in keep:
            row, column = divmod(flat, k)
            if not float(candidates[flat]) > float("-inf"):
                continue
            tokens.append(int(best.indices[row, column]))
            parents.append(expanded[row])
            scores.append(float(candidates[flat]))
            level.append(len(tokens) - 1)
    return _keep_best(tokens, parents, scores, config.num_nodes, device)


def _keep_best(tokens: list[int], parents: list[int], scores: list[float], num_nodes: int,
               device: torch.device) -> tuple[DraftTree, list[int]]:
    """The `num_nodes` nodes of highest cumulative confidence, parents first, as a `DraftTree`.

    A child's score never exceeds its parent's (log-probabilities are <= 0); ties go to the node
    grown first, which is the parent, so the kept nodes form a tree.
    """
    order = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[:num_nodes]
    order.sort()  # grown order: parents before children
    index = {old: new for new, old in enumerate(order)}
    kept_parents = [-1 if parents[i] < 0 else index[parents[i]] for i in order]
    tree = DraftTree(tokens=torch.tensor([tokens[i] for i in order], dtype=torch.long, device=device),
                     parents=torch.tensor(kept_parents, dtype=torch.long, device=device))
    return tree, order


def level_attention_mask(parents: list[int], fed: list[int], level: list[int], past_length: int,
                         dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask [1, 1, len(level), past + len(fed) + len(level)] for a drafter feeding the tree nodes
    `level` on top of a cache holding the committed prefix (`past_length`) and then the nodes `fed`:
    each new node sees the prefix, its fed ancestors and itself."""
    allowed = torch.zeros((len(level), past_length + len(fed) + len(level)), dtype=torch.bool)
    allowed[:, :past_length] = True
    slot = {node: past_length + i for i, node in enumerate(fed)}
    for row, node in enumerate(level):
        allowed[row, past_length + len(fed) + row] = True
        ancestor = parents[node]
        while ancestor >= 0:
            allowed[row, slot[ancestor]] = True
            ancestor = parents[ancestor]
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)
