"""Drafters: who proposes the next tokens for the target model to verify."""

from specedit.drafters.base import Draft, Drafter, NoDrafter
from specedit.drafters.chain import ChainDrafter
from specedit.drafters.context_drafter import ContextDrafter, ContextDrafterConfig
from specedit.drafters.copy_drafter import CopyDrafter, CopyDrafterConfig

__all__ = [
    "ChainDrafter",
    "ContextDrafter",
    "ContextDrafterConfig",
    "CopyDrafter",
    "CopyDrafterConfig",
    "Draft",
    "Drafter",
    "NoDrafter",
]
