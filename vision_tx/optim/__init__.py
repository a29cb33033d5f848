"""Optimisers: sharpness-aware minimisation around any torch optimiser."""

from vision_tx.optim.sam import SAM

__all__ = ["SAM"]
