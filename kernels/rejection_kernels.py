"""Triton kernels of `rejection` (shapes, rules and references there); one program per row.

No `from __future__ import annotations` here: Triton reads the `tl.constexpr` annotations as objects.
"""

import triton.language as tl


def greedy_chain_kernel(draft_ptr, length_ptr, target_ptr, num_ptr, next_ptr, K, V,
                        FROM_LOGITS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    length = tl.minimum(tl.maximum(tl.load(length_ptr + row), 0), K)
    n = length * 0
    choice = n - 1
    go = n <= length
    while go:  # one target position per pass; stops at the first mismatch or after the bonus position
        if FROM_LOGITS:
            base = target_ptr + (row * (K + 1) + n) * V
            best = (n * 0).to(tl.float32) - float("inf")
            best_at = n * 0
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                vals = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
                block_best, block_at = tl.max(vals, axis=0, return_indices=True, return_indices_tie_break_left=True)
                better = block_best > best  # strict: an earlier tile keeps a tie (first index, as torch.argmax)
                best = tl.where(better, block_best, best)
                best_at = tl.where(better, (start + block_at).to(tl.int64), best_at)
            choice = best_at
        else:
            choice = tl.load(target_ptr + row * (K + 1) + n).to(tl.int64)
        drafted = tl.load(draft_ptr + row * K + n, mask=n < length, other=-1).to(tl.int64)
        ok = (n < length) & (drafted == choice)
        n = tl.where(ok, n + 1, n)
        go = ok
    tl.store(num_ptr + row, n)
    tl.store(next_ptr + row, choice)


def sampled_chain_kernel(draft_ptr, length_ptr, p_ptr, q_ptr, accept_p_ptr, accept_q_ptr, excluded_ptr,
                         uniform_ptr, noise_ptr, num_ptr, next_ptr, K, V,
                         HAS_Q: tl.constexpr, HAS_ACCEPT_P: tl.constexpr, HAS_ACCEPT_Q: tl.constexpr,
                         HAS_EXCLUDED: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    length = tl.minimum(tl.maximum(tl.load(length_ptr + row), 0), K)
    n = length * 0
    go = n < length
    while go:  # acceptance tests, left to right, until the first rejection
        slot = row * K + n
        x = tl.load(draft_ptr + slot).to(tl.int64)
        if HAS_ACCEPT_P:
            target_mass = tl.load(accept_p_ptr + slot).to(tl.float32)
        else:
            target_mass = tl.load(p_ptr + (row * (K + 1) + n) * V + x).to(tl.float32)
        if HAS_ACCEPT_Q:
            draft_mass = tl.load(accept_q_ptr + slot).to(tl.float32)
        elif HAS_Q:
            draft_mass = tl.load(q_ptr + slot * V + x).to(tl.float32)
        else:
            draft_mass = target_mass * 0.0 + 1.0
        ok = tl.load(uniform_ptr + slot) * draft_mass < target_mass
        n = tl.where(ok, n + 1, n)
        go = ok & (n < length)
    rejected = n < length
    slot = row * K + tl.minimum(n, K - 1)
    x = tl.load(draft_ptr + slot, mask=rejected, other=-1).to(tl.int64)
    p_row = p_ptr + (row * (K + 1) + n) * V
    # One pass over V races three candidates at once (residual, p without excluded tokens, p); the first
    # with mass wins, so each weight is read once.
    best_r = (n * 0).to(tl.float32) - 3.0
    best_kept = best_r
    best_p = best_r
    at_r = n * 0
    at_kept = at_r
    at_p = at_r
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < V
        p = tl.load(p_row + offs, mask=inside, other=0.0).to(tl.float32)
        if HAS_Q:
            q = tl.load(q_ptr + slot * V + offs, mask=inside & rejected, other=0.0).to(tl.float32)
        else:
            q = tl.where((offs == x) & rejected, 1.0, 0.0)
        residual = tl.maximum(p - q, 0.0)
        kept = p
        if HAS_EXCLUDED:
            drop = tl.load(excluded_ptr + slot * V + offs, mask=inside & rejected, other=0) != 0
            residual = tl.where(drop, 0.0, residual)
            kept = tl.where(drop, 0.0, p)
        noise = tl.load(noise_ptr + row * V + offs, mask=inside, other=1.0)
        score = tl.where(inside, tl.where(residual > 0, tl.math.div_rn(residual, noise), -1.0), -2.0)
        block_best, block_at = tl.max(score, axis=0, return_indices=True, return_indices_tie_break_left=True)
        better = block_best > best_r  # strict: an earlier tile keeps a tie (first index, as torch.argmax)
        best_r = tl.where(better, block_best, best_r)
        at_r = tl.where(better, (start + block_at).to(tl.int64), at_r)
        score = tl.where(inside, tl.where(p > 0, tl.math.div_rn(p, noise), -1.0), -2.0)
        block_best, block_at = tl.max(score, axis=0, return_indices=True, return_indices_tie_break_left=True)
        better = block_best > best_p
        best_p = tl.where(better, block_best, best_p)
        at_p = tl.where(better, (start + block_at).to(tl.int64), at_p)
        if HAS_EXCLUDED:
            score = tl.where(inside, tl.where(kept > 0, tl.math.div_rn(kept, noise), -1.0), -2.0)
            block_best, block_at = tl.max(score, axis=0, return_indices=True, return_indices_tie_break_left=True)
            better = block_best > best_kept
            best_kept = tl.where(better, block_best, best_kept)
            at_kept = tl.where(better, (start + block_at).to(tl.int64), at_kept)
    if HAS_EXCLUDED:
        token = tl.where(best_kept > -1.0, at_kept, at_p)
    else:
        token = at_p
    token = tl.where(best_r > -1.0, at_r, token)
    tl.store(num_ptr + row, n)
    tl.store(next_ptr + row, token)
