"""DETR post-processing: original-pixel xyxy boxes, category ids, no-object never chosen."""

from __future__ import annotations

import pytest
import torch

from vision_tx.heads.detr import normalize_targets, postprocess_detections


def test_boxes_in_original_pixels_and_best_real_class() -> None:
    logits = torch.full((2, 2, 4), -5.0)
    logits[0, 0, 2] = 3.0  # class 2
    logits[0, 1, 3], logits[0, 1, 1] = 9.0, 2.0  # no-object wins, class 1 is the best real class
    logits[1, :, 0] = 1.0
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.4], [0.25, 0.25, 0.5, 0.5]], [[0.1, 0.9, 0.2, 0.2], [0.5, 0.5, 1.0, 1.0]]])
    orig_sizes = torch.tensor([[480, 640], [100, 50]])
    results = postprocess_detections({"pred_logits": logits, "pred_boxes": boxes}, orig_sizes)

    torch.testing.assert_close(results[0]["boxes"], torch.tensor([[256.0, 144.0, 384.0, 336.0], [0.0, 0.0, 320.0, 240.0]]))
    torch.testing.assert_close(results[1]["boxes"], torch.tensor([[0.0, 80.0, 10.0, 100.0], [0.0, 0.0, 50.0, 100.0]]))
    assert results[0]["labels"].tolist() == [2, 1] and results[1]["labels"].tolist() == [0, 0]
    torch.testing.assert_close(results[0]["scores"], logits[0].softmax(-1)[[0, 1], [2, 1]])


def test_round_trip_with_target_normalisation() -> None:
    # A box given in pixels of a resized image comes back in pixels of the original image.
    resized = {"boxes": torch.tensor([[40.0, 30.0, 200.0, 150.0]]), "labels": torch.tensor([7]), "size": torch.tensor([300, 400])}
    normalised = normalize_targets([resized])[0]["boxes"]
    logits = torch.zeros(1, 1, 9)
    logits[0, 0, 7] = 5.0
    (result,) = postprocess_detections({"pred_logits": logits, "pred_boxes": normalised[None]}, torch.tensor([[600, 800]]))
    torch.testing.assert_close(result["boxes"], torch.tensor([[80.0, 60.0, 400.0, 300.0]]))
    assert result["labels"].tolist() == [7]


def test_bad_sizes_are_named() -> None:
    outputs = {"pred_logits": torch.zeros(2, 3, 5), "pred_boxes": torch.rand(2, 3, 4)}
    with pytest.raises(ValueError, match="postprocess.py: orig_sizes must be"):
        postprocess_detections(outputs, torch.tensor([480, 640]))
