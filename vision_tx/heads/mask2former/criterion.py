"""Mask2Former's set loss (Cheng et al., 2022, sec. 3.3 and 4.1): Hungarian matching on uniformly sampled
points, class cross-entropy with a down-weighted no-object class, and mask sigmoid cross-entropy and
dice on importance-sampled points (PointRend's uncertainty sampling), on every decoder prediction.

Masks are only ever read at sampled points: no loss upsamples a predicted mask, and the matching
compares every query with every target on ``num_points`` points, never on their pixels.
Random points are drawn from the global generator in the official implementation's order (per
layer: the last first, then the auxiliary ones; per layer one draw per image for matching, then
the candidates and the uniform remainder of the importance sampling), so a seed reproduces it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.heads.detr.criterion import num_boxes_in_batch
from vision_tx.heads.detr.matcher import assign


def point_sample(maps: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """Bilinear values of ``maps [N,C,H,W]`` at ``points [N,P,2]`` ((x, y) in [0, 1] of the map, zeros
    outside) -> ``[N,C,P]``."""
    return F.grid_sample(maps, 2 * points[:, :, None] - 1, mode="bilinear", align_corners=False)[..., 0]


def dice_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``1 - (2 |p t| + 1) / (|p| + |t| + 1)`` per row of ``logits``/``labels [M,P]`` -> ``[M]``."""
    prob = logits.sigmoid()
    return 1 - (2 * (prob * labels).sum(-1) + 1) / (prob.sum(-1) + labels.sum(-1) + 1)


