"""Semantic-segmentation scores: mIoU, mean class accuracy and overall pixel accuracy (as mmsegmentation).

Per-class pixel areas (intersection, union, prediction, ground truth) are summed over the whole
dataset and only then divided, so the result does not depend on how images are batched or split
across processes. A class absent from both predictions and ground truth has no IoU (NaN) and is
left out of the mean; pixels labelled ``ignore_index`` are not counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torchmetrics import Metric

from vision_tx.metrics.classwise import format_table, worst


class MeanIoU(Metric):
    """Accumulates ``update(preds, target)`` with class-index maps of one shape (``[B, H, W]`` or ``[H, W]``).

    :meth:`compute` returns ``{"mIoU", "mAcc", "aAcc"}`` as floats in ``[0, 1]`` and ``"IoU"``,
    ``"Acc"`` as ``[num_classes]`` tensors (NaN where undefined).
    """

    full_state_update = False

    def __init__(self, num_classes: int, ignore_index: int = 255, class_names: Sequence[str] | None = None) -> None:
        super().__init__()
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(f"{len(class_names)} class names for {num_classes} classes")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.class_names = tuple(class_names) if class_names is not None else tuple(str(i) for i in range(num_classes))
        for name in ("area_intersect", "area_union", "area_pred", "area_label"):
            self.add_state(name, torch.zeros(num_classes, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        if preds.shape != target.shape:
            raise ValueError(f"preds {tuple(preds.shape)} and target {tuple(target.shape)} differ in shape")
        valid = target != self.ignore_index
        preds, target = preds[valid].long(), target[valid].long()
        if target.numel() and (target.min() < 0 or target.max() >= self.num_classes):
            raise ValueError(
                f"target holds labels outside 0..{self.num_classes - 1} besides ignore_index {self.ignore_index}"
            )
        if preds.numel() and (preds.min() < 0 or preds.max() >= self.num_classes):
            raise ValueError(f"preds hold classes outside 0..{self.num_classes - 1}")
        area_intersect = torch.bincount(target[preds == target], minlength=self.num_classes)
        area_pred = torch.bincount(preds, minlength=self.num_classes)
        area_label = torch.bincount(target, minlength=self.num_classes)
        self.area_intersect += area_intersect
        self.area_pred += area_pred
        self.area_label += area_label
        self.area_union += area_pred + area_label - area_intersect

    def compute(self) -> dict[str, torch.Tensor | float]:
        intersect = self.area_intersect.double()
        iou = intersect / self.area_union.double()  # 0/0 -> NaN: class in neither
        acc = intersect / self.area_label.double()  # NaN where the class is not in the ground truth
        total = self.area_label.sum().double()
        return {
            "mIoU": float(iou.nanmean()),
            "mAcc": float(acc.nanmean()),
            "aAcc": float(intersect.sum() / total),
            "IoU": iou,
            "Acc": acc,
        }

    def per_category(self) -> list[dict[str, object]]:
        """``[{"id", "name", "IoU", "Acc"}]`` per class (None where undefined)."""
        result = self.compute()
        return [
            {
                "id": index,
                "name": name,
                "IoU": None if math.isnan(iou) else iou,
                "Acc": None if math.isnan(acc) else acc,
            }
            for index, (name, iou, acc) in enumerate(
                zip(self.class_names, result["IoU"].tolist(), result["Acc"].tolist())
            )
        ]

    def summary(self) -> dict[str, object]:
        """The ``metrics.json`` section: ``{"mIoU", "mAcc", "aAcc", "per_category": per_category()}``."""
        result = self.compute()
        return {
            "mIoU": result["mIoU"],
            "mAcc": result["mAcc"],
            "aAcc": result["aAcc"],
            "per_category": self.per_category(),
        }

    def table(self, count: int | None = None) -> str:
        """Per-class IoU and accuracy (in %), one line per class (the ``count`` of lowest IoU, lowest
        first, when given), then the means, as a printable table.

        Classes in neither the ground truth nor the predictions (IoU undefined, left out of the means)
        are counted in one line instead of listed.
        """
        result = self.compute()
        rows = [row for row in self.per_category() if row["IoU"] is not None]
        absent = len(self.class_names) - len(rows)
        title = ""
        if count is not None:
            rows = worst(rows, "IoU", count)
            title = f"the {len(rows)} classes of lowest IoU of {len(self.class_names)} (all in metrics.json)"
        lines = [format_table(rows, ("IoU", "Acc"), title=title)]
        lines.append(
            f"mean IoU {result['mIoU'] * 100:.2f}  mean Acc {result['mAcc'] * 100:.2f}  aAcc {result['aAcc'] * 100:.2f}"
        )
        if absent:
            lines.append(
                f"({absent} of {len(self.class_names)} classes are in neither the ground truth nor the predictions: "
                "not listed)"
            )
        return "\n".join(lines)
