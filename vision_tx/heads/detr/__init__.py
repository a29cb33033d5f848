"""DETR's head: sine position encoding, transformer, Hungarian matcher, set criterion, post-processing."""

from vision_tx.heads.detr.criterion import SetCriterion, normalize_targets
from vision_tx.heads.detr.matcher import HungarianMatcher
from vision_tx.heads.detr.position_encoding import SinePositionEncoding
from vision_tx.heads.detr.postprocess import postprocess_detections
from vision_tx.heads.detr.transformer import Transformer

__all__ = [
    "HungarianMatcher",
    "SetCriterion",
    "SinePositionEncoding",
    "Transformer",
    "normalize_targets",
    "postprocess_detections",
]
