"""Low-level operators with no model knowledge."""

from vision_tx.ops.dropout import Dropout, dropout
from vision_tx.ops.linear import Linear, set_weight_packing
from vision_tx.ops.ms_deform_attn import ms_deform_attn
from vision_tx.ops.neighborhood_attention import na2d
from vision_tx.ops.resize_concat_conv import resize_concat_conv2d

__all__ = ["Dropout", "Linear", "dropout", "ms_deform_attn", "na2d", "resize_concat_conv2d", "set_weight_packing"]
