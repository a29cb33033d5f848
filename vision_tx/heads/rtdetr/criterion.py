"""RT-DETR's set loss: DINO's structure (every decoder layer, the encoder's proposals, the denoising
queries; Hungarian matching with the focal class cost) with the varifocal classification loss, or
DEIM's matchability-aware loss in its place."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.ops import box_convert

from vision_tx.heads.detr.giou import paired_intersection_union
from vision_tx.heads.detr.matcher import HungarianMatcher
from vision_tx.heads.dino.criterion import DINOCriterion

CLASS_LOSSES = ("vfl", "mal")


def paired_box_iou(boxes: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """IoU of each box of ``boxes [..., 4]`` with the box at the same place of ``other`` (both cxcywh) -> ``[...]``."""
    intersection, union = paired_intersection_union(
        box_convert(boxes, "cxcywh", "xyxy"), box_convert(other, "cxcywh", "xyxy")
    )
    return intersection / union


class RTDETRCriterion(DINOCriterion):
    """Loss of the outputs of :class:`vision_tx.models.RTDETR` (the same dict as DINO's) against
    normalised targets: ``loss_vfl`` (varifocal, Zhang et al., VarifocalNet, 2021), ``loss_bbox``
    and ``loss_giou`` per layer, with DINO's suffixes, normaliser and weighted total ``loss``.

    The varifocal loss is the binary cross-entropy of every logit against a soft target: the IoU of
    the query's (detached) box with its target at the target's class, 0 elsewhere; positives are
    weighted by that IoU, negatives by ``vfl_alpha * sigmoid(logit) ** vfl_gamma`` (detached).
    ``class_loss="mal"`` trains with DEIM's matchability-aware loss instead (Huang et al., DEIM: DETR with
    Improved Matching for Fast Convergence, 2025), named ``loss_mal``: the target is ``IoU ** mal_gamma``
    and every positive weighs 1, so a confident match with a loose box is pushed down as hard as a
    tight one is pushed up (the varifocal loss barely trains a positive of low IoU); negatives weigh
    ``mal_alpha * sigmoid(logit) ** mal_gamma`` (``mal_alpha`` None: 1). DEIM's configs: ``mal_gamma`` 1.5.
    The default ``matcher`` is RT-DETR's: focal class cost 2 (``focal_alpha`` 0.25, ``focal_gamma`` 2), L1 5, GIoU 2.
    """

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher | None = None,
        weight_vfl: float = 1.0,
        weight_bbox: float = 5.0,
        weight_giou: float = 2.0,
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
        vfl_alpha: float = 0.75,
        vfl_gamma: float = 2.0,
        class_loss: str = "vfl",
        mal_alpha: float | None = None,
        mal_gamma: float = 1.5,
    ) -> None:
        if class_loss not in CLASS_LOSSES:
            raise ValueError(f"{__name__}: class_loss must be one of {CLASS_LOSSES}, got {class_loss!r}")
        self.class_loss_name = f"loss_{class_loss}"  # the weight below (weight_vfl) is this term's
        super().__init__(num_classes, matcher, weight_vfl, weight_bbox, weight_giou, focal_alpha, focal_gamma)
        self.vfl_alpha, self.vfl_gamma = vfl_alpha, vfl_gamma
        self.mal_alpha, self.mal_gamma = mal_alpha, mal_gamma

    def classification_loss(
        self,
        logits: torch.Tensor,
        onehot: torch.Tensor,
        positives: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        matched: torch.Tensor,
        target_boxes: torch.Tensor,
    ) -> torch.Tensor:
        """The varifocal (or matchability-aware) loss ``[N,Q,C]``."""
        iou = paired_box_iou(matched.detach(), target_boxes).flatten()
        score = torch.zeros_like(logits)
        probability = logits.detach().sigmoid()
        if self.class_loss_name == "loss_mal":
            score[positives] = iou.to(logits.dtype).pow(self.mal_gamma)
            weight = (1.0 if self.mal_alpha is None else self.mal_alpha) * probability.pow(self.mal_gamma) * (
                1 - onehot
            ) + onehot
        else:
            score[positives] = iou.to(logits.dtype)
            weight = self.vfl_alpha * probability.pow(self.vfl_gamma) * (1 - onehot) + score
        return F.binary_cross_entropy_with_logits(logits, score, weight=weight, reduction="none")
