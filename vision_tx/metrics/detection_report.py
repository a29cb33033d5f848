"""A detector's validation report, what to fix beside the COCO table: precision-recall curves, precision, recall and
F1 over the confidence per class, the confidence of the best F1, and the confusion matrix at IoU 0.5 with a background
row and column of the detections scoring at least that; as numbers for ``metrics.json`` and as pictures drawn with
matplotlib (its Agg canvas).

The curves reuse pycocotools' matching (``COCOeval.evalImgs``, the class-wise greedy matching by score that AP50
counts), run at IoU 0.5 alone over the same results and images as the validation's COCO table. No Lightning here.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import Tensor
from torchvision.io import write_png
from torchvision.ops import box_convert, box_iou

from vision_tx.metrics.coco import CocoEvaluator, results_coco

IOU_THRESHOLD = 0.5
CONFIDENCES = np.arange(101) / 100  # where the curves over the confidence are sampled: 0.00, 0.01, ..., 1.00
BACKGROUND = "background"
PICTURES = ("confusion_matrix", "pr_curve", "f1_curve")  # the PNGs written beside metrics.json, and TensorBoard's tags
LEGEND_CLASSES = 10  # more classes than this: their curves thin and grey, without a legend


def match_boxes(truth: Tensor, detections: Tensor, iou_threshold: float = IOU_THRESHOLD) -> list[tuple[int, int]]:
    """One-to-one ``(ground truth, detection)`` index pairs of ``truth [G,4]`` and ``detections [D,4]`` (xyxy), whatever
    their classes: every pair of IoU >= ``iou_threshold`` in order of decreasing IoU, each taken when neither its ground
    truth nor its detection is taken yet (greedy one-to-one matching by IoU, as Ultralytics' ConfusionMatrix
    matches)."""
    if not len(truth) or not len(detections):
        return []
    iou = box_iou(truth.double(), detections.double())
    rows, columns = torch.nonzero(iou >= iou_threshold, as_tuple=True)
    pairs: list[tuple[int, int]] = []
    taken_truth, taken_detections = set(), set()
    for i in iou[rows, columns].argsort(descending=True, stable=True).tolist():
        g, d = int(rows[i]), int(columns[i])
        if g not in taken_truth and d not in taken_detections:
            pairs.append((g, d))
            taken_truth.add(g)
            taken_detections.add(d)
    return pairs


def confusion_matrix(
    truth: Sequence[dict[str, Tensor]],
    detections: Sequence[dict[str, Tensor]],
    category_ids: Sequence[int],
    score_threshold: float,
    iou_threshold: float = IOU_THRESHOLD,
) -> Tensor:
    """The detection confusion matrix ``[C+1,C+1]`` int64 over images: rows the true class of ``category_ids`` then
    background, columns the predicted class then background.

    Per image, ``truth[i]`` ``{"boxes" [G,4] xyxy, "labels" [G] category ids}`` and ``detections[i]`` (the same with
    ``"scores" [D]``): the detections scoring at least ``score_threshold`` are matched to the ground truth of any
    class by :func:`match_boxes` at IoU ``iou_threshold``; a pair counts in (true class, predicted class), a detection
    left unmatched in (background, predicted class), a ground truth left unmatched in (true class, background).
    Detections of ids outside ``category_ids`` are left out, as COCOeval leaves them out.
    """
    index = {int(c): i for i, c in enumerate(category_ids)}
    background = len(index)
    matrix = torch.zeros(background + 1, background + 1, dtype=torch.int64)
    for target, found in zip(truth, detections, strict=True):
        known = torch.tensor([int(c) in index for c in found["labels"].tolist()], dtype=torch.bool)
        keep = (found["scores"] >= score_threshold) & known
        boxes, labels = found["boxes"][keep], found["labels"][keep].tolist()
        true_classes = [index[int(c)] for c in target["labels"].tolist()]
        pairs = match_boxes(target["boxes"], boxes, iou_threshold)
        for g, d in pairs:
            matrix[true_classes[g], index[labels[d]]] += 1
        matched_truth, matched_detections = {g for g, _ in pairs}, {d for _, d in pairs}
        for g, row in enumerate(true_classes):
            if g not in matched_truth:
                matrix[row, background] += 1
        for d, label in enumerate(labels):
            if d not in matched_detections:
                matrix[background, index[label]] += 1
    return matrix


def coco_boxes(
    coco_gt: COCO, results: Sequence[dict[str, Any]], image_ids: Sequence[int]
) -> tuple[list[dict[str, Tensor]], list[dict[str, Tensor]]]:
    """The ground truth of ``coco_gt`` (crowd regions left out) and the COCO ``results`` dicts (``bbox`` xywh) of
    ``image_ids``, per image, as :func:`confusion_matrix` reads them: ``{"boxes" [G,4] xyxy, "labels" [G]}`` and
    ``{"boxes" [D,4] xyxy, "labels" [D], "scores" [D]}``."""
    by_image: dict[int, list[dict[str, Any]]] = {int(i): [] for i in image_ids}
    for result in results:
        by_image.setdefault(int(result["image_id"]), []).append(result)

    def boxes(records: list[dict[str, Any]]) -> Tensor:
        return box_convert(torch.tensor([r["bbox"] for r in records], dtype=torch.float64).view(-1, 4), "xywh", "xyxy")

    truth, detections = [], []
    for image_id in image_ids:
        annotations = [a for a in coco_gt.imgToAnns.get(int(image_id), []) if not a.get("iscrowd", 0)]
        truth.append(
            {
                "boxes": boxes(annotations),
                "labels": torch.tensor([a["category_id"] for a in annotations], dtype=torch.int64),
            }
        )
        found = by_image[int(image_id)]
        detections.append(
            {
                "boxes": boxes(found),
                "labels": torch.tensor([r["category_id"] for r in found], dtype=torch.int64),
                "scores": torch.tensor([r["score"] for r in found], dtype=torch.float64),
            }
        )
    return truth, detections


def evaluate_at_iou(
    coco_gt: COCO, results: Sequence[dict[str, Any]], image_ids: Sequence[int], iou_threshold: float = IOU_THRESHOLD
) -> COCOeval:
    """pycocotools' box evaluation of ``results`` against ``coco_gt`` over ``image_ids`` at IoU ``iou_threshold`` alone,
    every area, its largest ``maxDets`` (100), evaluated and accumulated: the matching and precision array of the
    validation's AP50."""
    evaluator = COCOeval(coco_gt, results_coco(coco_gt, list(results)), "bbox")
    params = evaluator.params
    params.imgIds = sorted(int(i) for i in image_ids)
    params.iouThrs = np.array([iou_threshold])
    params.areaRng, params.areaRngLbl, params.maxDets = params.areaRng[:1], params.areaRngLbl[:1], params.maxDets[-1:]
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator.evaluate()
        evaluator.accumulate()
    return evaluator


