"""Set criterion: target conversion, loss normalisation, images without targets, distributed box count,
mask losses written out by hand.

Numerical parity with transformers' DETR loss (final and auxiliary layers) is in tests/models/test_detr.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from vision_tx.heads.detr import SetCriterion, normalize_targets

NUM_CLASSES = 4


def outputs(batch: int, num_queries: int = 5, aux: int = 2) -> dict:
    def layer() -> dict:
        return {
            "pred_logits": torch.randn(batch, num_queries, NUM_CLASSES + 1, requires_grad=True),
            "pred_boxes": (torch.rand(batch, num_queries, 4) * 0.4 + 0.3).requires_grad_(),
        }

    return {**layer(), "aux_outputs": [layer() for _ in range(aux)]}


def test_normalize_targets_gives_relative_cxcywh() -> None:
    target = {
        "boxes": torch.tensor([[10.0, 20.0, 50.0, 60.0]]),
        "labels": torch.tensor([3]),
        "size": torch.tensor([100, 200]),
    }
    (converted,) = normalize_targets([target])
    torch.testing.assert_close(converted["boxes"], torch.tensor([[0.15, 0.4, 0.2, 0.4]]))
    assert converted["labels"].tolist() == [3]


def test_keys_total_and_gradients() -> None:
    out = outputs(batch=2)
    targets = [
        {"labels": torch.tensor([0, 3]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.3, 0.6, 0.1, 0.1]])},
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.4, 0.4, 0.3, 0.3]])},
    ]
    losses = SetCriterion(NUM_CLASSES)(out, targets)
    names = {f"loss_{kind}{suffix}" for kind in ("ce", "bbox", "giou") for suffix in ("", "_0", "_1")}
    assert names | {"loss", "loss_aux", "class_error", "cardinality_error"} == set(losses)
    weight = {"ce": 1, "bbox": 5, "giou": 2}
    expected = sum(weight[k.split("_")[1]] * losses[k] for k in names)
    torch.testing.assert_close(losses["loss"], expected)
    auxiliary = sum(weight[k.split("_")[1]] * losses[k] for k in names if k[-2:] in ("_0", "_1"))
    torch.testing.assert_close(losses["loss_aux"], auxiliary)
    losses["loss"].backward()
    for layer in [out, *out["aux_outputs"]]:
        assert layer["pred_logits"].grad.abs().sum() > 0 and layer["pred_boxes"].grad.abs().sum() > 0
    assert not losses["class_error"].requires_grad and not losses["cardinality_error"].requires_grad


def test_image_without_targets_learns_no_object_only() -> None:
    out = outputs(batch=1, aux=0)
    empty = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}]
    losses = SetCriterion(NUM_CLASSES)(out, empty)
    no_object = torch.full((1, 5), NUM_CLASSES)
    torch.testing.assert_close(losses["loss_ce"], F.cross_entropy(out["pred_logits"].transpose(1, 2), no_object))
    assert losses["loss_bbox"] == 0 and losses["loss_giou"] == 0
    assert torch.isfinite(losses["loss"])


def test_box_count_is_averaged_over_processes(tmp_path) -> None:
    torch.manual_seed(0)
    out = outputs(batch=1, aux=0)
    targets = [{"labels": torch.tensor([2, 1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.3, 0.6, 0.1, 0.1]])}]
    local = SetCriterion(NUM_CLASSES)(out, targets)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        distributed = SetCriterion(NUM_CLASSES)(out, targets)
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(distributed["loss_bbox"], local["loss_bbox"])
    # Two boxes: the summed L1 over matched pairs is divided by 2.
    matched = SetCriterion(NUM_CLASSES).matcher(out["pred_logits"], out["pred_boxes"], targets)[0]
    l1 = (out["pred_boxes"][0, matched[0]] - targets[0]["boxes"][matched[1]]).abs().sum() / 2
    torch.testing.assert_close(local["loss_bbox"], l1)


def focal_and_dice(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-mask losses written out: focal (alpha 0.25, gamma 2) averaged over pixels, and dice with +1 smoothing."""
    p = logits.sigmoid().flatten(1)
    t = target.float().flatten(1)
    ce = -(t * p.log() + (1 - t) * (1 - p).log())
    p_t = p * t + (1 - p) * (1 - t)
    focal = ((0.25 * t + 0.75 * (1 - t)) * (1 - p_t) ** 2 * ce).mean(1)
    dice = 1 - (2 * (p * t).sum(1) + 1) / (p.sum(1) + t.sum(1) + 1)
    return focal, dice


def test_mask_losses_on_matched_queries_with_padded_targets() -> None:
    out = outputs(batch=2, aux=1)
    out["pred_masks"] = torch.randn(2, 5, 6, 8, requires_grad=True)  # already at the padded target size
    masks_0 = torch.rand(2, 6, 8) > 0.5
    masks_1 = torch.rand(1, 4, 5) > 0.5  # a smaller image: its masks are padded with background
    targets = [
        {
            "labels": torch.tensor([0, 3]),
            "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.3, 0.6, 0.1, 0.1]]),
            "masks": masks_0,
        },
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.4, 0.4, 0.3, 0.3]]), "masks": masks_1},
    ]
    criterion = SetCriterion(NUM_CLASSES, weight_mask=3.0, weight_dice=0.5)
    losses = criterion(out, targets)

    (q0, k0), (q1, k1) = criterion.matcher(out["pred_logits"], out["pred_boxes"], targets)
    padded_1 = torch.zeros(1, 6, 8, dtype=torch.bool)
    padded_1[:, :4, :5] = masks_1
    focal, dice = focal_and_dice(
        torch.cat([out["pred_masks"][0, q0], out["pred_masks"][1, q1]]), torch.cat([masks_0[k0], padded_1[k1]])
    )
    torch.testing.assert_close(losses["loss_mask"], focal.sum() / 3)
    torch.testing.assert_close(losses["loss_dice"], dice.sum() / 3)
    box_losses = sum(
        (1 if "ce" in k else 5 if "bbox" in k else 2) * v
        for k, v in losses.items()
        if k.startswith(("loss_ce", "loss_bbox", "loss_giou"))
    )
    torch.testing.assert_close(losses["loss"], box_losses + 3 * losses["loss_mask"] + 0.5 * losses["loss_dice"])
    losses["loss"].backward()
    assert out["pred_masks"].grad[0, q0].abs().sum() > 0 and out["pred_masks"].grad[1, q1].abs().sum() > 0
    unmatched = torch.ones(2, 5, dtype=torch.bool)
    unmatched[0, q0] = unmatched[1, q1] = False
    assert (out["pred_masks"].grad[unmatched] == 0).all()


def test_masks_pass_normalisation_and_are_needed_for_mask_losses() -> None:
    target = {"boxes": torch.tensor([[1.0, 2.0, 5.0, 6.0]]), "labels": torch.tensor([2]), "size": torch.tensor([8, 10])}
    masks = torch.rand(1, 8, 10) > 0.5
    assert normalize_targets([{**target, "masks": masks}])[0]["masks"] is masks
    out = {**outputs(batch=1, aux=0), "pred_masks": torch.randn(1, 5, 2, 3)}
    assert "loss_mask" not in SetCriterion(NUM_CLASSES)(out, normalize_targets([target]))
    empty = [
        {
            "labels": torch.zeros(0, dtype=torch.int64),
            "boxes": torch.zeros(0, 4),
            "masks": torch.zeros(0, 8, 10, dtype=torch.bool),
        }
    ]
    losses = SetCriterion(NUM_CLASSES)(out, empty)
    assert losses["loss_mask"] == 0 and losses["loss_dice"] == 0
