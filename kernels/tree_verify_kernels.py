"""Triton kernels of `tree_verify` (shapes, rules and references there); one program per tree.

No `from __future__ import annotations` here: Triton reads the `tl.constexpr` annotations as objects.
"""

import triton.language as tl

TO_UNITS = tl.constexpr(72057594037927936.0)  # 2**56: `triton_launch.FIXED_POINT_BITS`
FROM_UNITS = tl.constexpr(1.0 / 72057594037927936.0)


def greedy_tree_kernel(tokens_ptr, parents_ptr, count_ptr, target_ptr, path_ptr, num_ptr, next_ptr, N, V,
                       FROM_LOGITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    count = tl.minimum(tl.maximum(tl.load(count_ptr + row), 0), N)
    idx = tl.arange(0, BLOCK_N).to(tl.int64)
    inside = idx < count
    parents = tl.load(parents_ptr + row * N + idx, mask=inside, other=-2).to(tl.int64)
    tokens = tl.load(tokens_ptr + row * N + idx, mask=inside, other=-1).to(tl.int64)
    node = count * 0 - 1
    depth = count * 0
    choice = node
    go = node < 0
    while go:  # one level per pass: the target's choice after `node`, then the eldest child that matches it
        if FROM_LOGITS:
            base = target_ptr + (row * (N + 1) + node + 1) * V
            best = (node * 0).to(tl.float32) - float("inf")
            best_at = node * 0
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                vals = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
                block_best, block_at = tl.max(vals, axis=0, return_indices=True, return_indices_tie_break_left=True)
                better = block_best > best  # strict: an earlier tile keeps a tie (first index, as torch.argmax)
                best = tl.where(better, block_best, best)
                best_at = tl.where(better, (start + block_at).to(tl.int64), best_at)
            choice = best_at
        else:
            choice = tl.load(target_ptr + row * (N + 1) + node + 1).to(tl.int64)
        child = tl.min(tl.where((parents == node) & (tokens == choice), idx, BLOCK_N), axis=0)
        found = child < BLOCK_N
        tl.store(path_ptr + row * N + depth, child, mask=found)
        depth = tl.where(found, depth + 1, depth)
        node = tl.where(found, child, node)
        go = found
    tl.store(num_ptr + row, depth)
    tl.store(next_ptr + row, choice)


def sampled_tree_kernel(tokens_ptr, parents_ptr, count_ptr, p_ptr, q_ptr, uniform_ptr, noise_ptr, p_work_ptr,
                        q_work_ptr, path_ptr, num_ptr, next_ptr, N, V,
                        HAS_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    count = tl.minimum(tl.maximum(tl.load(count_ptr + row), 0), N)
    idx = tl.arange(0, BLOCK_N).to(tl.int64)
    inside = idx < count
    parents = tl.load(parents_ptr + row * N + idx, mask=inside, other=-2).to(tl.int64)
    tokens = tl.load(tokens_ptr + row * N + idx, mask=inside, other=-1).to(tl.int64)
    p_work = p_work_ptr + row * V
    q_work = q_work_ptr + row * V
    node = count * 0 - 1
    depth = count * 0
    trial = depth
    fresh = node < 0  # no rejection yet at `node`: its p and q are the input rows, not the work buffers
    go = fresh
    while go:  # one level per pass
        p_row = p_ptr + (row * (N + 1) + node + 1) * V
        child = tl.min(tl.where(parents == node, idx, BLOCK_N), axis=0)  # the eldest child
        has_child = child < BLOCK_N
        q_row = q_ptr + (row * N + child) * V
        x = tl.sum(tl.where(idx == child, tokens, 0), axis=0)
        p_x = tl.load(p_row + x, mask=has_child, other=0.0).to(tl.float32)
        if HAS_Q:
            q_x = tl.load(q_row + x, mask=has_child, other=0.0).to(tl.float32)
        else:
            q_x = p_x * 0.0 + 1.0
        fresh = node < N
        u = tl.load(uniform_ptr + row * N + trial, mask=has_child, other=1.0)
        trial = tl.where(has_child, trial + 1, trial)
        kept = has_child & (u * q_x < p_x)
        while has_child & (kept == 0):  # `child` was rejected: p <- norm(max(p - q, 0)), q loses x; next sibling
            sibling = tl.min(tl.where((parents == node) & (idx > child), idx, BLOCK_N), axis=0)
            x_next = tl.sum(tl.where(idx == sibling, tokens, 0), axis=0)
            p_units = trial * 0
            q_units = trial * 0
            for start in range(0, V, BLOCK):  # masses, summed in fixed point
                offs = start + tl.arange(0, BLOCK)
                in_v = offs < V
                p = tl.where(fresh, tl.load(p_row + offs, mask=in_v & fresh, other=0.0).to(tl.float32),
                             tl.load(p_work + offs, mask=in_v & (fresh == 0), other=0.0))
                if HAS_Q:
                    q = tl.where(fresh, tl.load(q_row + offs, mask=in_v & fresh, other=0.0).to(tl.float32),
                                 tl.load(q_work + offs, mask=in_v & (fresh == 0), other=0.0))
                    q_units += tl.sum((tl.where(offs == x, 0.0, q) * TO_UNITS).to(tl.int64), axis=0)
                else:
                    q = tl.where(offs == x, 1.0, 0.0)
                p_units += tl.sum((tl.maximum(p - q, 0.0) * TO_UNITS).to(tl.int64), axis=0)
            p_mass = (p_units.to(tl.float64) * FROM_UNITS).to(tl.float32)
            q_mass = (q_units.to(tl.float64) * FROM_UNITS).to(tl.float32)
            p_x = p_mass * 0.0
            q_x = p_x
            for start in range(0, V, BLOCK):  # the new p and q, and their values at the next sibling's token
                offs = start + tl.arange(0, BLOCK)
                in_v = offs < V
                p = tl.where(fresh, tl.load(p_row + offs, mask=in_v & fresh, other=0.0).to(tl.float32),
                             tl.load(p_work + offs, mask=in_v & (fresh == 0), other=0.0))
                if HAS_Q:
                    q = tl.where(fresh, tl.load(q_row + offs, mask=in_v & fresh, other=0.0).to(tl.float32),
                                 tl.load(q_work + offs, mask=in_v & (fresh == 0), other=0.0))
                else:
                    q = tl.where(offs == x, 1.0, 0.0)
                p_new = tl.where(p_mass > 0, tl.math.div_rn(tl.maximum(p - q, 0.0), p_mass), p)
                tl.store(p_work + offs, p_new, mask=in_v)
                p_x += tl.sum(tl.where(offs == x_next, p_new, 0.0), axis=0)
                if HAS_Q:
                    q_left = tl.where(offs == x, 0.0, q)
                    q_new = tl.where(q_mass > 0, tl.math.div_rn(q_left, q_mass), q_left)
                    tl.store(q_work + offs, q_new, mask=in_v)
                    q_x += tl.sum(tl.where(offs == x_next, q_new, 0.0), axis=0)
            tl.debug_barrier()
            if not HAS_Q:
                q_x = p_x * 0.0 + 1.0
            fresh = node < -1
            child = sibling
            x = x_next
            has_child = child < BLOCK_N
            u = tl.load(uniform_ptr + row * N + trial, mask=has_child, other=1.0)
            trial = tl.where(has_child, trial + 1, trial)
            kept = has_child & (u * q_x < p_x)
        tl.store(path_ptr + row * N + depth, child, mask=kept)
        depth = tl.where(kept, depth + 1, depth)
        node = tl.where(kept, child, node)
        go = kept
    # no child kept at `node`: draw from its current p (exponential race)
    p_row = p_ptr + (row * (N + 1) + node + 1) * V
    best = (node * 0).to(tl.float32) - 3.0
    best_at = node * 0
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_v = offs < V
        p = tl.where(fresh, tl.load(p_row + offs, mask=in_v & fresh, other=0.0).to(tl.float32),
                     tl.load(p_work + offs, mask=in_v & (fresh == 0), other=0.0))
        noise = tl.load(noise_ptr + row * V + offs, mask=in_v, other=1.0)
        score = tl.where(in_v, tl.where(p > 0, tl.math.div_rn(p, noise), -1.0), -2.0)
        block_best, block_at = tl.max(score, axis=0, return_indices=True, return_indices_tie_break_left=True)
        better = block_best > best
        best = tl.where(better, block_best, best)
        best_at = tl.where(better, (start + block_at).to(tl.int64), best_at)
    tl.store(num_ptr + row, depth)
    tl.store(next_ptr + row, best_at)
