"""Necks: feature pyramids over backbone stages, and the sine position encoding of their maps."""

from vision_tx.necks.fpn import BackboneWithFPN
from vision_tx.necks.multiscale import MultiScaleLevels, MultiScaleProjection
from vision_tx.necks.position_encoding import SinePositionEncoding

__all__ = ["BackboneWithFPN", "MultiScaleLevels", "MultiScaleProjection", "SinePositionEncoding"]
