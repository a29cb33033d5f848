"""Datasets, transforms and batching.

The LightningDataModules live in their own modules (``vision_tx.data.detection``), imported from
there, so that loading a dataset does not import Lightning.
"""

from vision_tx.data.ade20k import ADE20K_CLASSES, ADE20KDataset
from vision_tx.data.coco import CocoDetection, CocoFormatError, coco_split_paths, load_coco
from vision_tx.data.coco_panoptic import (
    CocoPanoptic,
    coco_panoptic_split_paths,
    id_to_rgb,
    read_panoptic_png,
    rgb_to_id,
    write_panoptic_png,
    write_panoptic_predictions,
)
from vision_tx.data.collate import collate_detection
from vision_tx.data.toy import make_toy_coco, toy_coco_root
from vision_tx.data.toy_panoptic import toy_coco_panoptic_root
from vision_tx.data.toy_segmentation import toy_segmentation_root
from vision_tx.data.transforms import (
    DetectionTransform,
    DetrTrainTransform,
    DetrValTransform,
    RandomShortestSide,
    RandomSizeCrop,
)

__all__ = [
    "ADE20KDataset",
    "ADE20K_CLASSES",
    "CocoDetection",
    "CocoFormatError",
    "CocoPanoptic",
    "DetectionTransform",
    "DetrTrainTransform",
    "DetrValTransform",
    "RandomShortestSide",
    "RandomSizeCrop",
    "coco_panoptic_split_paths",
    "coco_split_paths",
    "collate_detection",
    "id_to_rgb",
    "load_coco",
    "make_toy_coco",
    "read_panoptic_png",
    "rgb_to_id",
    "toy_coco_panoptic_root",
    "toy_coco_root",
    "toy_segmentation_root",
    "write_panoptic_png",
    "write_panoptic_predictions",
]
