"""Each rule of panopticapi's ``pq_compute``, on both sides of its threshold, on one-row maps.

A map is one row of pixels; ``_row`` paints segment ids over column ranges. Ground-truth segment 1
is category ``A`` on columns 0..9 (10 pixels) unless a test says otherwise.
"""

from __future__ import annotations

import pytest
import torch

from vision_tx.metrics.panoptic import panoptic_image_stats

A, B = 1, 2
WIDTH = 40


def _row(*spans: tuple[int, int, int]) -> torch.Tensor:
    """A ``[1, WIDTH]`` id map: ``(segment id, first column, end column)`` painted in order, 0 elsewhere."""
    ids = torch.zeros(1, WIDTH, dtype=torch.int64)
    for segment, start, end in spans:
        ids[0, start:end] = segment
    return ids


def _stats(gt_ids, gt_segments, pred_ids, pred_segments) -> dict[int, list[float]]:
    return panoptic_image_stats(gt_ids, gt_segments, pred_ids, pred_segments, {A, B})


@pytest.mark.parametrize(
    ("pred_end", "extra", "matched"),
    [
        (6, 0, True),  # 6 of 10 pixels: IoU 0.6
        (5, 0, False),  # 5 / 10: IoU exactly 0.5 is no match (IoU > 0.5)
        (5, 1, False),  # 5 / 11: IoU 0.45
        (9, 7, True),  # 9 / 17: IoU 0.53
    ],
)
def test_match_needs_iou_above_one_half(pred_end: int, extra: int, matched: bool) -> None:
    # The prediction's extra columns lie on a ground-truth segment of another category: in the union.
    gt = _row((1, 0, 10), (2, 10, 30))
    pred = _row((5, 0, pred_end), (5, 10, 10 + extra))
    stats = _stats(gt, [{"id": 1, "category_id": A}, {"id": 2, "category_id": B}], pred, [{"id": 5, "category_id": A}])
    tp, fp, fn, iou_sum = stats[A]
    if matched:
        assert (tp, fp, fn) == (1, 0, 0) and iou_sum == pytest.approx(pred_end / (10 + extra))
    else:
        assert (tp, fp, fn, iou_sum) == (0, 1, 1, 0)


def test_void_pixels_leave_the_union() -> None:
    # 3 pixels on void and 5 (6) on the segment: IoU 5 / 10 (6 / 10) without the void pixels, no match (a match);
    # unmatched, 3 void pixels of 8 are not enough to drop it: a false positive.
    gt = _row((1, 0, 10))
    for on_segment, matched in ((5, False), (6, True)):
        pred = _row((5, 0, on_segment), (5, 20, 23))
        tp, fp, fn, iou_sum = _stats(gt, [{"id": 1, "category_id": A}], pred, [{"id": 5, "category_id": A}])[A]
        assert (tp, fp, fn) == ((1, 0, 0) if matched else (0, 1, 1))
        assert iou_sum == pytest.approx(0.6 if matched else 0)


@pytest.mark.parametrize(
    ("void", "crowd", "false_positive"),
    [
        (6, 0, False),  # 6 of 10 pixels on void: more than half, dropped
        (5, 0, True),  # exactly half: a false positive
        (0, 6, False),  # 6 of 10 on a crowd region of its category
        (3, 3, False),  # void and crowd pixels add up: 6 of 10
        (2, 3, True),  # 5 of 10
        (4, 0, True),
    ],
)
def test_unmatched_prediction_dropped_when_mostly_void_or_crowd(void: int, crowd: int, false_positive: bool) -> None:
    # Prediction 5 (category A, 10 pixels): `void` columns on unlabelled ground truth, `crowd` on the
    # crowd of A (ground-truth 3), the rest on ground-truth segment 2 of category B (no match: other category).
    gt = _row((2, 0, 20), (3, 20, 30))
    pred = _row((5, 0, 10 - void - crowd), (5, 20, 20 + crowd), (5, 35, 35 + void))
    gt_segments = [{"id": 2, "category_id": B}, {"id": 3, "category_id": A, "iscrowd": 1}]
    stats = _stats(gt, gt_segments, pred, [{"id": 5, "category_id": A}])
    assert stats.get(A, [0, 0, 0, 0])[1] == (1 if false_positive else 0)
    assert stats[B][2] == 1  # segment 2 is missed either way
    assert A not in stats or stats[A][2] == 0  # a crowd segment is never a false negative


def test_crowd_regions_count_for_their_own_category_only() -> None:
    # 6 of 10 pixels on a crowd of B: for a prediction of A that is no excuse, for one of B it is.
    gt = _row((3, 0, 6))
    for category, false_positive in ((A, True), (B, False)):
        pred = _row((5, 0, 10))
        stats = _stats(gt, [{"id": 3, "category_id": B, "iscrowd": 1}], pred, [{"id": 5, "category_id": category}])
        assert stats.get(category, [0, 0, 0, 0])[:3] == ([0, 1, 0] if false_positive else [0, 0, 0])


def test_crowd_segment_matches_nothing() -> None:
    # A prediction equal to a crowd region of its category: no true positive, no false positive, no false negative.
    gt = _row((3, 0, 10))
    stats = _stats(gt, [{"id": 3, "category_id": A, "iscrowd": 1}], _row((5, 0, 10)), [{"id": 5, "category_id": A}])
    assert stats.get(A, [0, 0, 0, 0]) == [0, 0, 0, 0]


def test_every_crowd_region_of_the_category_counts() -> None:
    # Two crowd regions of A, 3 pixels of the prediction on each: 6 of 10, dropped (panopticapi, which
    # looks at the last crowd listed, would see 3 of 10; COCO has one crowd per category and image).
    gt = _row((3, 0, 3), (4, 3, 6), (2, 6, 20))
    gt_segments = [
        {"id": 3, "category_id": A, "iscrowd": 1},
        {"id": 4, "category_id": A, "iscrowd": 1},
        {"id": 2, "category_id": B},
    ]
    stats = _stats(gt, gt_segments, _row((5, 0, 10)), [{"id": 5, "category_id": A}])
    assert stats.get(A, [0, 0, 0, 0])[1] == 0
