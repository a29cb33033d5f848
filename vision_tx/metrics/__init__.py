"""Evaluation metrics: COCO AP (pycocotools), panoptic quality, mIoU."""

from vision_tx.metrics.coco import CocoEvaluator, coco_stats, evaluate_results_file
from vision_tx.metrics.miou import MeanIoU
from vision_tx.metrics.panoptic import PanopticEvaluator, evaluate_panoptic_files

__all__ = [
    "CocoEvaluator",
    "MeanIoU",
    "PanopticEvaluator",
    "coco_stats",
    "evaluate_panoptic_files",
    "evaluate_results_file",
]