def confidence_curves(evaluator: COCOeval, confidences: np.ndarray = CONFIDENCES) -> dict[int, dict[str, np.ndarray]]:
    """Per category with ground truth: ``{"precision", "recall", "f1"}`` ``[len(confidences)]`` of the detections
    scoring at least each of the ``confidences [S]``, counted from ``evaluator.evalImgs`` of the evaluated
    ``evaluator`` at its first IoU threshold, first area range and largest ``maxDets`` (a detection matched to a ground
    truth is a true positive; those COCOeval ignores, on crowd regions, are left out). Precision is 1 where no
    detection scores that high; F1 is ``2PR / (P + R)``, 0 where both are 0."""
    params = evaluator.params
    images, areas = len(params.imgIds), len(params.areaRng)
    curves = {}
    for k, category in enumerate(params.catIds):
        evaluated = [e for e in evaluator.evalImgs[k * areas * images : k * areas * images + images] if e is not None]
        positives = sum(int((e["gtIgnore"] == 0).sum()) for e in evaluated)
        if positives == 0:
            continue
        scores = np.concatenate([np.asarray(e["dtScores"], dtype=np.float64) for e in evaluated])
        matched = np.concatenate([e["dtMatches"][0] > 0 for e in evaluated])
        counted = ~np.concatenate([e["dtIgnore"][0].astype(bool) for e in evaluated])
        order = np.argsort(scores[counted], kind="stable")
        scores, matched = scores[counted][order], matched[counted][order]
        below = np.searchsorted(scores, confidences, side="left")  # detections scoring under each confidence
        true_below = np.concatenate([[0], np.cumsum(matched)])
        true_positives = true_below[-1] - true_below[below]
        detected = len(scores) - below
        precision = np.where(detected > 0, true_positives / np.maximum(detected, 1), 1.0)
        recall = true_positives / positives
        f1 = np.where(precision + recall > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-12), 0.0)
        curves[int(category)] = {"precision": precision, "recall": recall, "f1": f1}
    return curves


