"""COCO detection metrics computed by pycocotools' COCOeval, gathered across processes."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from vision_tx.data.coco import load_coco
from vision_tx.io import gather_by_image_id, merge_metrics_json, write_json_atomic
from vision_tx.metrics.classwise import coco_per_category, format_table, worst_table

logger = logging.getLogger(__name__)

# The order of COCOeval.stats.
STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")
IOU_TYPES = ("bbox", "segm")
CLASSWISE_COLUMNS = ("AP", "AP50", "AP75", "APs", "APm", "APl")


def results_coco(coco_gt: COCO, results: list[dict[str, Any]]) -> COCO:
    """``coco_gt.loadRes(results)`` of the COCO ground truth ``coco_gt`` and the COCO ``results`` dicts, which also
    accepts an empty list (pycocotools' raises on one)."""
    if results:
        with contextlib.redirect_stdout(io.StringIO()):
            return coco_gt.loadRes([dict(r) for r in results])  # loadRes adds keys to the dicts it gets
    coco_dt = COCO()
    coco_dt.dataset = {
        "images": coco_gt.dataset["images"],
        "categories": coco_gt.dataset["categories"],
        "annotations": [],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt.createIndex()
    return coco_dt


def run_cocoeval(
    coco_gt: COCO, results: list[dict[str, Any]], iou_type: str = "bbox", image_ids: Sequence[int] | None = None
) -> tuple[COCOeval, str]:
    """Runs COCOeval (evaluate, accumulate, summarize) of ``iou_type`` (``"bbox"`` or ``"segm"``) on ``results`` (COCO
    results dicts) against ``coco_gt``, over ``image_ids`` (default: every image); returns the evaluator and
    pycocotools' printed summary table."""
    if iou_type not in IOU_TYPES:
        raise ValueError(f"iou_type must be one of {IOU_TYPES}, got {iou_type!r}")
    if not results:
        warnings.warn(
            "COCO evaluation of an empty prediction set: every stat is 0 (or -1 where there is no ground truth)",
            stacklevel=2,
        )
    evaluator = COCOeval(coco_gt, results_coco(coco_gt, results), iou_type)
    if image_ids is not None:
        evaluator.params.imgIds = sorted(int(i) for i in image_ids)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator, printed.getvalue()


def coco_stats(
    coco_gt: COCO, results: list[dict[str, Any]], iou_type: str = "bbox", image_ids: Sequence[int] | None = None
) -> tuple[dict[str, float], str]:
    """The 12 stats of :func:`run_cocoeval` (``coco_gt``, ``results``, ``iou_type``, ``image_ids`` as there) by name
    (``STAT_NAMES``) and pycocotools' printed summary table."""
    evaluator, summary = run_cocoeval(coco_gt, results, iou_type, image_ids)
    return _stats(evaluator), summary


def _stats(evaluator: COCOeval) -> dict[str, float]:
    return {name: float(value) for name, value in zip(STAT_NAMES, evaluator.stats)}


def evaluate_results_file(
    gt_json: str | os.PathLike,
    results_json: str | os.PathLike,
    iou_type: str = "bbox",
    metrics_json: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Scores the COCO results file ``results_json`` against the ground-truth file ``gt_json`` (``iou_type``
    ``"bbox"`` or ``"segm"``); prints pycocotools' summary and the ten categories of lowest AP, returns the stats
    with ``"per_category"`` (:func:`coco_per_category`). With ``metrics_json`` they are merged into that file as
    ``{iou_type: {...}}`` (atomically)."""
    results_json = Path(results_json)
    try:
        results = json.loads(results_json.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{results_json}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from err
    if not isinstance(results, list):
        raise ValueError(
            f"{results_json}: a COCO results file is a JSON list of detections, got {type(results).__name__}"
        )
    coco_gt = load_coco(gt_json)
    unknown = {r.get("image_id") for r in results} - set(coco_gt.getImgIds())
    if unknown:
        raise ValueError(f"{results_json}: image ids {sorted(unknown, key=str)[:5]} are not in {gt_json}")
    evaluator, summary = run_cocoeval(coco_gt, results, iou_type)
    per_category = coco_per_category(evaluator)
    print(summary, end="")
    print(worst_table(per_category, "AP", CLASSWISE_COLUMNS, f"{iou_type} AP per category"))
    stats = {**_stats(evaluator), "per_category": per_category}
    if metrics_json is not None:
        merge_metrics_json(iou_type, stats, metrics_json)
    return stats


def to_results(prediction: dict[str, Any], iou_type: str) -> list[dict[str, Any]]:
    """One image's ``prediction`` (``image_id``, ``scores [K]``, ``labels [K]`` and ``boxes [K,4]`` xyxy pixels or bool
    ``masks [K,H,W]``) as COCO results dicts of ``iou_type``: ``"bbox"`` (xywh), else segmentation RLE."""
    image_id = int(prediction["image_id"])
    scores = torch.as_tensor(prediction["scores"]).tolist()
    labels = torch.as_tensor(prediction["labels"]).tolist()
    results = [{"image_id": image_id, "category_id": int(c), "score": float(s)} for c, s in zip(labels, scores)]
    if iou_type == "bbox":
        boxes = torch.as_tensor(prediction["boxes"]).double()
        for result, (x1, y1, x2, y2) in zip(results, boxes.tolist()):
            result["bbox"] = [x1, y1, x2 - x1, y2 - y1]
    elif results:
        masks = np.asfortranarray(torch.as_tensor(prediction["masks"]).bool().permute(1, 2, 0).numpy().astype(np.uint8))
        for result, rle in zip(results, mask_utils.encode(masks)):
            result["segmentation"] = {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}
    return results


class CocoEvaluator:
    """Accumulates predictions over an epoch and scores them with COCOeval against ``coco_gt``.

    ``update`` takes per-image predictions ``{"image_id", "boxes" [K, 4] xyxy in original pixels,
    "scores" [K], "labels" [K] category ids}`` (``"masks"`` ``[K, H, W]`` bool for ``iou_type="segm"``).
    ``compute`` gathers every process's predictions, keeps one per image id (the distributed sampler
    repeats samples to even out the shards) and evaluates over the images seen; call it on every rank.
    It also sets ``per_category`` (:func:`coco_per_category`) on every rank.
    """

    def __init__(self, coco_gt: COCO, iou_type: str = "bbox"):
        if iou_type not in IOU_TYPES:
            raise ValueError(f"iou_type must be one of {IOU_TYPES}, got {iou_type!r}")
        self.coco_gt = coco_gt
        self.iou_type = iou_type
        self.summary = ""
        self.per_category: list[dict[str, Any]] = []
        self.reset()

    def reset(self) -> None:
        self._results: dict[int, list[dict[str, Any]]] = {}
        self.merged_results: list[dict[str, Any]] = []
        self.image_ids: list[int] = []  # every process's images of the last compute (rank 0), detections or not
        self.cocoeval: COCOeval | None = None  # the last compute's evaluation, evaluated and accumulated (rank 0)

    def update(self, predictions: Sequence[dict[str, Any]]) -> None:
        for prediction in predictions:
            self._results.setdefault(int(prediction["image_id"]), to_results(prediction, self.iou_type))

    def _gathered(self) -> dict[int, list[dict[str, Any]]]:
        return gather_by_image_id(self._results)

    def compute(self) -> dict[str, float]:
        """The 12 COCO stats by name, the same on every rank (evaluated once, on rank 0)."""
        distributed = dist.is_available() and dist.is_initialized()
        results = self._gathered()
        stats: dict[str, float] | None = None
        if not distributed or dist.get_rank() == 0:
            self.image_ids = sorted(results)
            self.merged_results = [r for image_id in self.image_ids for r in results[image_id]]
            self.cocoeval, self.summary = run_cocoeval(
                self.coco_gt, self.merged_results, self.iou_type, image_ids=self.image_ids
            )
            stats, self.per_category = _stats(self.cocoeval), coco_per_category(self.cocoeval)
            logger.info("COCO %s evaluation over %d images:\n%s", self.iou_type, len(results), self.summary)
        if distributed and dist.get_world_size() > 1:
            box = [(stats, self.per_category)]
            dist.broadcast_object_list(box, src=0)
            stats, self.per_category = box[0]
        return stats

    def table(self, count: int | None = 10) -> str:
        """The ``count`` categories of lowest AP (every category with ``None``) of the last ``compute``, in %."""
        if count is None:
            return format_table(self.per_category, CLASSWISE_COLUMNS, title=f"{self.iou_type} AP per category")
        return worst_table(self.per_category, "AP", CLASSWISE_COLUMNS, f"{self.iou_type} AP per category", count)

    def write_results(self, path: str | os.PathLike) -> Path:
        """Writes the merged predictions of the last ``compute`` as a COCO results JSON (rank 0 has them)."""
        return write_json_atomic(self.merged_results, path)

    def write_metrics(self, stats: dict[str, float], path: str | os.PathLike) -> Path:
        """Adds ``{iou_type: {**stats, "per_category": [...]}}`` to ``metrics.json`` (other sections kept)."""
        return merge_metrics_json(self.iou_type, {**stats, "per_category": self.per_category}, path)