class MaskHungarianMatcher(nn.Module):
    """Matches queries to target masks per image by ``cost_class * -p(class) + cost_mask * BCE +
    cost_dice * dice``, the mask terms on ``num_points`` uniformly drawn points shared by the image's
    predictions and targets."""

    def __init__(
        self, cost_class: float = 2.0, cost_mask: float = 5.0, cost_dice: float = 5.0, num_points: int = 12544
    ) -> None:
        super().__init__()
        if cost_class == cost_mask == cost_dice == 0:
            raise ValueError(f"{__name__}: all matching costs are 0")
        self.cost_class, self.cost_mask, self.cost_dice, self.num_points = cost_class, cost_mask, cost_dice, num_points

    @torch.no_grad()
    def forward(
        self, pred_logits: torch.Tensor, pred_masks: torch.Tensor, targets: list[dict[str, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``pred_logits [B,Q,C+1]``, ``pred_masks [B,Q,h,w]`` logits; per image ``labels [K]`` and ``masks`` (bool
        ``[K,H,W]``, covering the same area as the predictions) -> per image ``(query_indices, target_indices)``."""
        indices = []
        for logits, masks, target in zip(pred_logits, pred_masks, targets):
            points = torch.rand(1, self.num_points, 2, dtype=masks.dtype, device=masks.device)
            expected = point_sample(target["masks"][None].to(masks.dtype), points)[0]  # [K,P]
            predicted = point_sample(masks[None], points)[0]  # [Q,P]
            # Pairwise mean BCE: log(1 + e^-x) where the target is 1, log(1 + e^x) where it is 0.
            cost_mask = (
                F.softplus(-predicted) @ expected.T + F.softplus(predicted) @ (1 - expected).T
            ) / self.num_points
            prob = predicted.sigmoid()
            cost_dice = 1 - (2 * prob @ expected.T + 1) / (prob.sum(-1)[:, None] + expected.sum(-1)[None] + 1)
            cost_class = -logits.softmax(-1)[:, target["labels"]]
            indices.append(
                assign(self.cost_class * cost_class + self.cost_mask * cost_mask + self.cost_dice * cost_dice)
            )
        return indices


class Mask2FormerCriterion(nn.Module):
    """Loss of Mask2Former outputs ``{"pred_logits" [B,Q,C+1], "pred_masks" [B,Q,h,w], "aux_outputs": [...]}``
    against per-image targets ``{"labels" int64 [K], "masks" bool [K,H,W]}``.

    Returns ``loss_ce``, ``loss_mask``, ``loss_dice`` of the last prediction (``..._i`` for auxiliary
    prediction ``i``), their weighted sum over every prediction ``loss`` and the auxiliary part
    ``loss_aux``. Mask losses are summed over matched pairs and divided by the number of target
    masks of the whole (distributed) batch. Target masks are zero-padded to the batch's largest,
    top-left aligned: give them at the padded image size when the batch pads beyond its largest image.
    """

    def __init__(
        self,
        num_classes: int,
        matcher: MaskHungarianMatcher | None = None,
        weight_ce: float = 2.0,
        weight_mask: float = 5.0,
        weight_dice: float = 5.0,
        eos_coef: float = 0.1,
        num_points: int = 12544,
        oversample_ratio: float = 3.0,
        importance_sample_ratio: float = 0.75,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.matcher = (
            MaskHungarianMatcher(weight_ce, weight_mask, weight_dice, num_points) if matcher is None else matcher
        )
        self.weights = {"loss_ce": weight_ce, "loss_mask": weight_mask, "loss_dice": weight_dice}
        self.num_points, self.oversample_ratio, self.importance_sample_ratio = (
            num_points,
            oversample_ratio,
            importance_sample_ratio,
        )
        class_weight = torch.ones(num_classes + 1)
        class_weight[-1] = eos_coef
        self.register_buffer("class_weight", class_weight, persistent=False)

    def forward(self, outputs: dict, targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        channels = outputs["pred_logits"].shape[-1]
        if channels != self.num_classes + 1:
            raise ValueError(
                f"{__name__}: logits have {channels} classes, expected num_classes + 1 = {self.num_classes + 1}"
            )
        height = max(t["masks"].shape[-2] for t in targets)
        width = max(t["masks"].shape[-1] for t in targets)
        padded = [
            F.pad(t["masks"], (0, width - t["masks"].shape[-1], 0, height - t["masks"].shape[-2])) for t in targets
        ]
        targets = [{"labels": t["labels"], "masks": m} for t, m in zip(targets, padded)]
        num_masks = num_boxes_in_batch(targets, outputs["pred_logits"].device)
        aux = outputs.get("aux_outputs", [])
        losses, total = {}, 0
        for index, prediction in enumerate([outputs, *aux]):
            suffix = "" if index == 0 else f"_{index - 1}"
            layer = self.layer_losses(prediction["pred_logits"], prediction["pred_masks"], targets, num_masks)
            weighted = sum(self.weights[k] * v for k, v in layer.items())
            losses.update({f"{k}{suffix}": v for k, v in layer.items()})
            total = total + weighted
            if index == 0:
                last = weighted
        losses["loss"] = total
        if aux:
            losses["loss_aux"] = total - last
        return losses

    def layer_losses(
        self, logits: torch.Tensor, masks: torch.Tensor, targets: list[dict[str, torch.Tensor]], num_masks: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """``loss_ce``, ``loss_mask``, ``loss_dice`` of one prediction (targets already padded)."""
        indices = self.matcher(logits, masks, targets)
        image_index = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(indices)]).to(logits.device)
        query_index = torch.cat([q for q, _ in indices]).to(logits.device)
        target_classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
        target_classes[image_index, query_index] = torch.cat([t["labels"][k] for t, (_, k) in zip(targets, indices)])
        loss_ce = F.cross_entropy(logits.transpose(1, 2), target_classes, weight=self.class_weight.to(logits.dtype))
        predicted = masks[image_index, query_index][:, None]  # [M,1,h,w]: the matched masks only
        expected = torch.cat([t["masks"][k.to(t["masks"].device)] for t, (_, k) in zip(targets, indices)])[:, None].to(
            masks.dtype
        )
        if len(predicted) == 0:
            zero = masks.sum() * 0
            return {"loss_ce": loss_ce, "loss_mask": zero, "loss_dice": zero}
        with torch.no_grad():
            points = self.importance_points(predicted)
            labels = point_sample(expected, points)[:, 0]
        point_logits = point_sample(predicted, points)[:, 0]
        loss_mask = F.binary_cross_entropy_with_logits(point_logits, labels, reduction="none").mean(1).sum() / num_masks
        return {
            "loss_ce": loss_ce,
            "loss_mask": loss_mask,
            "loss_dice": dice_loss(point_logits, labels).sum() / num_masks,
        }

    def importance_points(self, masks: torch.Tensor) -> torch.Tensor:
        """``[M,P,2]`` points per mask ``masks [M,1,h,w]``: the ``importance_sample_ratio * P`` most uncertain
        (logit nearest 0) of ``oversample_ratio * P`` uniform candidates, then uniform ones."""
        count = masks.shape[0]
        candidates = torch.rand(
            count, int(self.num_points * self.oversample_ratio), 2, dtype=masks.dtype, device=masks.device
        )
        uncertainty = -point_sample(masks, candidates)[:, 0].abs()
        num_uncertain = int(self.importance_sample_ratio * self.num_points)
        chosen = uncertainty.topk(num_uncertain, dim=1).indices
        points = candidates.gather(1, chosen[..., None].expand(-1, -1, 2))
        uniform = torch.rand(count, self.num_points - num_uncertain, 2, dtype=masks.dtype, device=masks.device)
        return torch.cat([points, uniform], 1)
