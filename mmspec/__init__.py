"""mmspec: speculative (draft-then-verify) decoding for multimodal and non-text models."""

from .decoding import SpeculativeDecoder, SpeculativeOutput, speculative_generate
from .drafters import Drafter, ModelDrafter, NoDrafter, PromptLookupDrafter
from .errors import MMSpecError
from .policies import ConfidenceStopDraftLength, DraftLengthPolicy, FixedDraftLength, HeuristicDraftLength, make_policy
from .rules import greedy_match, speculative_sampling
from .sampling import SamplingConfig
from .stats import SpecStats
from .targets import Target, TargetStep
from .types import Proposal, Verdict

__version__ = "0.1.0"

__all__ = [
    "ConfidenceStopDraftLength",
    "DraftLengthPolicy",
    "Drafter",
    "FixedDraftLength",
    "HeuristicDraftLength",
    "MMSpecError",
    "ModelDrafter",
    "NoDrafter",
    "PromptLookupDrafter",
    "Proposal",
    "SamplingConfig",
    "SpecStats",
    "SpeculativeDecoder",
    "SpeculativeOutput",
    "Target",
    "TargetStep",
    "Verdict",
    "greedy_match",
    "make_policy",
    "speculative_generate",
    "speculative_sampling",
]
