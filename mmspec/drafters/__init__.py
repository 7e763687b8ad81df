"""Drafters: anything that proposes tokens for the target to verify."""

from .base import Drafter, DraftView
from .jacobi import JacobiDrafter
from .model_drafter import ModelDrafter
from .no_drafter import NoDrafter
from .prompt_lookup import PromptLookupDrafter

__all__ = ["DraftView", "Drafter", "JacobiDrafter", "ModelDrafter", "NoDrafter", "PromptLookupDrafter"]
