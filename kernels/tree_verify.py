"""Draft-tree verification in one kernel per tree: greedy path matching and recursive rejection sampling.

Shapes (B trees of up to N nodes, V tokens; the layout of `mmspec.trees.DraftTree`, batched and padded):

    tokens        [B, N]          int64   node i's token
    parents       [B, N]          int64   node i's parent (-1: a child of the root, the newest committed
                                          token); a parent comes before its children, siblings are tried
                                          eldest (lowest index) first
    num_nodes     [B] | None      int64   nodes per tree (ragged); nodes at or past it are padding. None: N
    target        [B, N + 1]      int     greedy: the target's argmax after the root (row 0) and after node i
                  [B, N + 1, V]   float   (row i + 1), or its logits (argmaxes taken only along the path)
    target_probs  [B, N + 1, V]   float   sampled: p, rows as above
    draft_probs   [B, N, V] | None        sampled children: draft_probs[:, c] for the eldest child c of a node
                                          is the q its children were drawn from, without replacement; the
                                          other rows are not read. None: deterministic children (top-k)
    uniforms      [B, N]          float32 U[0, 1), used in the order children are tried (the j-th tried
                                          child uses uniforms[:, j]; a tree tries each node at most once)
    exponentials  [B, V]          float32 Exp(1) noise for the one token drawn per tree
    ->  path [B, N] int64 (accepted nodes, root's child first, then -1), num_accepted [B], next_token [B]

The sampled rule is `mmspec.tree_rules.tree_speculative_sampling` (proof of losslessness there): at a
node with target p, child c (token x) is kept when u * q(x) < p(x); on a rejection p becomes
norm(max(p - q, 0)) and q loses x (renormalised); with no child kept the token is drawn from p. Masses
are summed in fixed point (`triton_launch.fixed_point_mass`), so kernel and reference agree bit for bit.
Kernels: one program per tree, no host synchronisation, fixed shapes (CUDA-graph safe); the sampled one
keeps the current p and q of a node in two [B, V] work buffers.
"""

from __future__ import annotations

import torch

from mmspec.errors import MMSpecError

from .triton_launch import (
    block_size,
    built,
    draw_exponentials,
    draw_uniforms,
    fixed_point_mass,
    race_scores,
    runs_triton,
)

try:
    import triton
except ImportError:
    triton = None


# --------------------------------------------------------------------------- shapes


def check_tree(tokens: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor | None) -> torch.Tensor:
    """Checks shapes (not values: that would synchronise); returns num_nodes as int64 [B] clamped to [0, N]."""
    if tokens.dim() != 2 or tokens.dtype.is_floating_point or parents.shape != tokens.shape:
        raise MMSpecError(f"tokens and parents must be integer tensors [B, N] of one shape, got {tuple(tokens.shape)} "
                          f"and {tuple(parents.shape)}")
    batch, size = tokens.shape
    if num_nodes is None:
        return torch.full((batch,), size, dtype=torch.long, device=tokens.device)
    if num_nodes.shape != (batch,):
        raise MMSpecError(f"num_nodes must be [B] = [{batch}], got {tuple(num_nodes.shape)}")
    return num_nodes.to(device=tokens.device, dtype=torch.long).clamp(0, size)


