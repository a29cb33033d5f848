"""The COCO evaluator's rules on both sides of each threshold: area ranges, max detections, crowd matching.

``CocoEvaluator`` takes xyxy boxes in pixels and hands pycocotools xywh results; each test builds a
one-image ground truth in memory whose answer is known by hand, and checks it against pycocotools
run directly on the same results.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from vision_tx.metrics.coco import STAT_NAMES, CocoEvaluator

CATEGORY = 1


def _ground_truth(boxes: list[tuple[float, float, float, float]], crowd: list[bool] | None = None) -> COCO:
    """One 400x400 image with xywh ``boxes`` of one category, areas from the boxes."""
    crowd = crowd or [False] * len(boxes)
    annotations = [
        {
            "id": i + 1,
            "image_id": 1,
            "category_id": CATEGORY,
            "bbox": list(box),
            "area": box[2] * box[3],
            "iscrowd": int(c),
        }
        for i, (box, c) in enumerate(zip(boxes, crowd))
    ]
    coco = COCO()
    coco.dataset = {
        "images": [{"id": 1, "width": 400, "height": 400}],
        "categories": [{"id": CATEGORY, "name": "thing"}],
        "annotations": annotations,
    }
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def _evaluate(gt: COCO, boxes_xyxy: list[tuple[float, float, float, float]], scores: list[float]) -> dict[str, float]:
    evaluator = CocoEvaluator(gt)
    evaluator.update(
        [
            {
                "image_id": 1,
                "boxes": torch.tensor(boxes_xyxy, dtype=torch.float64).view(-1, 4),
                "scores": torch.tensor(scores),
                "labels": torch.full((len(scores),), CATEGORY),
            }
        ]
    )
    stats = evaluator.compute()
    with contextlib.redirect_stdout(io.StringIO()):
        reference = COCOeval(gt, gt.loadRes([dict(r) for r in evaluator.merged_results]), "bbox")
        reference.evaluate()
        reference.accumulate()
        reference.summarize()
    assert list(stats.values()) == [float(v) for v in reference.stats]
    return stats


def _xyxy(box: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
    x, y, w, h = box
    return (x, y, x + w, y + h)


@pytest.mark.parametrize(
    ("side", "expected"),
    [
        (32, {"APs": 1.0, "APm": 1.0, "APl": -1.0}),  # area 32^2 is in both the small and the medium range
        (32.5, {"APs": -1.0, "APm": 1.0, "APl": -1.0}),  # just above: medium only
        (96, {"APs": -1.0, "APm": 1.0, "APl": 1.0}),  # 96^2: medium and large
        (96.5, {"APs": -1.0, "APm": -1.0, "APl": 1.0}),
    ],
)
def test_area_ranges(side: float, expected: dict[str, float]) -> None:
    box = (10.0, 20.0, side, side)
    stats = _evaluate(_ground_truth([box]), [_xyxy(box)], [0.9])
    assert {key: stats[key] for key in expected} == pytest.approx(expected)  # AP: a mean over 10 IoU thresholds
    assert stats["AP"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("rank", "ar1", "ar10", "ar100"),
    [(1, 1.0, 1.0, 1.0), (10, 0.0, 1.0, 1.0), (11, 0.0, 0.0, 1.0), (100, 0.0, 0.0, 1.0), (101, 0.0, 0.0, 0.0)],
)
def test_max_detections(rank: int, ar1: float, ar10: float, ar100: float) -> None:
    # 120 detections by falling score; the only true one is the rank-th: it counts for maxDets >= rank.
    box = (100.0, 100.0, 50.0, 50.0)
    boxes = [(300.0, 300.0, 310.0, 310.0)] * 120
    boxes[rank - 1] = _xyxy(box)
    stats = _evaluate(_ground_truth([box]), boxes, [1.0 - i / 200 for i in range(120)])
    assert (stats["AR1"], stats["AR10"], stats["AR100"]) == (ar1, ar10, ar100)


@pytest.mark.parametrize(("inside_crowd", "expected_ap"), [(True, 1.0), (False, 0.5)])
def test_detection_on_a_crowd_region_is_ignored(inside_crowd: bool, expected_ap: float) -> None:
    # One object and one crowd region; a higher-scored extra detection is ignored when it lies in the
    # crowd region (matched by intersection over its own area), a false positive elsewhere: precision
    # 1/2 at recall 1, AP 0.5 at IoU 0.5.
    person, crowd = (20.0, 20.0, 60.0, 60.0), (200.0, 200.0, 150.0, 150.0)
    extra = (220.0, 220.0, 40.0, 40.0) if inside_crowd else (100.0, 300.0, 40.0, 40.0)
    stats = _evaluate(_ground_truth([person, crowd], crowd=[False, True]), [_xyxy(extra), _xyxy(person)], [0.9, 0.8])
    assert stats["AP50"] == pytest.approx(expected_ap, abs=0.02)  # 101-point interpolation


def test_crowd_ground_truth_is_never_missed() -> None:
    # Only a crowd region and no detection on it: recall is over the non-crowd objects, which are all found.
    person, crowd = (20.0, 20.0, 60.0, 60.0), (200.0, 200.0, 150.0, 150.0)
    stats = _evaluate(_ground_truth([person, crowd], crowd=[False, True]), [_xyxy(person)], [0.9])
    assert stats["AR100"] == pytest.approx(1.0) and stats["AP"] == pytest.approx(1.0)
    assert list(stats) == list(STAT_NAMES)


@pytest.mark.parametrize(("shift", "ap50", "ap75"), [(14, 1.0, 1.0), (15, 1.0, 0.0), (31, 1.0, 0.0), (34, 0.0, 0.0)])
def test_iou_thresholds(shift: float, ap50: float, ap75: float) -> None:
    # A 100x100 object and its box shifted by `shift` pixels: IoU (100 - shift) / (100 + shift),
    # 0.754, 0.739, 0.527, 0.493 -- each side of 0.75 and of 0.5.
    box = (100.0, 100.0, 100.0, 100.0)
    stats = _evaluate(_ground_truth([box]), [_xyxy((100.0 + shift, 100.0, 100.0, 100.0))], [0.9])
    assert (stats["AP50"], stats["AP75"]) == pytest.approx((ap50, ap75))
