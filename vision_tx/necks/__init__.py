"""Necks: feature pyramids over backbone stages."""

from vision_tx.necks.fpn import BackboneWithFPN
from vision_tx.necks.multiscale import MultiScaleLevels, MultiScaleProjection

__all__ = ["BackboneWithFPN", "MultiScaleLevels", "MultiScaleProjection"]