def best_f1(f1: np.ndarray, confidences: np.ndarray = CONFIDENCES) -> tuple[float, float]:
    """``(best F1, its confidence)`` of a curve ``f1 [S]`` over ``confidences [S]``: the lowest confidence where a
    tie."""
    i = int(np.argmax(f1))
    return float(f1[i]), float(confidences[i])


def mean_f1(curves: dict[int, dict[str, np.ndarray]], confidences: np.ndarray = CONFIDENCES) -> np.ndarray:
    """The F1 curve ``[S]`` of :func:`confidence_curves` (``curves``, over ``confidences [S]``) averaged over the
    categories (zeros without any)."""
    return np.mean([c["f1"] for c in curves.values()], 0) if curves else np.zeros_like(confidences)


@dataclass
class DetectionReport:
    """What :func:`detection_report` finds: ``matrix`` ``[C+1,C+1]`` (:func:`confusion_matrix`, rows true, columns
    predicted,
    last background) over ``category_ids`` named ``names``; per category with ground truth, ``curves`` over
    ``confidences``
    (:func:`confidence_curves`) and ``pr_precision`` (COCO's interpolated precision ``[R]`` at ``recall_levels``, whose
    mean is that category's AP50)."""

    category_ids: list[int]
    names: list[str]
    matrix: Tensor
    score_threshold: float
    iou_threshold: float
    confidences: np.ndarray
    curves: dict[int, dict[str, np.ndarray]]
    recall_levels: np.ndarray
    pr_precision: dict[int, np.ndarray]

    @property
    def mean_f1(self) -> np.ndarray:
        """:func:`mean_f1` of the curves."""
        return mean_f1(self.curves, self.confidences)

    @property
    def best(self) -> tuple[float, float]:
        """``(best F1, its confidence)`` of :attr:`mean_f1` (:func:`best_f1`)."""
        return best_f1(self.mean_f1, self.confidences)

    def to_json(self) -> dict[str, Any]:
        """The numbers for ``metrics.json``'s ``bbox`` section: ``best_f1`` and ``best_f1_threshold`` (of
        :attr:`mean_f1`),
        ``confusion_matrix`` (``classes``, ``counts`` as a list of rows) and ``curves`` per category."""
        f1, threshold = self.best
        name = dict(zip(self.category_ids, self.names))
        per_category = []
        for category, curve in self.curves.items():
            category_f1, category_threshold = best_f1(curve["f1"], self.confidences)
            per_category.append(
                {
                    "id": category,
                    "name": name[category],
                    "best_f1": category_f1,
                    "best_f1_threshold": category_threshold,
                    "AP50": float(self.pr_precision[category].mean()),
                    **{key: [round(float(v), 6) for v in values] for key, values in curve.items()},
                    "pr_precision": [round(float(v), 6) for v in self.pr_precision[category]],
                }
            )
        return {
            "best_f1": f1,
            "best_f1_threshold": threshold,
            "confusion_matrix": {
                "classes": [*self.names, BACKGROUND],
                "rows": "true class",
                "columns": "predicted class",
                "score_threshold": self.score_threshold,
                "iou_threshold": self.iou_threshold,
                "counts": self.matrix.tolist(),
            },
            "curves": {
                "confidence": [float(c) for c in self.confidences],
                "recall_levels": [float(r) for r in self.recall_levels],
                "per_category": per_category,
            },
        }


