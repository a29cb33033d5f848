"""Compositions of backbone, neck and head."""

from vision_tx.models.detr import DETR, DETRFeatures
from vision_tx.models.detr_panoptic import DETRPanoptic
from vision_tx.models.dino import DINO
from vision_tx.models.segmentor import UperNetSegmentor

__all__ = ["DETR", "DETRFeatures", "DETRPanoptic", "DINO", "UperNetSegmentor"]
