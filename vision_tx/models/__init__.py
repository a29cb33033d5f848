"""Compositions of backbone, neck and head."""

from vision_tx.models.detr import DETR, DETRFeatures
from vision_tx.models.detr_panoptic import DETRPanoptic
from vision_tx.models.dino import DINO
from vision_tx.models.rtdetr import RTDETR
from vision_tx.models.segmentor import UperNetSegmentor

# The detectors a config can name (``DetectionModule(detector=...)``): each takes ``(backbone,
# num_classes, criterion=..., **kwargs)``, owns ``loss`` and ``postprocess`` and names its
# ``criterion_class`` and the ``backbone_out_indices`` it reads.
DETECTORS = {"detr": DETR, "dino": DINO, "rtdetr": RTDETR}

__all__ = ["DETECTORS", "DETR", "DETRFeatures", "DETRPanoptic", "DINO", "RTDETR", "UperNetSegmentor"]
