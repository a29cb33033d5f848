"""RT-DETR's criterion: DEIM's matchability-aware loss against transformers' DEIMv2 loss; the batched
matching against scipy's."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.conftest import require_reference
from vision_tx.heads.detr import HungarianMatcher
from vision_tx.heads.rtdetr.criterion import RTDETRCriterion

transformers = require_reference("transformers")
_deim_loss = require_reference("transformers.loss.loss_deimv2")

BATCH, QUERIES, CLASSES = 3, 12, 5


def matched_layer() -> tuple[
    torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]
]:
    """Random logits ``[B,Q,C]`` and cxcywh boxes ``[B,Q,4]``, targets of 0-4 boxes per image (one image empty)
    and a matching of every target to a distinct query, boxes near their targets (IoU spread over 0-1)."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(BATCH, QUERIES, CLASSES, generator=generator) * 2
    boxes = torch.rand(BATCH, QUERIES, 4, generator=generator) * 0.4 + 0.2
    targets, indices = [], []
    for count in (4, 0, 3):
        target_boxes = torch.rand(count, 4, generator=generator) * 0.4 + 0.2
        labels = torch.randint(0, CLASSES, (count,), generator=generator)
        queries = torch.randperm(QUERIES, generator=generator)[:count]
        targets.append({"labels": labels, "boxes": target_boxes})
        indices.append((queries, torch.arange(count)))
    for b, (queries, k) in enumerate(indices):  # some predictions close to their targets, some far
        boxes[b, queries] = targets[b]["boxes"][k] + torch.randn(len(k), 4, generator=generator) * 0.05
    return logits, boxes.clamp(0.05, 0.95), targets, indices


def ours(
    criterion: RTDETRCriterion, logits: torch.Tensor, boxes: torch.Tensor, targets: list[dict], indices: list
) -> torch.Tensor:
    """The criterion's classification term of one layer, summed and divided by the number of targets."""
    image = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(indices)])
    query = torch.cat([q for q, _ in indices])
    labels = torch.cat([t["labels"][k] for t, (_, k) in zip(targets, indices)])
    target_boxes = torch.cat([t["boxes"][k] for t, (_, k) in zip(targets, indices)])
    onehot = torch.zeros_like(logits)
    onehot[image, query, labels] = 1.0
    loss = criterion.classification_loss(
        logits, onehot, (image, query, labels), boxes[image, query][None], target_boxes[None]
    )
    return loss.sum() / len(labels)


@pytest.mark.parametrize("mal_alpha", [None, 0.75])
def test_matchability_aware_loss_is_deims(mal_alpha: float | None) -> None:
    logits, boxes, targets, indices = matched_layer()
    config = transformers.Deimv2Config(num_labels=CLASSES, focal_loss_gamma=1.5, mal_alpha=mal_alpha)
    reference = _deim_loss.Deimv2Loss(config)
    theirs = reference.loss_labels_mal(
        {"logits": logits, "pred_boxes": boxes},
        [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets],
        indices,
        num_boxes=sum(len(t["labels"]) for t in targets),
    )["loss_mal"]
    criterion = RTDETRCriterion(CLASSES, class_loss="mal", mal_alpha=mal_alpha, mal_gamma=1.5)
    torch.testing.assert_close(ours(criterion, logits, boxes, targets, indices), theirs, rtol=1e-6, atol=1e-7)
    varifocal = ours(RTDETRCriterion(CLASSES), logits, boxes, targets, indices)
    assert not torch.allclose(varifocal, theirs, rtol=1e-2)  # the two losses differ on these inputs


def test_matchability_aware_loss_is_logged_and_weighted_as_the_class_term() -> None:
    logits, boxes, targets, indices = matched_layer()
    outputs = {"pred_logits": logits, "pred_boxes": boxes}
    criterion = RTDETRCriterion(CLASSES, class_loss="mal", weight_vfl=3.0)
    losses = criterion(outputs, targets)
    assert "loss_mal" in losses and "loss_vfl" not in losses
    weighted = 3.0 * losses["loss_mal"] + 5.0 * losses["loss_bbox"] + 2.0 * losses["loss_giou"]
    assert losses["loss"].item() == pytest.approx(
        weighted.item(), rel=1e-6
    )  # floats: pytest 9.2's approx refuses 0-d tensors
    with pytest.raises(ValueError, match="class_loss must be one of"):
        RTDETRCriterion(CLASSES, class_loss="focal")


def criterion_outputs(requires_grad: bool) -> dict:
    """Three decoder layers and the class-aware encoder proposals, random, for a batch of 3 images."""
    generator = torch.Generator().manual_seed(2)

    def layer() -> dict[str, torch.Tensor]:
        logits = torch.randn(BATCH, QUERIES, CLASSES, generator=generator).requires_grad_(requires_grad)
        boxes = (torch.rand(BATCH, QUERIES, 4, generator=generator) * 0.4 + 0.3).requires_grad_(requires_grad)
        return {"pred_logits": logits, "pred_boxes": boxes}

    return {**layer(), "aux_outputs": [layer(), layer()], "enc_outputs": layer()}


def criterion_targets() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [
        {"labels": torch.randint(0, CLASSES, (k,), generator=generator), "boxes": torch.rand(k, 4, generator=generator)}
        for k in (2, 0, QUERIES)
    ]


def test_batched_matching_gives_scipys_losses_and_gradients_and_reads_nothing_back() -> None:
    results = []
    for solver in ("scipy", "batched"):
        outputs = criterion_outputs(requires_grad=True)
        criterion = RTDETRCriterion(CLASSES, HungarianMatcher(2.0, 5.0, 2.0, focal_alpha=0.25, solver=solver))
        losses = criterion(outputs, criterion_targets())
        losses["loss"].backward()
        layers = [*outputs["aux_outputs"], outputs, outputs["enc_outputs"]]
        results.append((losses, [layer[key].grad for layer in layers for key in ("pred_logits", "pred_boxes")]))
    (scipy, scipy_grads), (batched, batched_grads) = results
    assert scipy.keys() == batched.keys()
    for name in scipy:
        torch.testing.assert_close(batched[name], scipy[name])
    for mine, reference in zip(batched_grads, scipy_grads):
        torch.testing.assert_close(mine, reference)
    with FakeTensorMode():  # shapes only: a read of any value back to the host raises
        losses = RTDETRCriterion(CLASSES, HungarianMatcher(2.0, 5.0, 2.0, focal_alpha=0.25, solver="batched"))(
            criterion_outputs(requires_grad=False), criterion_targets()
        )
        assert losses["loss"].shape == ()
