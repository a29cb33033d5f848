"""Per-category results, as mmdetection's ``classwise`` table: rows of scores by category, the worst
ones first, as plain text (console) or Markdown (TensorBoard's text tab). No Lightning here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pycocotools.cocoeval import COCOeval

# Per-category columns read from COCOeval's precision array: (name, IoU-threshold index or None for
# the mean over 0.50:0.95, area-range index), at the largest maxDets, as COCOeval.summarize reads them.
COCO_COLUMNS = (("AP", None, 0), ("AP50", 0, 0), ("AP75", 5, 0), ("APs", None, 1), ("APm", None, 2), ("APl", None, 3))


def coco_per_category(evaluator: COCOeval, category_names: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """``[{"id", "name", "AP", "AP50", "AP75", "APs", "APm", "APl"}]`` per category of an accumulated
    ``evaluator``, from ``evaluator.eval["precision"]`` ``[T, R, K, A, M]``: the mean of the
    precisions above -1 (None where the category has no ground truth in that area range). The names come from
    ``category_names`` (id -> name; default: the ground truth's categories)."""
    precision = evaluator.eval["precision"]
    names = category_names or {int(c["id"]): c["name"] for c in evaluator.cocoGt.dataset.get("categories", [])}
    rows = []
    for k, category in enumerate(evaluator.params.catIds):
        row: dict[str, Any] = {"id": int(category), "name": names.get(int(category), str(category))}
        for column, iou, area in COCO_COLUMNS:
            values = precision[:, :, k, area, -1] if iou is None else precision[iou, :, k, area, -1]
            values = values[values > -1]
            row[column] = float(np.mean(values)) if values.size else None
        rows.append(row)
    return rows


def worst(rows: Sequence[dict[str, Any]], key: str, count: int = 10) -> list[dict[str, Any]]:
    """The ``count`` ``rows`` (per-category dicts) with the lowest ``key`` (rows where it is None or NaN left out),
    lowest first."""
    scored = [row for row in rows if row.get(key) is not None and not math.isnan(row[key])]
    return sorted(scored, key=lambda row: row[key])[:count]


def _cell(value: Any, percent: bool) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{100 * value:.1f}" if percent else f"{value:.3f}"
    return str(value)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], title: str = "", percent: bool = True) -> str:
    """``rows`` as an aligned plain-text table of ``"name"`` and ``columns`` under the line ``title`` (none when empty);
    with ``percent`` fractions are shown in %, else with three decimals."""
    header = ["category", *columns]
    cells = [[str(row["name"]), *(_cell(row.get(c), percent) for c in columns)] for row in rows]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]
    lines = [title] if title else []
    for line in [header, *cells]:
        lines.append(
            "  ".join(f"{cell:<{w}}" if i == 0 else f"{cell:>{w}}" for i, (cell, w) in enumerate(zip(line, widths)))
        )
    return "\n".join(lines)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], percent: bool = True) -> str:
    """``rows`` as a Markdown table of ``"name"`` and ``columns`` (TensorBoard renders it in its text tab); with
    ``percent`` fractions are shown in %, else with three decimals."""
    lines = ["| category | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for row in rows:
        lines.append(f"| {row['name']} | " + " | ".join(_cell(row.get(c), percent) for c in columns) + " |")
    return "\n".join(lines)


def worst_table(rows: Sequence[dict[str, Any]], key: str, columns: Sequence[str], what: str, count: int = 10) -> str:
    """The printed summary: the ``count`` ``rows`` (categories) with the lowest ``key``, their ``columns`` in %, under a
    title that starts with ``what``."""
    shown = worst(rows, key, count)
    return format_table(
        shown, columns, title=f"{what}: the {len(shown)} lowest {key} of {len(rows)} categories (all in metrics.json)"
    )
