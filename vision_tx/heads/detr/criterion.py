"""DETR's set loss: Hungarian matching, then class and box losses on matched pairs, per decoder layer,
and mask losses on the last layer's matched pairs when the model predicts masks."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchvision.ops import box_convert, sigmoid_focal_loss

from vision_tx.heads.detr.giou import paired_giou_loss
from vision_tx.heads.detr.matcher import HungarianMatcher


def normalize_targets(targets: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Turns data-pipeline ``targets`` (absolute xyxy ``boxes [K,4]``, ``size`` = (h, w) of the unpadded
    image) into the model's: ``labels`` int64 ``[K]`` and ``boxes [K,4]`` cxcywh normalised to [0, 1].
    Panoptic ``masks`` (bool ``[K,h,w]``, unpadded) pass unchanged; :class:`SetCriterion` pads them.
    Targets without ``size`` are the model's already and pass unchanged."""
    model_targets = []
    for target in targets:
        if "size" not in target:
            model_targets.append(target)
            continue
        scale = target["size"].flip(-1).repeat(2).to(target["boxes"].dtype)  # (w, h, w, h), on the device: no sync
        boxes = box_convert(target["boxes"], "xyxy", "cxcywh") / scale
        model_target = {"labels": target["labels"], "boxes": boxes}
        if "masks" in target:
            model_target["masks"] = target["masks"]
        model_targets.append(model_target)
    return model_targets


