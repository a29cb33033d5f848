"""The YOLO side of the main job's training benchmark holds the main job's boxes: Ultralytics' batch layout from the
data pipeline's targets (absolute xyxy in the unpadded image) at values worked out by hand."""

from __future__ import annotations

import torch

from benchmarks.main_job import YOLO_BATCH, YOLO_SIZE, yolo_batches


def test_yolo_batches_hold_the_boxes_in_ultralytics_layout() -> None:
    first = {
        "labels": torch.tensor([2, 0]),
        "boxes": torch.tensor([[10.0, 20.0, 50.0, 40.0], [0.0, 0.0, 100.0, 200.0]]),
    }
    second = {"labels": torch.tensor([1]), "boxes": torch.tensor([[25.0, 50.0, 75.0, 150.0]])}
    for target in (first, second):
        target["size"] = torch.tensor([200, 100])  # (h, w)
    empty = {"labels": torch.zeros(0, dtype=torch.long), "boxes": torch.zeros(0, 4), "size": torch.tensor([64, 64])}
    targets = [first, empty] * (YOLO_BATCH // 2) + [second]  # one batch full, one image in the next
    batches = yolo_batches([{"targets": targets}], "cpu")

    assert [b["img"].shape for b in batches] == [(YOLO_BATCH, 3, YOLO_SIZE, YOLO_SIZE), (1, 3, YOLO_SIZE, YOLO_SIZE)]
    full, last = batches
    assert full["cls"].shape == (YOLO_BATCH, 1) and full["cls"][:2, 0].tolist() == [2.0, 0.0]
    # cxcywh over (w, h) = (100, 200): (30/100, 30/200, 40/100, 20/200) and the whole image
    torch.testing.assert_close(full["bboxes"][:2], torch.tensor([[0.3, 0.15, 0.4, 0.1], [0.5, 0.5, 1.0, 1.0]]))
    # the two boxes of every second image (images 0, 2, 4, ... of the batch): indices into the batch, not the list
    assert full["batch_idx"].tolist() == [float(i) for i in range(0, YOLO_BATCH, 2) for _ in range(2)]
    assert last["cls"][:, 0].tolist() == [1.0] and last["batch_idx"].tolist() == [0.0]
    torch.testing.assert_close(last["bboxes"], torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