def check_rows(name: str, tensor: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    if tensor is not None and tuple(tensor.shape[:len(shape)]) != shape:
        raise MMSpecError(f"{name} must start with dimensions {list(shape)}, got {tuple(tensor.shape)}")


def children(parents: list[int], count: int, node: int) -> list[int]:
    return [c for c in range(count) if parents[c] == node]


# --------------------------------------------------------------------------- greedy


def greedy_tree_reference(tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor,
                          num_nodes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the root, follow the eldest child equal to the target's argmax; then take the argmax there."""
    counts = check_tree(tokens, parents, num_nodes)
    batch, size = tokens.shape
    from_logits = target.dtype.is_floating_point
    check_rows("target", target, (batch, size + 1))
    choice = (target.argmax(-1) if from_logits else target).long()
    path = torch.full((batch, size), -1, dtype=torch.long, device=tokens.device)
    num_accepted = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    next_token = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    for b in range(batch):
        wanted, toks, pars, count = choice[b].tolist(), tokens[b].tolist(), parents[b].tolist(), int(counts[b])
        node, depth = -1, 0
        while True:
            match = next((c for c in children(pars, count, node) if toks[c] == wanted[node + 1]), None)
            if match is None:
                break
            path[b, depth] = match
            node, depth = match, depth + 1
        num_accepted[b], next_token[b] = depth, wanted[node + 1]
    return path, num_accepted, next_token


def greedy_tree_verify(tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor,
                       num_nodes: torch.Tensor | None = None, *, use_triton: bool | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy tree verification: Triton on CUDA tensors, the torch reference elsewhere. Returns
    (path [B, N], num_accepted [B], next_token [B])."""
    if not runs_triton(target, use_triton):
        return greedy_tree_reference(tokens, parents, target, num_nodes)
    counts = check_tree(tokens, parents, num_nodes)
    batch, size = tokens.shape
    check_rows("target", target, (batch, size + 1))
    if tokens.numel() == 0:  # no nodes (or no trees): the target's choice after the root, without a kernel
        choice = (target.argmax(-1) if target.dtype.is_floating_point else target).long()
        return tokens.long(), torch.zeros_like(choice[:, 0]), choice[:, 0]
    from_logits = target.dtype.is_floating_point
    vocab = int(target.shape[2]) if from_logits else 1
    path = torch.full((batch, size), -1, dtype=torch.long, device=target.device)
    num_accepted = torch.empty(batch, dtype=torch.long, device=target.device)
    next_token = torch.empty(batch, dtype=torch.long, device=target.device)
    built(tree_kernels().greedy_tree_kernel)[(batch,)](
        tokens.long().contiguous(), parents.long().contiguous(), counts, target.contiguous(), path, num_accepted,
        next_token, size, vocab, FROM_LOGITS=from_logits, BLOCK_N=node_block(size), BLOCK=block_size(vocab))
    return path, num_accepted, next_token


# --------------------------------------------------------------------------- sampled


def sampled_tree_decide_reference(
    tokens: torch.Tensor, parents: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor, num_nodes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(path [B, N], num_accepted [B], the distribution [B, V] the next token is drawn from): the
    deterministic half of the sampled rule, which tests compare with the core's tree rule."""
    counts = check_tree(tokens, parents, num_nodes)
    batch, size = tokens.shape
    check_rows("target_probs", target_probs, (batch, size + 1))
    check_rows("uniforms", uniforms, (batch, size))
    if target_probs.dim() != 3:
        raise MMSpecError(f"target_probs must be [B, N + 1, V], got {tuple(target_probs.shape)}")
    vocab = int(target_probs.shape[2])
    check_rows("draft_probs", draft_probs, (batch, size, vocab))
    p_all = target_probs.float()
    path = torch.full((batch, size), -1, dtype=torch.long, device=tokens.device)
    num_accepted = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    final = torch.empty(batch, vocab, dtype=torch.float32, device=target_probs.device)
    for b in range(batch):
        toks, pars, count, trial = tokens[b].tolist(), parents[b].tolist(), int(counts[b]), 0
        node, depth = -1, 0
        while True:
            kids = children(pars, count, node)
            p = p_all[b, node + 1]
            q = draft_probs[b, kids[0]].float() if draft_probs is not None and kids else None
            kept = None
            for child in kids:
                x = toks[child]
                q_x = q[x] if q is not None else torch.ones((), device=p.device)
                if bool(uniforms[b, trial].float() * q_x < p[x]):
                    kept = child
                    break
                trial += 1
                one_hot = torch.zeros_like(p)
                one_hot[x] = 1.0
                residual = (p - (q if q is not None else one_hot)).clamp(min=0)
                mass = fixed_point_mass(residual)
                p = residual / mass if mass > 0 else p
                if q is not None:  # the next sibling was drawn without this one
                    q = q.masked_fill(one_hot > 0, 0.0)
                    q_mass = fixed_point_mass(q)
                    q = q / q_mass if q_mass > 0 else q
            if kept is None:
                final[b] = p
                break
            trial += 1
            path[b, depth] = kept
            node, depth = kept, depth + 1
        num_accepted[b] = depth
    return path, num_accepted, final


def sampled_tree_reference(
    tokens: torch.Tensor, parents: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor, exponentials: torch.Tensor, num_nodes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling over a tree (SpecInfer; EAGLE) with the caller's noise; lossless.
    Returns (path [B, N], num_accepted [B], next_token [B])."""
    check_rows("exponentials", exponentials, (tokens.shape[0], target_probs.shape[-1]))
    path, num_accepted, final = sampled_tree_decide_reference(tokens, parents, target_probs, draft_probs, uniforms,
                                                              num_nodes)
    return path, num_accepted, race_scores(final, exponentials.float()).argmax(-1)


def sampled_tree_verify(
    tokens: torch.Tensor, parents: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor | None = None,
    num_nodes: torch.Tensor | None = None, *, generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None, exponentials: torch.Tensor | None = None, use_triton: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sampled tree verification: Triton on CUDA tensors, the torch reference elsewhere. Noise not given is
    drawn from `generator`: uniforms [B, N], then exponentials [B, V]."""
    counts = check_tree(tokens, parents, num_nodes)
    batch, size = tokens.shape
    if target_probs.dim() != 3:
        raise MMSpecError(f"target_probs must be [B, N + 1, V], got {tuple(target_probs.shape)}")
    vocab, device = int(target_probs.shape[2]), target_probs.device
    if uniforms is None:
        uniforms = draw_uniforms((batch, size), generator, device)
    if exponentials is None:
        exponentials = draw_exponentials((batch, vocab), generator, device)
    if not runs_triton(target_probs, use_triton):
        return sampled_tree_reference(tokens, parents, target_probs, draft_probs, uniforms, exponentials, num_nodes)
    if tokens.numel() == 0:  # no nodes (or no trees): a draw after the root, without a kernel
        check_rows("exponentials", exponentials, (batch, vocab))
        token = race_scores(target_probs[:, 0].float(), exponentials.float()).argmax(-1)
        return tokens.long(), torch.zeros_like(token), token
    check_rows("target_probs", target_probs, (batch, size + 1))
    check_rows("draft_probs", draft_probs, (batch, size, vocab))
    check_rows("uniforms", uniforms, (batch, size))
    check_rows("exponentials", exponentials, (batch, vocab))
    path = torch.full((batch, size), -1, dtype=torch.long, device=device)
    num_accepted = torch.empty(batch, dtype=torch.long, device=device)
    next_token = torch.empty(batch, dtype=torch.long, device=device)
    p = target_probs.contiguous()
    work = torch.empty((2, batch, vocab), dtype=torch.float32, device=device)  # a node's current p and q
    built(tree_kernels().sampled_tree_kernel)[(batch,)](
        tokens.long().contiguous(), parents.long().contiguous(), counts, p,
        draft_probs.contiguous() if draft_probs is not None else p, uniforms.float().contiguous(),
        exponentials.float().contiguous(), work[0], work[1], path, num_accepted, next_token, size, vocab,
        HAS_Q=draft_probs is not None, BLOCK_N=node_block(size), BLOCK=block_size(vocab, 2048))
    return path, num_accepted, next_token


def node_block(size: int) -> int:
    """The node tile: all of a tree's nodes at once (a power of two, at least 16)."""
    return max(16, triton.next_power_of_2(size) if triton is not None else 16)


def tree_kernels():
    """The Triton kernels' module, imported on first use (it needs Triton)."""
    from . import tree_verify_kernels as kernels

    return kernels
