"""DETR's head: transformer, Hungarian matcher, set criterion, post-processing,
and the panoptic mask head."""

from vision_tx.heads.detr.criterion import SetCriterion, normalize_targets
from vision_tx.heads.detr.mask_head import AttentionMaps, MaskHead
from vision_tx.heads.detr.matcher import HungarianMatcher
from vision_tx.heads.detr.mlp import MLP
from vision_tx.heads.detr.postprocess import (
    postprocess_detections,
    postprocess_panoptic,
    postprocess_sigmoid_detections,
    postprocess_sigmoid_per_query,
)
from vision_tx.heads.detr.transformer import Transformer

__all__ = [
    "AttentionMaps",
    "HungarianMatcher",
    "MLP",
    "MaskHead",
    "SetCriterion",
    "Transformer",
    "normalize_targets",
    "postprocess_detections",
    "postprocess_panoptic",
    "postprocess_sigmoid_detections",
    "postprocess_sigmoid_per_query",
]
