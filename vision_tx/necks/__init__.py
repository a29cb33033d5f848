"""Necks: feature pyramids over backbone stages."""

from vision_tx.necks.fpn import BackboneWithFPN

__all__ = ["BackboneWithFPN"]
