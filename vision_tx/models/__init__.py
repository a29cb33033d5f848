"""Compositions of backbone, neck and head."""

from vision_tx.models.detr import DETR
from vision_tx.models.segmentor import UperNetSegmentor

__all__ = ["DETR", "UperNetSegmentor"]
