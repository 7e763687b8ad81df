"""mmspec: speculative (draft-then-verify) decoding for multimodal and non-text models.

Names are imported on first use (PEP 562), so `import mmspec` and `mmspec --help` do not pay for
torch and transformers until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import MMSpecError

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "SpeculativeDecoder": "mmspec.decoding",
    "SpeculativeOutput": "mmspec.decoding",
    "speculative_generate": "mmspec.decoding",
    "Drafter": "mmspec.drafters",
    "DraftView": "mmspec.drafters",
    "ModelDrafter": "mmspec.drafters",
    "NoDrafter": "mmspec.drafters",
    "PromptLookupDrafter": "mmspec.drafters",
    "ConfidenceStopDraftLength": "mmspec.policies",
    "DraftLengthPolicy": "mmspec.policies",
    "FixedDraftLength": "mmspec.policies",
    "HeuristicDraftLength": "mmspec.policies",
    "make_policy": "mmspec.policies",
    "greedy_match": "mmspec.rules",
    "speculative_sampling": "mmspec.rules",
    "SamplingConfig": "mmspec.sampling",
    "SpecStats": "mmspec.stats",
    "Target": "mmspec.targets",
    "TargetStep": "mmspec.targets",
    "greedy_tree_match": "mmspec.tree_rules",
    "tree_speculative_sampling": "mmspec.tree_rules",
    "DraftTree": "mmspec.trees",
    "TreeConfig": "mmspec.trees",
    "Proposal": "mmspec.types",
    "Verdict": "mmspec.types",
    # The pipelines: diffusers is imported with the first of these names, not with `import mmspec`.
    "ImagePipelineOutput": "mmspec.pipelines",
    "RoundInfo": "mmspec.pipelines",
    "SpeculativePipeline": "mmspec.pipelines",
    "SpeculativePipelineOutput": "mmspec.pipelines",
    "TextPipelineOutput": "mmspec.pipelines",
    # Adapters' pipelines, named here (as strings, imported on first use) so that
    # `from mmspec import CaptionPipeline` works; the core's own code never imports an adapter.
    "CaptionOutput": "mmspec.vision.pipeline",
    "CaptionPipeline": "mmspec.vision.pipeline",
    "ImagePipeline": "mmspec.image_ar.pipeline",
    # Under their class names too: diffusers' generic loader looks a saved pipeline's class up here.
    "SpeculativeImagePipeline": "mmspec.image_ar.pipeline",
    "JanusImagePipeline": "mmspec.image_ar.janus_pipeline",
    "VARPipeline": "mmspec.image_ar.var_pipeline",
    "MARPipeline": "mmspec.image_ar.mar_pipeline",
    "TranscriptionOutput": "mmspec.speech.pipeline",
    "TranscriptionPipeline": "mmspec.speech.pipeline",
}

__all__ = ["MMSpecError", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mmspec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # for type checkers and IDEs: the names as if imported eagerly
    from .decoding import SpeculativeDecoder, SpeculativeOutput, speculative_generate
    from .drafters import Drafter, DraftView, ModelDrafter, NoDrafter, PromptLookupDrafter
    from .pipelines import (
        ImagePipelineOutput,
        RoundInfo,
        SpeculativePipeline,
        SpeculativePipelineOutput,
        TextPipelineOutput,
    )
    from .policies import (
        ConfidenceStopDraftLength,
        DraftLengthPolicy,
        FixedDraftLength,
        HeuristicDraftLength,
        make_policy,
    )
    from .rules import greedy_match, speculative_sampling
    from .sampling import SamplingConfig
    from .stats import SpecStats
    from .targets import Target, TargetStep
    from .tree_rules import greedy_tree_match, tree_speculative_sampling
    from .trees import DraftTree, TreeConfig
    from .types import Proposal, Verdict
