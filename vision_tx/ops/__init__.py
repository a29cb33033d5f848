"""Low-level operators with no model knowledge."""

from vision_tx.ops.dropout import Dropout, dropout
from vision_tx.ops.linear import Linear
from vision_tx.ops.neighborhood_attention import na2d

__all__ = ["Dropout", "Linear", "dropout", "na2d"]
