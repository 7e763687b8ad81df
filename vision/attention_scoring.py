"""Text-to-visual attention scores captured during the target's own prefill.

Registered with transformers' `AttentionInterface` (its public extension point for attention
functions), so no model code is patched: while a capture is active, every language-model layer
records how much attention its text query tokens pay to each visual key, then defers to SDPA.
"""

from __future__ import annotations

from contextvars import ContextVar

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SCORING_ATTENTION = "mmspec_text_to_visual_scoring"


def text_to_visual_importance(
    query: torch.Tensor,
    key: torch.Tensor,
    text_positions: torch.Tensor,
    visual_positions: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """Mean attention from text queries to each visual key, summed within each KV-head group.

    query [B, H, L, D] and key [B, H_kv, L, D] cover the whole prompt (positions 0..L-1).
    Returns [B, H_kv, num_visual]: the ranking Sparse-to-Dense keeps the top-K of.
    """
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    q = query[:, :, text_positions].float().view(batch, kv_heads, heads // kv_heads, -1, dim)
    logits = torch.einsum("bkgmd,bkld->bkgml", q, key.float()) * scaling
    # Causal: a text query at position t sees keys 0..t only.
    key_index = torch.arange(key.shape[2], device=key.device)
    future = key_index[None, :] > text_positions[:, None]
    probs = logits.masked_fill(future, float("-inf")).softmax(dim=-1)
    return probs[..., visual_positions].mean(dim=3).sum(dim=2)


class ImportanceCapture:
    """Collects per-layer visual importance during one prefill, for each row of the batch.

    `rows[b]` = (text query positions, visual positions) of row b (columns of the prefilled prompt);
    `per_layer[layer][b]` is row b's importance [1, H_kv, num_visual_b].
    """

    def __init__(self, rows: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.rows = rows
        self.per_layer: dict[int, list[torch.Tensor]] = {}

    def record(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, scaling: float) -> None:
        # Each layer scores on its own device (layers may sit on several GPUs under a device map).
        self.per_layer[layer_idx] = [
            text_to_visual_importance(query[b:b + 1], key[b:b + 1], text.to(query.device), visual.to(query.device), scaling)
            for b, (text, visual) in enumerate(self.rows)
        ]


_active_capture: ContextVar[ImportanceCapture | None] = ContextVar("mmspec_importance_capture", default=None)


def scoring_attention(module, query, key, value, attention_mask, **kwargs):
    capture = _active_capture.get()
    if capture is not None and query.shape[2] > 1:
        scaling = kwargs.get("scaling") or module.scaling
        capture.record(module.layer_idx, query, key, scaling)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(SCORING_ATTENTION, scoring_attention)
AttentionMaskInterface.register(SCORING_ATTENTION, sdpa_mask)
