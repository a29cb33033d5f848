"""Low-level operators with no model knowledge."""

from vision_tx.ops.linear import Linear
from vision_tx.ops.neighborhood_attention import na2d

__all__ = ["Linear", "na2d"]
