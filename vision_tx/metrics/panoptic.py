"""Panoptic quality (PQ = SQ x RQ) with the rules of COCO's panopticapi ``pq_compute``.

Per image, a ground-truth and a predicted segment of the same category match when their IoU is
above 0.5 (so each segment matches at most once), where the union leaves out the predicted pixels
that fall on unlabelled ground truth (id 0). Crowd ground-truth segments match nothing and count as
no false negative. An unmatched predicted segment is a false positive unless more than half of its
pixels lie on unlabelled ground truth or on crowd regions of its own category. Per category
``PQ = sum IoU / (TP + FP/2 + FN/2)``, ``SQ = sum IoU / TP``, ``RQ = TP / (TP + FP/2 + FN/2)``; the
averages run over the categories with any TP, FP or FN ("All", things, stuff).

Two deliberate details: areas are counted from the maps (panopticapi takes ground-truth areas
from the JSON, which equal the pixel counts in COCO), and an unmatched prediction is forgiven over
all crowd regions of its category (panopticapi looks at the last one listed; COCO has at most one
per category and image).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vision_tx.data.coco_panoptic import load_panoptic_json, read_panoptic_png, segment_index
from vision_tx.io import gather_by_image_id, merge_metrics_json
from vision_tx.metrics.classwise import worst

VOID = 0
SUMMARY_KEYS = ("PQ", "SQ", "RQ", "PQ_th", "SQ_th", "RQ_th", "PQ_st", "SQ_st", "RQ_st")


def panoptic_image_stats(
    gt_ids: torch.Tensor,
    gt_segments: Sequence[dict[str, Any]],
    pred_ids: torch.Tensor,
    pred_segments: Sequence[dict[str, Any]],
    categories: set[int],
    image: str = "image",
) -> dict[int, list[float]]:
    """One image's ``{category_id: [tp, fp, fn, iou_sum]}`` (categories with any count).

    ``gt_ids`` and ``pred_ids`` are ``[H, W]`` segment-id maps (0 = unlabelled); the segments ``gt_segments`` and
    ``pred_segments`` are ``{"id", "category_id"}`` dicts, ground truth with ``"iscrowd"``, their categories among the
    ids ``categories``. A predicted segment listed but absent from its map is an error, as in panopticapi; ``image``
    names the image in errors.
    """
    if gt_ids.shape != pred_ids.shape:
        raise ValueError(
            f"{image}: prediction map {tuple(pred_ids.shape)} and ground truth {tuple(gt_ids.shape)} differ in size"
        )
    gt_segments, pred_segments = list(gt_segments), list(pred_segments)
    indices = []
    for ids, segments, what in ((gt_ids, gt_segments, "ground truth"), (pred_ids, pred_segments, "prediction")):
        unknown = sorted({int(s["category_id"]) for s in segments} - categories)
        if unknown:
            raise ValueError(f"{image} ({what}): unknown category id(s) {unknown}")
        try:
            indices.append(segment_index(ids, torch.tensor([int(s["id"]) for s in segments], dtype=torch.int64)))
        except ValueError as err:
            raise ValueError(f"{image} ({what}): {err}") from err
    # intersection[i, j]: pixels of ground-truth segment i and predicted segment j; row/column 0 = unlabelled.
    num_pred = len(pred_segments) + 1
    pairs = indices[0].numpy().ravel() * num_pred + indices[1].numpy().ravel()
    intersection = np.bincount(pairs, minlength=(len(gt_segments) + 1) * num_pred).reshape(-1, num_pred)
    gt_area, pred_area = intersection.sum(1).tolist(), intersection.sum(0).tolist()
    on_void = intersection[VOID].tolist()
    absent = [s["id"] for s, area in zip(pred_segments, pred_area[1:]) if area == 0]
    if absent:
        raise ValueError(
            f"{image} (prediction): segment id(s) {absent[:10]} of its segments_info cover no pixel of the map"
        )

    stats: dict[int, list[float]] = {}

    def add(category: int, column: int, value: float) -> None:
        stats.setdefault(int(category), [0.0, 0.0, 0.0, 0.0])[column] += value

    matched_gt, matched_pred = set(), set()
    for i, j in (np.argwhere(intersection[1:, 1:]) + 1).tolist():
        gt, pred = gt_segments[i - 1], pred_segments[j - 1]
        if gt.get("iscrowd", 0) or gt["category_id"] != pred["category_id"]:
            continue
        inter = int(intersection[i, j])
        iou = inter / (pred_area[j] + gt_area[i] - inter - on_void[j])
        if iou > 0.5:
            add(gt["category_id"], 0, 1)
            add(gt["category_id"], 3, iou)
            matched_gt.add(i)
            matched_pred.add(j)

    crowd_of_category: dict[int, list[int]] = {}
    for i, gt in enumerate(gt_segments, start=1):
        if gt.get("iscrowd", 0):
            crowd_of_category.setdefault(gt["category_id"], []).append(i)
        elif i not in matched_gt:
            add(gt["category_id"], 2, 1)
    for j, pred in enumerate(pred_segments, start=1):
        if j in matched_pred:
            continue
        ignored = on_void[j] + sum(int(intersection[i, j]) for i in crowd_of_category.get(pred["category_id"], ()))
        if ignored / pred_area[j] <= 0.5:
            add(pred["category_id"], 1, 1)
    return stats


class PanopticEvaluator:
    """Accumulates per-image PQ statistics and reports PQ, SQ, RQ as fractions in ``[0, 1]``.

    ``categories`` are COCO panoptic category dicts (``id``, ``name``, ``isthing``). ``update`` takes one
    image at a time. ``compute`` gathers the per-image statistics of every process, keeps one record
    per image id (the distributed sampler repeats samples to even out the shards) and averages; call
    it on every rank. The printed table (``table``) is in percent, as panopticapi prints.
    """

    def __init__(self, categories: Sequence[dict[str, Any]]):
        self.categories = [dict(c) for c in categories]
        self._category_ids = {int(c["id"]) for c in self.categories}
        self.reset()

    def reset(self) -> None:
        self._records: dict[int, dict[int, list[float]]] = {}
        self._totals: dict[int, list[float]] | None = None

    def update(
        self,
        image_id: int,
        gt_ids: torch.Tensor,
        gt_segments: Sequence[dict[str, Any]],
        pred_ids: torch.Tensor,
        pred_segments: Sequence[dict[str, Any]],
    ) -> None:
        """Adds one image: ``[H, W]`` segment-id maps and their ``segments_info`` lists."""
        if int(image_id) in self._records:
            return
        self._records[int(image_id)] = panoptic_image_stats(
            gt_ids, gt_segments, pred_ids, pred_segments, self._category_ids, image=f"image id {image_id}"
        )
        self._totals = None

    def _gathered(self) -> dict[int, dict[int, list[float]]]:
        return gather_by_image_id(self._records)

    def totals(self) -> dict[int, list[float]]:
        """``{category_id: [tp, fp, fn, iou_sum]}`` over all images of all processes."""
        if self._totals is None:
            totals: dict[int, list[float]] = {}
            for stats in self._gathered().values():
                for category, values in stats.items():
                    row = totals.setdefault(category, [0.0, 0.0, 0.0, 0.0])
                    for column, value in enumerate(values):
                        row[column] += value
            self._totals = totals
        return self._totals

    def per_class(self) -> dict[int, dict[str, float]]:
        """``{category_id: {"PQ", "SQ", "RQ", "TP", "FP", "FN"}}`` for the categories with any count."""
        results = {}
        for category in self.categories:
            tp, fp, fn, iou = self.totals().get(int(category["id"]), (0, 0, 0, 0.0))
            if tp + fp + fn == 0:
                continue
            denominator = tp + 0.5 * fp + 0.5 * fn
            results[int(category["id"])] = {
                "PQ": iou / denominator,
                "SQ": iou / tp if tp else 0.0,
                "RQ": tp / denominator,
                "TP": int(tp),
                "FP": int(fp),
                "FN": int(fn),
            }
        return results

    def _averages(self) -> dict[str, tuple[float, float, float, int]]:
        per_class = self.per_class()
        isthing = {int(c["id"]): bool(c.get("isthing", 0)) for c in self.categories}
        groups = {
            "": list(per_class),
            "_th": [c for c in per_class if isthing[c]],
            "_st": [c for c in per_class if not isthing[c]],
        }
        averages = {}
        for suffix, members in groups.items():
            n = len(members)
            mean = [sum(per_class[c][key] for c in members) / n if n else 0.0 for key in ("PQ", "SQ", "RQ")]
            averages[suffix] = (*mean, n)
        return averages

    def compute(self) -> dict[str, float]:
        """``PQ, SQ, RQ`` over all categories, ``*_th`` over things and ``*_st`` over stuff, in ``[0, 1]``
        (0 for a group with no category seen)."""
        return {
            f"{key}{suffix}": value
            for suffix, values in self._averages().items()
            for key, value in zip(("PQ", "SQ", "RQ"), values)
        }

    def per_category(self) -> list[dict[str, Any]]:
        """``[{"id", "name", "isthing", "PQ", "SQ", "RQ", "TP", "FP", "FN"}]`` for the categories with any count."""
        categories = {int(c["id"]): c for c in self.categories}
        return [
            {
                "id": category,
                "name": categories[category].get("name", str(category)),
                "isthing": bool(categories[category].get("isthing", 0)),
                **row,
            }
            for category, row in self.per_class().items()
        ]

    def table(self, count: int | None = None) -> str:
        """Per-category PQ, SQ, RQ (in %) with TP, FP, FN (the ``count`` of lowest PQ, lowest first,
        when given), then panopticapi's All / Things / Stuff lines."""
        rows = self.per_category()
        title = []
        if count is not None:
            rows = worst(rows, "PQ", count)
            title = [f"the {len(rows)} categories of lowest PQ of {len(self.per_class())} seen (all in metrics.json)"]
        width = max([len(c.get("name", str(c["id"]))) for c in self.categories] + [10])
        lines = [f"{'category':{width}s} | {'PQ':>5s} {'SQ':>5s} {'RQ':>5s} | {'TP':>5s} {'FP':>5s} {'FN':>5s}"]
        lines.append("-" * len(lines[0]))
        for r in rows:
            lines.append(
                f"{r['name']:{width}s} | {100 * r['PQ']:5.1f} {100 * r['SQ']:5.1f} {100 * r['RQ']:5.1f} | "
                f"{r['TP']:5d} {r['FP']:5d} {r['FN']:5d}"
            )
        lines.append("-" * len(lines[0]))
        for label, suffix in (("All", ""), ("Things", "_th"), ("Stuff", "_st")):
            pq, sq, rq, n = self._averages()[suffix]
            lines.append(f"{label:{width}s} | {100 * pq:5.1f} {100 * sq:5.1f} {100 * rq:5.1f} | N = {n}")
        return "\n".join([*title, *lines])