def num_boxes_in_batch(targets: list[dict[str, torch.Tensor]], device: torch.device) -> torch.Tensor:
    """The number of target boxes (``labels``) of ``targets`` per process of the whole (distributed) batch, at least 1:
    the loss normaliser, a float scalar tensor on ``device``."""
    num_boxes = torch.tensor(float(sum(len(t["labels"]) for t in targets)), device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(num_boxes)
        num_boxes = num_boxes / dist.get_world_size()
    return num_boxes.clamp(min=1)


def box_losses(
    boxes: torch.Tensor, target_boxes: torch.Tensor, num_boxes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """L1 and GIoU losses of matched pairs ``boxes [..., M, 4]`` / ``target_boxes`` (cxcywh), summed
    over the pairs (the last two dims) and divided by ``num_boxes``: two tensors of shape ``[...]``."""
    target_boxes = target_boxes.to(boxes.dtype)
    loss_bbox = F.l1_loss(boxes, target_boxes, reduction="none").sum((-2, -1)) / num_boxes
    loss_giou = (
        paired_giou_loss(box_convert(boxes, "cxcywh", "xyxy"), box_convert(target_boxes, "cxcywh", "xyxy")).sum(-1)
        / num_boxes
    )
    return loss_bbox, loss_giou


class SetCriterion(nn.Module):
    """Loss of DETR outputs against targets, on the last decoder layer and on every auxiliary one.

    ``forward(outputs, targets)`` takes the model's ``{"pred_logits" [B,Q,C+1], "pred_boxes" [B,Q,4],
    "aux_outputs": [...]}`` and per image ``{"labels" [K], "boxes" [K,4] normalised cxcywh}``; it
    returns ``loss_ce``, ``loss_bbox``, ``loss_giou`` (and ``loss_ce_i`` ... for auxiliary layer ``i``,
    with their weighted sum ``loss_aux``), the weighted total ``loss``, and, without gradient, ``class_error`` (%) and
    ``cardinality_error`` of the last layer. Box losses are averaged over the number of target
    boxes of the whole (distributed) batch.

    With ``"pred_masks" [B,Q,h,w]`` (logits, last layer) in ``outputs`` and ``"masks"`` (bool
    ``[K,H_b,W_b]``, top-left aligned in the padded image) in every target, ``loss_mask`` (sigmoid
    focal loss, alpha 0.25, gamma 2, averaged over pixels) and ``loss_dice`` of the matched pairs
    are added, normalised like the box losses. As in DETR, the target masks are zero-padded to the
    batch's largest mask size and the predictions bilinearly resized to it, so masks should be given
    at the padded image size when the batch is padded beyond its largest image.
    """

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher | None = None,
        weight_ce: float = 1.0,
        weight_bbox: float = 5.0,
        weight_giou: float = 2.0,
        eos_coef: float = 0.1,
        weight_mask: float = 1.0,
        weight_dice: float = 1.0,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.matcher = HungarianMatcher() if matcher is None else matcher
        self.weights = {
            "loss_ce": weight_ce,
            "loss_bbox": weight_bbox,
            "loss_giou": weight_giou,
            "loss_mask": weight_mask,
            "loss_dice": weight_dice,
        }
        class_weight = torch.ones(num_classes + 1)
        class_weight[-1] = eos_coef
        self.register_buffer("class_weight", class_weight, persistent=False)

    def forward(self, outputs: dict, targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        # All decoder layers are stacked into one batch of L*B images, matched and scored at once.
        layers = [*outputs.get("aux_outputs", []), outputs]
        num_layers, (batch, _, num_channels) = len(layers), outputs["pred_logits"].shape
        if num_channels != self.num_classes + 1:
            raise ValueError(
                f"{__name__}: logits have {num_channels} classes, expected num_classes + 1 = {self.num_classes + 1}"
            )
        logits = torch.cat([layer["pred_logits"] for layer in layers])
        boxes = torch.cat([layer["pred_boxes"] for layer in layers])
        indices = self.matcher(logits, boxes, targets * num_layers)

        image_index = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(indices)]).to(logits.device)
        query_index = torch.cat([q for q, _ in indices]).to(logits.device)
        matched_labels = torch.cat([t["labels"][k] for t, (_, k) in zip(targets * num_layers, indices)])
        matched_target_boxes = torch.cat([t["boxes"][k] for t, (_, k) in zip(targets * num_layers, indices)])

        target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
        target_classes[image_index, query_index] = matched_labels
        nll = F.cross_entropy(logits.transpose(1, 2), target_classes, reduction="none")  # [L*B, Q]
        weight = self.class_weight[target_classes]
        loss_ce = (nll * weight).view(num_layers, -1).sum(1) / weight.view(num_layers, -1).sum(1)

        # Every layer matches the same number of pairs, so matched pairs reshape to [L, M].
        matched_boxes = boxes[image_index, query_index].view(num_layers, -1, 4)
        matched_target_boxes = matched_target_boxes.view(num_layers, -1, 4)
        num_boxes = num_boxes_in_batch(targets, logits.device)
        loss_bbox, loss_giou = box_losses(matched_boxes, matched_target_boxes, num_boxes)

        losses = {}
        for layer in range(num_layers):
            suffix = "" if layer == num_layers - 1 else f"_{layer}"
            losses[f"loss_ce{suffix}"] = loss_ce[layer]
            losses[f"loss_bbox{suffix}"] = loss_bbox[layer]
            losses[f"loss_giou{suffix}"] = loss_giou[layer]
        weighted = (
            self.weights["loss_ce"] * loss_ce
            + self.weights["loss_bbox"] * loss_bbox
            + self.weights["loss_giou"] * loss_giou
        )
        losses["loss"] = weighted.sum()
        if num_layers > 1:
            losses["loss_aux"] = weighted[:-1].sum()
        if "pred_masks" in outputs and all("masks" in t for t in targets):
            mask_losses = self._mask_losses(outputs["pred_masks"], targets, indices[-batch:], num_boxes)
            losses.update(mask_losses)
            losses["loss"] = losses["loss"] + sum(self.weights[k] * v for k, v in mask_losses.items())
        losses.update(self._errors(outputs["pred_logits"], target_classes[-batch:], targets))
        return losses

    @staticmethod
    def _mask_losses(
        pred_masks: torch.Tensor,
        targets: list[dict[str, torch.Tensor]],
        indices: list[tuple[torch.Tensor, torch.Tensor]],
        num_boxes: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """Focal and dice losses of the matched ``pred_masks [B,Q,h,w]`` against the targets' ``masks``."""
        height = max(t["masks"].shape[-2] for t in targets)
        width = max(t["masks"].shape[-1] for t in targets)
        predicted = torch.cat([masks[q.to(masks.device)] for masks, (q, _) in zip(pred_masks, indices)])
        if len(predicted) == 0:
            zero = pred_masks.sum() * 0
            return {"loss_mask": zero, "loss_dice": zero}
        expected = torch.cat(
            [
                F.pad(
                    t["masks"][k].to(predicted.dtype),
                    (0, width - t["masks"].shape[-1], 0, height - t["masks"].shape[-2]),
                )
                for t, (_, k) in zip(targets, indices)
            ]
        ).flatten(1)
        predicted = F.interpolate(
            predicted[:, None], size=(height, width), mode="bilinear", align_corners=False
        ).flatten(1)
        focal = sigmoid_focal_loss(predicted, expected, alpha=0.25, gamma=2.0, reduction="none").mean(1)
        prob = predicted.sigmoid()
        dice = 1 - (2 * (prob * expected).sum(1) + 1) / (prob.sum(1) + expected.sum(1) + 1)
        return {"loss_mask": focal.sum() / num_boxes, "loss_dice": dice.sum() / num_boxes}

    @torch.no_grad()
    def _errors(
        self, logits: torch.Tensor, target_classes: torch.Tensor, targets: list[dict[str, torch.Tensor]]
    ) -> dict[str, torch.Tensor]:
        matched = target_classes != self.num_classes
        if matched.any():
            accuracy = (logits.argmax(-1)[matched] == target_classes[matched]).float().mean() * 100
        else:
            accuracy = logits.new_tensor(100.0)
        predicted = (logits.argmax(-1) != self.num_classes).sum(1).float()
        expected = torch.tensor([float(len(t["labels"])) for t in targets], device=logits.device)
        return {"class_error": 100 - accuracy, "cardinality_error": F.l1_loss(predicted, expected)}
