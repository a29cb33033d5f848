"""Prediction pictures: boxes drawn above the score threshold only, and an image without any left as it is."""

from __future__ import annotations

import warnings

import torch

from vision_tx.visualize import draw_detections


def test_boxes_under_the_threshold_are_not_drawn_and_no_box_leaves_the_image_unchanged() -> None:
    image = torch.zeros(3, 40, 60, dtype=torch.uint8)
    boxes, labels = torch.tensor([[5.0, 5.0, 20.0, 20.0], [30.0, 10.0, 50.0, 30.0]]), torch.tensor([1, 2])
    drawn = draw_detections(image, boxes, labels, torch.tensor([0.9, 0.2]), {1: "cat", 2: "dog"}, score_threshold=0.5)
    changed = (drawn != image).any(0)
    assert (
        changed[5:21, 5:21].any() and not changed[22:, 25:].any()
    )  # the second box (its lower half here) scores under 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torchvision warns when it is handed no box
        assert torch.equal(draw_detections(image, boxes, labels, torch.tensor([0.1, 0.2])), image)
        assert torch.equal(draw_detections(image, boxes[:0], labels[:0]), image)
