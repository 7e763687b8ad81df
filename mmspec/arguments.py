"""The checks `speculative_generate` runs on its arguments before any forward: a wrong type, shape or range
is one MMSpecError naming the argument, instead of an error from deep inside the loop, a sampler or a kernel."""

from __future__ import annotations

from typing import Any

import torch

from .errors import MMSpecError
from .policies import DraftLengthPolicy


def check_arguments(target: Any, input_ids: Any, max_new_tokens: Any, generator: Any, num_draft_tokens: Any,
                    policy: Any, options: dict[str, Any]) -> None:
    """One MMSpecError naming the first bad argument of a `speculative_generate` call; `options` are its **kwargs."""
    model = getattr(target, "model", target)  # an mmspec Target wraps the transformers model
    _check_input_ids(input_ids, model)
    if max_new_tokens is not None and (not _is_int(max_new_tokens) or max_new_tokens < 1):
        raise MMSpecError(f"max_new_tokens must be an integer >= 1 (or None), got {max_new_tokens!r}")
    if not _is_int(num_draft_tokens) or num_draft_tokens < 1:
        raise MMSpecError(f"num_draft_tokens must be an integer >= 1, got {num_draft_tokens!r}")
    if policy is not None and not isinstance(policy, DraftLengthPolicy):
        raise MMSpecError(f"policy must be a draft-length policy (FixedDraftLength, HeuristicDraftLength, "
                          f"ConfidenceStopDraftLength; mmspec.policies.make_policy builds one by name), got {policy!r}")
    _check_generator(generator, model)
    _check_top_p(options)
    _check_attention_mask(options.get("attention_mask"), input_ids)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_input_ids(input_ids: Any, model: Any) -> None:
    if input_ids is None:
        return
    if not isinstance(input_ids, torch.Tensor):
        raise MMSpecError(f"input_ids must be a torch.LongTensor of token ids [batch, length] (tokenize text first, "
                          f"e.g. tokenizer(text, return_tensors='pt').input_ids), got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise MMSpecError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise MMSpecError(f"input_ids must be a non-empty [batch, length] tensor, got shape {tuple(input_ids.shape)}")
    if input_ids.numel() and int(input_ids.min()) < 0:
        raise MMSpecError(f"input_ids holds a negative token id ({int(input_ids.min())})")
    vocabulary = _vocabulary(model)
    if vocabulary is not None and int(input_ids.max()) >= vocabulary:
        raise MMSpecError(f"input_ids holds token id {int(input_ids.max())}, outside the model's vocabulary of "
                          f"{vocabulary} (ids 0..{vocabulary - 1})")


def _vocabulary(model: Any) -> int | None:
    """Rows of a decoder-only model's input embedding (None when unknown, or for an encoder-decoder's encoder)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return None
    try:
        embedding = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return getattr(embedding, "num_embeddings", None)


def _check_generator(generator: Any, model: Any) -> None:
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise MMSpecError(f"generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), "
                          f"got {type(generator).__name__}")
    if generator.device.type == "cpu":
        return  # a CPU generator serves a model on any device
    parameter = next(model.parameters(), None) if hasattr(model, "parameters") else None
    if parameter is not None and parameter.device.type != generator.device.type:
        raise MMSpecError(f"generator is on {generator.device} but the model is on {parameter.device}: pass a CPU "
                          "generator (it works with a model on any device) or one on the model's device")


def _check_top_p(options: dict[str, Any]) -> None:
    top_p = options.get("top_p")
    config = options.get("generation_config")
    if top_p is None and config is not None:
        top_p = getattr(config, "top_p", None)
    if top_p is None:
        return
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise MMSpecError(f"top_p must be a number in (0, 1], got {top_p!r}")


def _check_attention_mask(mask: Any, input_ids: Any) -> None:
    if mask is None or not isinstance(input_ids, torch.Tensor):
        return
    if not isinstance(mask, torch.Tensor):
        raise MMSpecError(f"attention_mask must be a tensor shaped like input_ids, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(input_ids.shape):
        raise MMSpecError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(input_ids.shape)}: they "
                          "must match (one 0/1 per token)")
