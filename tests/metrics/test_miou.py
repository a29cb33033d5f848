"""MeanIoU against a confusion matrix built with numpy, on real ADE20K labels, and across 2 processes."""

from __future__ import annotations

import json
import math
import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vision_tx.data.ade20k import ADE20K_CLASSES, ADE20KDataset
from vision_tx.metrics.miou import MeanIoU

NUM_CLASSES = 6


def confusion_scores(preds: np.ndarray, target: np.ndarray, num_classes: int, ignore_index: int = 255) -> dict:
    """mIoU, mAcc, aAcc and per-class IoU from a confusion matrix (rows: ground truth, columns: prediction)."""
    valid = target != ignore_index
    matrix = np.bincount(target[valid] * num_classes + preds[valid], minlength=num_classes**2).reshape(
        num_classes, num_classes
    )
    tp = np.diag(matrix).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = tp / (matrix.sum(0) + matrix.sum(1) - tp)
        acc = tp / matrix.sum(1)
    return {"mIoU": np.nanmean(iou), "mAcc": np.nanmean(acc), "aAcc": tp.sum() / matrix.sum(), "IoU": iou}


def random_batch(seed: int, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Predictions and labels where class 5 never occurs, class 4 is only predicted, and some pixels are ignored."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 4, (n, 20, 30), generator=g)
    target[torch.rand(target.shape, generator=g) < 0.2] = 255
    preds = torch.where(
        torch.rand(target.shape, generator=g) < 0.6, target.clamp(max=3), torch.randint(0, 5, target.shape, generator=g)
    )
    return preds, target


def test_matches_confusion_matrix_on_random_predictions() -> None:
    metric = MeanIoU(NUM_CLASSES)
    preds, target = random_batch(0)
    for p, t in zip(preds, target):  # image by image: sums over the dataset, not means of means
        metric.update(p, t)
    result = metric.compute()
    expected = confusion_scores(preds.numpy(), target.numpy(), NUM_CLASSES)
    assert math.isnan(result["IoU"][5]) and not math.isnan(result["IoU"][4])  # absent: NaN; predicted only: 0
    assert result["IoU"][4] == 0
    np.testing.assert_allclose(result["IoU"].numpy(), expected["IoU"], rtol=1e-12)
    for key in ("mIoU", "mAcc", "aAcc"):
        assert result[key] == pytest.approx(expected[key], rel=1e-12)


def _ade_labels(shared_data) -> list[torch.Tensor]:
    dataset = ADE20KDataset(shared_data / "ade20k_sample", "validation")
    return [torch.from_numpy(dataset.read_label(i).astype(np.int64)) for i in range(len(dataset))]


def test_ground_truth_against_itself_is_perfect(shared_data) -> None:
    metric = MeanIoU(len(ADE20K_CLASSES), class_names=ADE20K_CLASSES)
    labels = _ade_labels(shared_data)
    for label in labels:
        metric.update(label.clamp(max=149), label)  # predictions at ignored pixels do not count
    summary = metric.summary()
    assert summary["mIoU"] == summary["mAcc"] == summary["aAcc"] == 1.0
    present = {ADE20K_CLASSES[c] for label in labels for c in label.unique().tolist() if c != 255}
    assert {row["name"] for row in summary["per_category"] if row["IoU"] is not None} == present
    json.dumps(summary, allow_nan=False)  # absent classes are null, not NaN
    table = metric.table().splitlines()
    listed = {line.split("  ")[0].strip() for line in table[1:-2]}
    assert listed == present  # the rows are the present classes, then the means and the count of the others
    assert (
        table[-1]
        == f"({150 - len(present)} of 150 classes are in neither the ground truth nor the predictions: not listed)"
    )


def test_known_change_gives_hand_computed_iou(shared_data) -> None:
    label = _ade_labels(shared_data)[0]
    valid = label != 255
    classes, counts = label[valid].unique(return_counts=True)
    a, b = classes[counts.argsort(descending=True)[:2]].tolist()  # the two largest classes
    n_a, n_b = int((label == a).sum()), int((label == b).sum())
    pred = label.clone()
    changed = (label == a).nonzero()[: n_a // 4]  # a quarter of class a predicted as class b
    pred[changed[:, 0], changed[:, 1]] = b
    n = len(changed)
    metric = MeanIoU(150)
    metric.update(pred.clamp(max=149), label)
    result = metric.compute()
    # IoU(a) = (n_a - n) / n_a; IoU(b) = n_b / (n_b + n); every other present class stays 1.
    assert result["IoU"][a] == pytest.approx((n_a - n) / n_a)
    assert result["IoU"][b] == pytest.approx(n_b / (n_b + n))
    others = len(classes) - 2
    assert result["mIoU"] == pytest.approx((others + (n_a - n) / n_a + n_b / (n_b + n)) / len(classes))
    assert result["aAcc"] == pytest.approx(1 - n / int(valid.sum()))


def test_rejects_bad_inputs() -> None:
    metric = MeanIoU(3)
    with pytest.raises(ValueError, match="differ in shape"):
        metric.update(torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="target holds labels outside 0..2"):
        metric.update(torch.zeros(2, 2, dtype=torch.long), torch.full((2, 2), 3))
    with pytest.raises(ValueError, match="class names"):
        MeanIoU(3, class_names=("a", "b"))


def _ddp_worker(rank: int, world: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        preds, target = random_batch(0)
        metric = MeanIoU(NUM_CLASSES)
        metric.update(preds[rank::world], target[rank::world])  # each rank half the data
        result = metric.compute()  # torchmetrics sums the states over the processes
        if rank == 0:
            queue.put({k: (v.tolist() if torch.is_tensor(v) else v) for k, v in result.items()})
    finally:
        dist.destroy_process_group()


def test_identical_with_two_processes() -> None:
    preds, target = random_batch(0)
    single = MeanIoU(NUM_CLASSES)
    single.update(preds, target)
    expected = single.compute()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(_ddp_worker, args=(2, port, queue), nprocs=2, start_method="spawn", join=True)
    result = queue.get()
    for key in ("mIoU", "mAcc", "aAcc"):
        assert result[key] == expected[key]
    np.testing.assert_array_equal(np.array(result["IoU"]), expected["IoU"].numpy())
