"""The caption methods' drafters for any tiny VLM, built as the pipeline builds them (untrained
feature drafters: losslessness must hold whatever they propose). Shared by the device and dtype
tests here and by tests/gpu/test_vision_gpu.py."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from mmspec.drafters import Drafter, NoDrafter
from mmspec.vision import TextOnlyDrafter
from mmspec.vision.feature_methods import runtime_drafter
from mmspec.vision.sparse_to_dense import SparseToDenseDrafter

from .test_feature_methods import tiny_drafter
from .tiny_vlms import text_drafter_lm

METHODS = ("ar", "text", "std", "msd", "flash")
# Fewer visual entries than any tiny VLM has, so the sparse cache really is sparse.
STD_VISUAL_KEEP = 2


def method_drafter(method: str, model: PreTrainedModel, text_lm: PreTrainedModel | None = None,
                   drafter_dtype: torch.dtype | None = None, seed: int = 0) -> Drafter:
    """The drafter of `method` for `model`.

    The text LM is used as given (the caller puts it where it wants it). Feature drafters are
    built on the model's device in `drafter_dtype` (default: the model's dtype); a drafter dtype
    other than the model's exercises the casts between the two.
    """
    if method == "ar":
        return NoDrafter()
    if method == "text":
        return TextOnlyDrafter(text_lm if text_lm is not None else text_drafter_lm(), model)
    if method == "std":
        return SparseToDenseDrafter(model, visual_keep=STD_VISUAL_KEEP)
    if method in ("msd", "flash"):
        # Initialised on the CPU (a seed gives the same weights for a model on any device, and a test may
        # have set another default device), then moved.
        with torch.device("cpu"):
            net = tiny_drafter(method, model.config.get_text_config(), seed=seed)
        return runtime_drafter(net.to(device=model.device, dtype=drafter_dtype or model.dtype))
    raise ValueError(f"unknown method {method!r}")
