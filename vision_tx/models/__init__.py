"""Compositions of backbone, neck and head."""

from vision_tx.models.detr import DETR, DETRFeatures
from vision_tx.models.detr_panoptic import DETRPanoptic
from vision_tx.models.dfine import DFINE
from vision_tx.models.dino import DINO
from vision_tx.models.mask2former import Mask2Former
from vision_tx.models.rtdetr import RTDETR
from vision_tx.models.segmentor import UperNetSegmentor

# The detectors a config can name (``DetectionModule(detector=...)``); each follows the protocol of
# docs/CONVENTIONS.md ("Detectors"): built as ``(backbone, num_classes, matcher_kwargs=...,
# criterion_kwargs=..., **kwargs)``, it owns ``loss``, ``postprocess``, ``postprocess_per_query``,
# ``cross_attention``, ``convert_state_dict``, ``no_weight_decay`` and ``for_conversion``, and names
# the ``backbone_out_indices`` it reads and the ``score_threshold`` pictures draw from.
DETECTORS = {"detr": DETR, "dfine": DFINE, "dino": DINO, "mask2former": Mask2Former, "rtdetr": RTDETR}

# The detectors the panoptic task builds on, with the model that wraps each to segment
# (``wrapper(detector, postprocess_kwargs=..., **panoptic_kwargs)``), or None for a detector that segments
# by itself. Either way the panoptic model has ``postprocess_panoptic(outputs, sizes, orig_sizes, is_thing)``;
# a wrapper names where the backbone's parameters sit in it (``backbone_prefix``).
PANOPTIC_WRAPPERS: dict[str, type | None] = {"detr": DETRPanoptic, "mask2former": None}

# The semantic segmentation heads a config can name (``SegmentationModule(head=...)``), each built as
# ``(backbone, num_classes, ignore_index=..., **head_kwargs)`` (Mask2Former also takes ``criterion_kwargs``);
# each owns ``loss``, ``predict``, ``class_keys`` and ``no_weight_decay``.
SEGMENTATION_HEADS = {"upernet": UperNetSegmentor, "mask2former": Mask2Former}

__all__ = ["DETECTORS", "PANOPTIC_WRAPPERS", "SEGMENTATION_HEADS", "DETR", "DETRFeatures", "DETRPanoptic", "DFINE", "DINO", "Mask2Former", "RTDETR", "UperNetSegmentor"]
