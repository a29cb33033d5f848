"""The detectors' validation report on cases small enough to count by hand: every cell of the confusion matrix,
the precision, recall and F1 over the confidence, COCO's precision-recall curve and the best-F1 confidence."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from torchvision.io import read_image

from vision_tx.metrics.classwise import coco_per_category
from vision_tx.metrics.coco import run_cocoeval
from vision_tx.metrics.detection_report import (
    BACKGROUND,
    CONFIDENCES,
    confusion_matrix,
    detection_report,
    match_boxes,
    report_pictures,
    write_pictures,
)

CATEGORIES = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]


def make_coco(
    annotations: list[tuple[int, int, list[float], int]], image_count: int, categories: list[dict] = CATEGORIES
) -> COCO:
    """Ground truth of ``image_count`` 200x200 images (ids 1..): ``(image_id, category_id, xyxy, iscrowd)`` each."""
    coco = COCO()
    coco.dataset = {
        "images": [{"id": i, "width": 200, "height": 200, "file_name": f"{i}.png"} for i in range(1, image_count + 1)],
        "categories": categories,
        "annotations": [
            {
                "id": n,
                "image_id": image,
                "category_id": category,
                "bbox": [x0, y0, x1 - x0, y1 - y0],
                "area": (x1 - x0) * (y1 - y0),
                "iscrowd": crowd,
            }
            for n, (image, category, (x0, y0, x1, y1), crowd) in enumerate(annotations, start=1)
        ],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def result(image: int, category: int, xyxy: list[float], score: float) -> dict[str, Any]:
    x0, y0, x1, y1 = xyxy
    return {"image_id": image, "category_id": category, "bbox": [x0, y0, x1 - x0, y1 - y0], "score": score}


# Two classes, three images, score threshold 0.5: (image, class, box, iscrowd) of the ground truth and (image, class,
# box, score) of the detections, each with the cell it counts in (rows true a, b, background; columns predicted a, b,
# background).
TRUTH = [
    (1, 1, [0, 0, 10, 10], 0),  # matched by an a at IoU 1 (a, a); its duplicate below is left over
    (1, 2, [20, 0, 30, 10], 0),  # found as an a: (b, a)
    (1, 2, [40, 0, 50, 10], 0),  # only a detection below the threshold on it: missed (b, background)
    (2, 1, [0, 0, 10, 10], 0),  # an a at IoU 0.5 exactly, scoring 0.5 exactly: (a, a)
    (2, 2, [20, 0, 30, 10], 0),  # a b at IoU 0.49: missed (b, background), the b left over (background, b)
    (2, 2, [40, 0, 50, 10], 0),  # a b at IoU 1 (b, b) though an a scoring higher overlaps it at IoU 0.6 (background, a)
    (2, 1, [60, 0, 70, 10], 0),  # nothing on it: (a, background)
    (3, 2, [0, 0, 10, 10], 0),  # an image without detections: (b, background)
    (3, 2, [100, 100, 150, 150], 1),  # a crowd region: not counted
]
DETECTIONS = [
    result(1, 1, [0, 0, 10, 10], 0.9),
    result(1, 1, [20, 0, 30, 10], 0.8),
    result(1, 1, [0, 0, 10, 9], 0.7),  # the duplicate: (background, a)
    result(1, 2, [40, 0, 50, 10], 0.2),  # below the threshold
    result(1, 2, [100, 100, 110, 110], 0.9),  # on the background: (background, b)
    result(2, 1, [0, 0, 10, 5], 0.5),
    result(2, 2, [20, 0, 30, 4.9], 0.9),
    result(2, 2, [40, 0, 50, 10], 0.6),
    result(2, 1, [40, 0, 50, 6], 0.95),
]
EXPECTED = [[2, 0, 1], [1, 1, 3], [2, 2, 0]]


def test_confusion_matrix_counts_every_case_in_its_cell() -> None:
    report = detection_report(make_coco(TRUTH, 3), DETECTIONS, [1, 2, 3], score_threshold=0.5)
    assert report.matrix.tolist() == EXPECTED
    written = report.to_json()["confusion_matrix"]
    assert written["classes"] == ["a", "b", BACKGROUND] and written["counts"] == EXPECTED
    assert (written["rows"], written["columns"], written["score_threshold"], written["iou_threshold"]) == (
        "true class",
        "predicted class",
        0.5,
        0.5,
    )


def test_confusion_matrix_of_tensors_leaves_unknown_classes_out() -> None:
    truth = [{"boxes": torch.tensor([[0.0, 0, 10, 10]]), "labels": torch.tensor([1])}]
    found = [
        {
            "boxes": torch.tensor([[0.0, 0, 10, 10], [50, 50, 60, 60]]),
            "labels": torch.tensor([7, 1]),
            "scores": torch.tensor([0.9, 0.9]),
        }
    ]
    # The class-7 detection is no category: the ground truth is missed, the other detection a background one.
    assert confusion_matrix(truth, found, [1], score_threshold=0.5).tolist() == [[0, 1], [1, 0]]


def test_matching_is_one_to_one_in_order_of_iou() -> None:
    truth = torch.tensor([[0.0, 0, 10, 10], [10, 0, 20, 10]])
    # d0 overlaps g0 at IoU 0.9 and g1 at 0.05; d1 overlaps g0 at IoU 0.95 and g1 at 0.5: d1 takes g0 (the largest
    # IoU), so d0 gets nothing (its IoU with g1 is under 0.5).
    detections = torch.tensor([[1.0, 0, 11, 10], [0.5, 0, 10.5, 10]])
    assert sorted(match_boxes(truth, detections)) == [(0, 1)]
    assert match_boxes(truth, detections[:0]) == [] and match_boxes(truth[:0], detections) == []


# One image pair for the curves: class a has 3 ground truths, its detections score 0.95 (true), 0.85 (false), 0.65
# (true), 0.5 (false), and one ground truth is missed; class b has one ground truth found at 0.75; class c has no ground
# truth and one detection (no curve).
CURVE_TRUTH = [
    (1, 1, [0, 0, 10, 10], 0),
    (1, 1, [20, 0, 30, 10], 0),
    (2, 1, [0, 0, 10, 10], 0),
    (2, 2, [20, 0, 30, 10], 0),
]
CURVE_DETECTIONS = [
    result(1, 1, [0, 0, 10, 10], 0.95),
    result(1, 1, [50, 50, 60, 60], 0.85),
    result(2, 1, [0, 0, 10, 10], 0.65),
    result(2, 1, [50, 50, 60, 60], 0.5),
    result(2, 2, [20, 0, 30, 10], 0.75),
    result(1, 3, [0, 0, 10, 10], 0.9),
]
CURVE_CATEGORIES = [*CATEGORIES, {"id": 3, "name": "c"}]


def by_confidence(pieces: list[tuple[int, int, float]]) -> np.ndarray:
    """A curve over ``CONFIDENCES`` from ``(first index, last index, value)`` pieces."""
    curve = np.full(len(CONFIDENCES), np.nan)
    for first, last, value in pieces:
        curve[first : last + 1] = value
    assert not np.isnan(curve).any()
    return curve


def test_precision_recall_and_f1_over_the_confidence_by_hand() -> None:
    report = detection_report(
        make_coco(CURVE_TRUTH, 2, CURVE_CATEGORIES), CURVE_DETECTIONS, [1, 2], score_threshold=0.5
    )
    assert list(report.curves) == [1, 2]  # c has no ground truth
    np.testing.assert_array_equal(report.confidences, np.arange(101) / 100)
    a = report.curves[1]
    # confidence: [0, 0.50] 2 true 2 false; (0.50, 0.65] 2 true 1 false; (0.65, 0.85] 1 and 1; (0.85, 0.95] 1 and 0;
    # above: none
    np.testing.assert_allclose(
        a["precision"], by_confidence([(0, 50, 1 / 2), (51, 65, 2 / 3), (66, 85, 1 / 2), (86, 95, 1), (96, 100, 1)])
    )
    np.testing.assert_allclose(a["recall"], by_confidence([(0, 65, 2 / 3), (66, 95, 1 / 3), (96, 100, 0)]))
    np.testing.assert_allclose(
        a["f1"], by_confidence([(0, 50, 4 / 7), (51, 65, 2 / 3), (66, 85, 0.4), (86, 95, 0.5), (96, 100, 0)])
    )
    np.testing.assert_allclose(report.curves[2]["f1"], by_confidence([(0, 75, 1), (76, 100, 0)]))

    written = report.to_json()
    a_row, b_row = written["curves"]["per_category"]
    # The best F1 of a at the lowest confidence of its plateau: 0.51 (at 0.50 the false detection scoring 0.50 counts).
    assert (a_row["name"], a_row["best_f1"], a_row["best_f1_threshold"]) == ("a", pytest.approx(2 / 3), 0.51)
    assert (b_row["best_f1"], b_row["best_f1_threshold"]) == (1.0, 0.0)
    # Overall: the mean of the two curves, best on a's plateau, (2/3 + 1) / 2; lower on both sides of it.
    assert written["best_f1"] == pytest.approx(5 / 6) and written["best_f1_threshold"] == 0.51
    assert report.mean_f1[50] == pytest.approx((4 / 7 + 1) / 2) and report.mean_f1[66] == pytest.approx((0.4 + 1) / 2)
    assert (
        len(a_row["f1"])
        == len(a_row["precision"])
        == len(a_row["recall"])
        == len(written["curves"]["confidence"])
        == 101
    )


def test_precision_recall_curve_is_cocos_and_gives_ap50() -> None:
    coco = make_coco(CURVE_TRUTH, 2, CURVE_CATEGORIES)
    report = detection_report(coco, CURVE_DETECTIONS, [1, 2], score_threshold=0.5)
    # a's interpolated precision at recall 0.00..1.00: 1 up to recall 1/3, 2/3 up to 2/3, 0 beyond.
    np.testing.assert_allclose(report.pr_precision[1], [1.0] * 34 + [2 / 3] * 33 + [0.0] * 34)
    np.testing.assert_allclose(report.pr_precision[2], np.ones(101))
    evaluator, _ = run_cocoeval(coco, CURVE_DETECTIONS, "bbox")  # the validation's whole COCO evaluation
    rows = report.to_json()["curves"]["per_category"]
    assert [row["AP50"] for row in rows] == pytest.approx([56 / 101, 1.0], abs=1e-12)
    assert [row["AP50"] for row in rows] == [
        row["AP50"] for row in coco_per_category(evaluator) if row["AP50"] is not None
    ]
    assert np.mean([row["AP50"] for row in rows]) == pytest.approx(evaluator.stats[1], abs=1e-12)


def test_pictures_are_drawn_and_written(tmp_path: Path) -> None:
    report = detection_report(make_coco(TRUTH, 3), DETECTIONS, [1, 2, 3], score_threshold=0.5)
    pictures = report_pictures(report)
    assert list(pictures) == ["confusion_matrix", "pr_curve", "f1_curve"]
    paths = write_pictures(pictures, tmp_path)
    assert [p.name for p in paths] == ["confusion_matrix.png", "pr_curve.png", "f1_curve.png"]
    for path, picture in zip(paths, pictures.values()):
        assert picture.dtype == torch.uint8 and picture.shape[0] == 3 and picture.shape[1] > 200
        assert torch.equal(read_image(str(path)), picture)


def test_an_empty_prediction_set_gives_zeros() -> None:
    report = detection_report(make_coco(TRUTH, 3), [], [1, 2, 3], score_threshold=0.5)
    assert report.matrix.tolist() == [[0, 0, 3], [0, 0, 5], [0, 0, 0]]
    written = report.to_json()
    assert written["best_f1"] == 0.0 and written["best_f1_threshold"] == 0.0
    report_pictures(report)


def test_confusion_matrix_is_at_the_best_f1_confidence_unless_given() -> None:
    coco = make_coco(CURVE_TRUTH, 2, CURVE_CATEGORIES)
    report = detection_report(coco, CURVE_DETECTIONS, [1, 2])
    assert report.score_threshold == 0.51 and report.to_json()["confusion_matrix"]["score_threshold"] == 0.51
    assert torch.equal(report.matrix, detection_report(coco, CURVE_DETECTIONS, [1, 2], score_threshold=0.51).matrix)
    assert not torch.equal(report.matrix, detection_report(coco, CURVE_DETECTIONS, [1, 2], score_threshold=0.5).matrix)


def test_a_validations_own_evaluation_gives_the_report_of_a_fresh_one() -> None:
    """The validation's full COCOeval (ten IoU thresholds, four area ranges, three maxDets) read at its IoU 0.5 row,
    area "all", 100 detections: the same curves, precision and matrix as an evaluation at IoU 0.5 alone; another first
    IoU threshold is refused."""
    for truth, count, categories, detections in (
        (TRUTH, 3, CATEGORIES, DETECTIONS),
        (CURVE_TRUTH, 2, CURVE_CATEGORIES, CURVE_DETECTIONS),
    ):
        coco = make_coco(truth, count, categories)
        image_ids = list(range(1, count + 1))
        evaluated, _ = run_cocoeval(coco, list(detections), "bbox", image_ids=image_ids)
        fresh, reused = (detection_report(coco, detections, image_ids, evaluated=e) for e in (None, evaluated))
        assert torch.equal(fresh.matrix, reused.matrix) and fresh.score_threshold == reused.score_threshold
        assert fresh.curves.keys() == reused.curves.keys() and fresh.pr_precision.keys() == reused.pr_precision.keys()
        for category in fresh.curves:
            for name in ("precision", "recall", "f1"):
                np.testing.assert_array_equal(fresh.curves[category][name], reused.curves[category][name])
            np.testing.assert_array_equal(fresh.pr_precision[category], reused.pr_precision[category])
    evaluated.params.iouThrs = evaluated.params.iouThrs[1:]
    with pytest.raises(ValueError, match="starts at IoU 0.55"):
        detection_report(coco, detections, image_ids, evaluated=evaluated)
