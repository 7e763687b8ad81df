"""Draft trees on the static-shape path (`compile=True`): one fixed-width tree verification over a static KV cache.

The root and the tree's N nodes (`mmspec.trees`) are padded to a fixed width W (the tree config's num_nodes + 1)
and fed in one compiled forward. The mask covers the whole static cache: each real query sees the committed prefix,
the root and its own ancestors; a padded query sees the prefix and its own slot (its output is dropped); nobody
sees a padded slot or a slot past the forward. Positions come from node depth (padded ones take the root's). The
padded slots are dropped at once by moving the length pointer back; after the verdict the accepted path's states
are moved to the slots right after the root and the pointer is set to the end of the path (`keep_positions`).

A model drafter's tree levels take the same way through `StaticSteps.extend` (a 4-D mask with position ids): each
level (at most top_k nodes) is padded to top_k and its mask widened to the whole cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .trees import DraftTree

if TYPE_CHECKING:
    from .targets import TargetStep


def static_tree_mask(tree: DraftTree, past: int, width: int, capacity: int, dtype: torch.dtype,
                     device: torch.device) -> torch.Tensor:
    """Additive mask [1, 1, width, capacity] for (root, nodes, padding) written at slots past .. past + width - 1 of a
    static cache holding `past` positions."""
    count = tree.size + 1
    allowed = torch.zeros((width, capacity), dtype=torch.bool, device=device)
    allowed[:, :past] = True
    within = torch.zeros((count, count), dtype=torch.bool, device=device)
    within[:, 0] = True
    within[1:, 1:] = tree.ancestors().to(device)
    allowed[:count, past:past + count] = within
    pads = torch.arange(count, width, device=device)
    allowed[pads, past + pads] = True
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


class StaticTreeSteps:
    """Mixin for `StaticTarget`: the tree forward and the tree rollback of `Target`, over the static cache.

    `tree_width` (set by `setup_tree`): the width tree verifications are padded to and compiled at; a tree wider than
    that (a larger config than the target was built for) is verified at its own width, eagerly, over the same cache.
    """

    model: Any
    cache: Any
    output_hidden_states: bool
    _length: int
    _cache_argument: str
    tree_width: int = 0

    def setup_tree(self, tree_width: int | None) -> None:
        self.tree_width = 0 if tree_width is None else int(tree_width)

    def tree_forward(self, tokens: torch.Tensor, positions: torch.Tensor, tree: DraftTree,
                     past: int) -> TargetStep:
        from .targets import TargetStep

        self._check_owner()  # type: ignore[attr-defined]
        count = tokens.shape[1]
        width = self.tree_width if self.tree_width >= count else count
        if past + width > self.capacity:  # type: ignore[attr-defined]
            self._grow(past + width + self.widths[-1])  # type: ignore[attr-defined]
        self._length = past + count
        padded = tokens.new_empty((1, width))
        padded[:, :count] = tokens
        padded[:, count:] = tokens[:, :1]
        placed = positions.new_empty((1, width))
        placed[:, :count] = positions
        placed[:, count:] = positions[:, :1]
        mask = static_tree_mask(tree, past, width, self.capacity, self.model.dtype, tokens.device)  # type: ignore[attr-defined]
        inputs: dict[str, Any] = {"input_ids": padded, self._cache_argument: self.cache, "attention_mask": mask,
                                  "position_ids": placed}
        if self.output_hidden_states:
            inputs["output_hidden_states"] = True
        logits, hidden = self._padded_forward(  # type: ignore[attr-defined]
            inputs, width == self.tree_width, count, width, hidden=bool(self.output_hidden_states))
        return TargetStep(logits=logits, hidden_states=hidden)
