"""Compositions of backbone, neck and head."""

from vision_tx.models.detr import DETR, DETRFeatures
from vision_tx.models.detr_panoptic import DETRPanoptic
from vision_tx.models.dino import DINO
from vision_tx.models.mask2former import Mask2Former
from vision_tx.models.segmentor import UperNetSegmentor

# The detectors a config can name (``DetectionModule(detector=...)``): each takes ``(backbone,
# num_classes, criterion=..., **kwargs)``, owns ``loss`` and ``postprocess`` and names its
# ``criterion_class`` and the ``backbone_out_indices`` it reads.
DETECTORS = {"detr": DETR, "dino": DINO, "mask2former": Mask2Former}

__all__ = ["DETECTORS", "DETR", "DETRFeatures", "DETRPanoptic", "DINO", "Mask2Former", "UperNetSegmentor"]
