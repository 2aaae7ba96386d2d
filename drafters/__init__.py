"""Drafters: who proposes the next tokens for the target model to verify."""

from specedit.drafters.base import Draft, Drafter, NoDrafter
from specedit.drafters.copy_drafter import CopyDrafter, CopyDrafterConfig

__all__ = ["CopyDrafter", "CopyDrafterConfig", "Draft", "Drafter", "NoDrafter"]
