"""Low-level operators with no model knowledge."""

from vision_tx.ops.neighborhood_attention import na2d

__all__ = ["na2d"]