def detection_report(
    coco_gt: COCO,
    results: Sequence[dict[str, Any]],
    image_ids: Sequence[int],
    score_threshold: float | None = None,
    iou_threshold: float = IOU_THRESHOLD,
    evaluated: COCOeval | None = None,
) -> DetectionReport:
    """The report of COCO results dicts ``results`` (``bbox`` xywh) over ``image_ids`` against ``coco_gt``: the curves
    of
    every detection, and the confusion matrix of the detections scoring at least ``score_threshold`` (None: the
    confidence
    of the best mean F1, where the detector does best, so that the matrix shows what is left to fix there).
    ``evaluated``: the box evaluation of the same results and images already evaluated and accumulated (a validation's,
    whose first IoU threshold is ``iou_threshold``), read instead of evaluating them again."""
    categories = sorted(coco_gt.dataset.get("categories", []), key=lambda c: c["id"])
    category_ids = [int(c["id"]) for c in categories]
    if evaluated is not None and evaluated.params.iouThrs[0] != iou_threshold:
        raise ValueError(
            f"detection_report: the evaluation given starts at IoU {evaluated.params.iouThrs[0]}, not {iou_threshold}"
        )
    evaluator = evaluated or evaluate_at_iou(coco_gt, results, image_ids, iou_threshold)
    curves = confidence_curves(evaluator)
    precision = evaluator.eval["precision"][0, :, :, 0, -1]  # [R,K]
    pr_precision = {c: precision[:, evaluator.params.catIds.index(c)].copy() for c in curves}
    if score_threshold is None:
        score_threshold = best_f1(mean_f1(curves))[1]
    matrix = confusion_matrix(*coco_boxes(coco_gt, results, image_ids), category_ids, score_threshold, iou_threshold)
    return DetectionReport(
        category_ids,
        [str(c["name"]) for c in categories],
        matrix,
        float(score_threshold),
        iou_threshold,
        CONFIDENCES,
        curves,
        np.asarray(evaluator.params.recThrs),
        pr_precision,
    )