def evaluate_panoptic_files(
    gt_json: str | os.PathLike,
    gt_folder: str | os.PathLike,
    pred_json: str | os.PathLike,
    pred_folder: str | os.PathLike,
    metrics_json: str | os.PathLike | None = None,
) -> dict[str, float]:
    """Scores COCO panoptic prediction files (``pred_json`` and its PNGs in ``pred_folder``) against ground-truth files
    (``gt_json``, ``gt_folder``) and prints the table (the ten categories of lowest PQ, then the averages).

    Every ground-truth image needs a prediction. With ``metrics_json`` the results, with
    ``"per_category"`` (:meth:`PanopticEvaluator.per_category`), are merged into that file as
    ``{"panoptic": {...}}`` (atomically).
    """
    gt_data, pred_data = load_panoptic_json(gt_json), load_panoptic_json(pred_json, keys=("annotations",))
    gt_folder, pred_folder = Path(gt_folder), Path(pred_folder)
    predictions = {int(ann["image_id"]): ann for ann in pred_data["annotations"]}
    evaluator = PanopticEvaluator(gt_data["categories"])
    for gt_ann in gt_data["annotations"]:
        image_id = int(gt_ann["image_id"])
        if image_id not in predictions:
            raise ValueError(f"{pred_json}: no prediction for image id {image_id} of {gt_json}")
        pred_ann = predictions[image_id]
        gt_png, pred_png = gt_folder / gt_ann["file_name"], pred_folder / pred_ann["file_name"]
        try:
            gt_ids, pred_ids = read_panoptic_png(gt_png), read_panoptic_png(pred_png)
            evaluator.update(image_id, gt_ids, gt_ann["segments_info"], pred_ids, pred_ann["segments_info"])
        except ValueError as err:
            raise ValueError(f"{gt_png} vs {pred_png} ({gt_json} vs {pred_json}): {err}") from err
    print(evaluator.table(count=10))
    results = evaluator.compute()
    if metrics_json is not None:
        merge_metrics_json("panoptic", {**results, "per_category": evaluator.per_category()}, metrics_json)
    return results
