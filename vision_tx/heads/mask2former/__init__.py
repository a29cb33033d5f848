"""Mask2Former's head: multi-scale deformable pixel decoder, masked-attention decoder, point-sampled set
loss, and semantic, panoptic and instance inference."""

from vision_tx.heads.mask2former.criterion import Mask2FormerCriterion, MaskHungarianMatcher, point_sample
from vision_tx.heads.mask2former.decoder import MaskedAttentionDecoder, MaskedAttentionLayer
from vision_tx.heads.mask2former.pixel_decoder import PixelDecoder
from vision_tx.heads.mask2former.postprocess import (
    instance_inference,
    panoptic_inference,
    resize_masks,
    semantic_inference,
)

__all__ = [
    "Mask2FormerCriterion",
    "MaskHungarianMatcher",
    "MaskedAttentionDecoder",
    "MaskedAttentionLayer",
    "PixelDecoder",
    "instance_inference",
    "panoptic_inference",
    "point_sample",
    "resize_masks",
    "semantic_inference",
]
