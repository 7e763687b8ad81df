"""Drafters: anything that proposes tokens for the target to verify."""

from .base import Drafter
from .model_drafter import ModelDrafter
from .no_drafter import NoDrafter
from .prompt_lookup import PromptLookupDrafter

__all__ = ["Drafter", "ModelDrafter", "NoDrafter", "PromptLookupDrafter"]