def _rendered(figure: Figure) -> Tensor:
    """``figure`` drawn by matplotlib's Agg canvas: ``[3,H,W]`` uint8."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return torch.from_numpy(np.asarray(canvas.buffer_rgba())[..., :3].copy()).permute(2, 0, 1)


def draw_confusion_matrix(report: DetectionReport) -> Tensor:
    """The confusion matrix of ``report``, each row shaded by its fraction of the row (white 0, dark blue 1) and its
    counts written in while there are at most 30 rows; ``[3,H,W]`` uint8."""
    counts = report.matrix.double()
    fractions = (counts / counts.sum(1, keepdim=True).clamp_min(1)).numpy()
    labels = [*report.names, BACKGROUND]
    side = max(4.0, 0.45 * len(labels) + 2.0)
    figure = Figure(figsize=(side + 1, side), dpi=100)
    axes = figure.add_subplot()
    image = axes.imshow(fractions, cmap="Blues", vmin=0, vmax=1)
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04, label="fraction of the row")
    axes.set_xticks(range(len(labels)), labels, rotation=90)
    axes.set_yticks(range(len(labels)), labels)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    axes.set_title(
        f"detections scoring >= {report.score_threshold:g}, matched one-to-one at IoU >= {report.iou_threshold:g}",
        fontsize=9,
    )
    if len(labels) <= 30:
        for (row, column), count in np.ndenumerate(report.matrix.numpy()):
            if count:
                axes.text(
                    column,
                    row,
                    str(count),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if fractions[row, column] > 0.5 else "black",
                )
    figure.tight_layout()
    return _rendered(figure)


def _curve_figure(x_label: str, y_label: str, title: str) -> tuple[Figure, Any]:
    figure = Figure(figsize=(7, 5), dpi=100)
    axes = figure.add_subplot()
    axes.set(xlim=(0, 1), ylim=(0, 1.02), xlabel=x_label, ylabel=y_label, title=title)
    axes.grid(alpha=0.3)
    return figure, axes


def _draw_curves(axes: Any, x: np.ndarray, ys: dict[int, np.ndarray], labels: dict[int, str], mean_label: str) -> None:
    """One line per category (labelled, or thin and grey past ``LEGEND_CLASSES``) and their mean in bold."""
    few = len(ys) <= LEGEND_CLASSES
    for category, y in ys.items():
        axes.plot(x, y, linewidth=1, **({"label": labels[category]} if few else {"color": "grey", "alpha": 0.4}))
    if ys:
        axes.plot(x, np.mean(list(ys.values()), 0), color="black", linewidth=2.5, label=mean_label)
        axes.legend(loc="best", fontsize=8)


def draw_pr_curves(report: DetectionReport) -> Tensor:
    """Precision over recall per category of ``report`` (COCO's interpolated precision at IoU 0.5, AP50 in the legend)
    and their mean; ``[3,H,W]`` uint8."""
    figure, axes = _curve_figure(
        "recall", "precision", f"precision-recall at IoU {report.iou_threshold:g} (legend: AP50)"
    )
    name = dict(zip(report.category_ids, report.names))
    labels = {c: f"{name[c]} {p.mean():.3f}" for c, p in report.pr_precision.items()}
    mean_ap50 = float(np.mean([p.mean() for p in report.pr_precision.values()])) if report.pr_precision else 0.0
    _draw_curves(axes, report.recall_levels, report.pr_precision, labels, f"all classes {mean_ap50:.3f} AP50")
    return _rendered(figure)


def draw_f1_curves(report: DetectionReport) -> Tensor:
    """F1 over the confidence per category of ``report`` (its best in the legend) and their mean, whose best is the
    report's ``best_f1`` at ``best_f1_threshold``; ``[3,H,W]`` uint8."""
    figure, axes = _curve_figure(
        "confidence",
        "F1",
        f"F1 over the confidence at IoU {report.iou_threshold:g} (legend: best F1 at its confidence)",
    )
    name = dict(zip(report.category_ids, report.names))
    f1 = {c: curve["f1"] for c, curve in report.curves.items()}
    labels = {c: "{} {:.2f} at {:.2f}".format(name[c], *best_f1(y, report.confidences)) for c, y in f1.items()}
    _draw_curves(axes, report.confidences, f1, labels, "all classes {:.2f} at {:.2f}".format(*report.best))
    return _rendered(figure)


def report_pictures(report: DetectionReport) -> dict[str, Tensor]:
    """``{"confusion_matrix", "pr_curve", "f1_curve"}``: the pictures of ``report``, ``[3,H,W]`` uint8 each."""
    return {
        "confusion_matrix": draw_confusion_matrix(report),
        "pr_curve": draw_pr_curves(report),
        "f1_curve": draw_f1_curves(report),
    }


def write_pictures(pictures: dict[str, Tensor], folder: str | Path) -> list[Path]:
    """Writes each of the ``pictures`` (:func:`report_pictures`, ``[3,H,W]`` uint8) as ``folder/<name>.png`` under
    ``folder``; returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.png" for name in pictures]
    for path, picture in zip(paths, pictures.values()):
        write_png(picture, str(path))
    return paths


def write_validation_report(
    evaluator: CocoEvaluator, stats: dict[str, float], folder: str | Path
) -> tuple[DetectionReport, dict[str, Tensor]]:
    """After ``evaluator.compute()`` gave ``stats`` (on rank 0, which holds the merged results, the images and their
    evaluation, reused here): writes into ``folder`` the results of ``evaluator`` (``bbox_results.json``),
    ``metrics.json``'s ``bbox`` section (``stats``, per category, and :meth:`DetectionReport.to_json`) and the
    report's pictures (the confusion matrix at the best-F1 confidence); returns the report and its pictures."""
    folder = Path(folder)
    report = detection_report(
        evaluator.coco_gt, evaluator.merged_results, evaluator.image_ids, evaluated=evaluator.cocoeval
    )
    evaluator.write_results(folder / "bbox_results.json")
    evaluator.write_metrics({**stats, **report.to_json()}, folder / "metrics.json")
    pictures = report_pictures(report)
    write_pictures(pictures, folder)
    return report, pictures
