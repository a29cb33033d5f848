"""D-FINE's set loss: RT-DETR's (varifocal or matchability-aware classes, L1 and GIoU boxes, per layer) plus
the fine-grained localisation loss (FGL) of every layer's edge distributions and the decoupled distillation
focal loss (DDF) from the last layer's distributions to the earlier layers'."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vision_tx.heads.detr.criterion import box_losses, num_boxes_in_batch
from vision_tx.heads.detr.matcher import HungarianMatcher
from vision_tx.heads.dfine.fdr import edge_targets
from vision_tx.heads.dino.criterion import Indices
from vision_tx.heads.rtdetr.criterion import RTDETRCriterion, paired_box_iou


class DFINECriterion(RTDETRCriterion):
    """Loss of the outputs of :class:`vision_tx.models.DFINE`: RT-DETR's terms (also on ``pre_outputs``, the
    first layer's direct boxes, suffix ``_pre``) and, on every layer with edge distributions (``pred_corners``
    ``[B,Q,4 * (reg_max + 1)]`` around ``ref_points [B,Q,4]``, the first layer's boxes):

    - ``loss_fgl``: each matched edge's cross-entropy to the two bins around its target distance (see
      :func:`~vision_tx.heads.dfine.fdr.edge_targets`), weighted by their shares and by the IoU of the
      query's box with its target, summed and divided by the number of target boxes;
    - ``loss_ddf`` (layers before the last): ``temperature**2 * KL(softmax(last / T) || softmax(layer / T))``
      per edge, weighted by the IoU for matched queries and by the last layer's best class probability for
      the others; the matched and other edges' means are mixed in proportion to the square roots of their counts.

    With ``union_matching`` (the official code's; transformers' port has it off) the box, FGL and DDF terms of
    every layer (and the box terms of the proposals) read the union of all layers' matches (:func:`union_matches`),
    divided by its size; the class terms keep each layer's own matches. The denoising layers' DDF mixes their own
    counts (transformers'; the official code reuses the matching layers').

    D-FINE's weights (Peterande/D-FINE ``configs/dfine/include/dfine_hgnetv2.yml``): VFL 1, L1 5, GIoU 2,
    FGL 0.15, DDF 1.5, VFL alpha 0.75 and gamma 2; the matcher's costs 2, 5, 2.
    """

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher | None = None,
        weight_vfl: float = 1.0,
        weight_bbox: float = 5.0,
        weight_giou: float = 2.0,
        weight_fgl: float = 0.15,
        weight_ddf: float = 1.5,
        reg_max: int = 32,
        temperature: float = 5.0,
        union_matching: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(num_classes, matcher, weight_vfl, weight_bbox, weight_giou, **kwargs)
        self.weights.update(loss_fgl=weight_fgl, loss_ddf=weight_ddf)
        self.reg_max, self.temperature, self.union_matching = reg_max, temperature, union_matching

    def layer_losses(
        self, layers: list[dict], names: list[str], targets: list[dict], indices: Indices, num_boxes: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """``loss_fgl`` of every layer with ``pred_corners``, ``loss_ddf`` of all but the last of them; with
        ``union_matching``, outside denoising, also every layer's ``loss_bbox`` and ``loss_giou`` anew."""
        batch = len(targets)
        refined = [k for k, layer in enumerate(layers) if "pred_corners" in layer]
        losses = {}
        if not refined:
            return losses
        device = layers[0]["pred_boxes"].device
        if self.union_matching and not names[0].startswith("_dn"):
            union = union_matches([indices[k * batch : (k + 1) * batch] for k in range(len(layers))])
            indices, num_boxes = union * len(layers), num_boxes_in_batch([{"labels": q} for q, _ in union], device)
            image, query, target_boxes = matched_pairs(union, targets, device)
            for layer, name in zip(layers, names):
                losses[f"loss_bbox{name}"], losses[f"loss_giou{name}"] = box_losses(
                    layer["pred_boxes"][image, query], target_boxes, num_boxes
                )
        teacher = layers[refined[-1]]
        for k in refined:
            layer = layers[k]
            image, query, target_boxes = matched_pairs(indices[k * batch : (k + 1) * batch], targets, device)
            iou = paired_box_iou(layer["pred_boxes"][image, query].detach(), target_boxes).detach()
            losses[f"loss_fgl{names[k]}"] = self.localisation_loss(layer, image, query, target_boxes, iou) / num_boxes
            if k != refined[-1]:
                losses[f"loss_ddf{names[k]}"] = self.distillation_loss(
                    layer["pred_corners"], teacher, image, query, iou
                )
        return losses

    def localisation_loss(
        self, layer: dict, image: torch.Tensor, query: torch.Tensor, target_boxes: torch.Tensor, iou: torch.Tensor
    ) -> torch.Tensor:
        """The FGL sum over the matched ``(image, query)`` pairs' edges (before the division by the box count)."""
        logits = layer["pred_corners"][image, query].reshape(-1, self.reg_max + 1)
        up, reg_scale = layer["up"], layer["reg_scale"]
        left, share = edge_targets(
            layer["ref_points"][image, query].detach(), target_boxes, self.reg_max, up, reg_scale
        )
        cross_entropy = F.cross_entropy(logits, left, reduction="none") * (1 - share)
        cross_entropy = cross_entropy + F.cross_entropy(logits, left + 1, reduction="none") * share
        return (cross_entropy * iou.repeat_interleave(4)).sum()

    def distillation_loss(
        self, corners: torch.Tensor, teacher: dict, image: torch.Tensor, query: torch.Tensor, iou: torch.Tensor
    ) -> torch.Tensor:
        """The DDF loss of a layer's ``corners [B,Q,4 * (reg_max + 1)]`` against the ``teacher`` layer's."""
        bins = self.reg_max + 1
        weight = teacher["pred_logits"].detach().sigmoid().max(-1).values
        weight = weight.index_put((image, query), iou.to(weight.dtype))
        matched = torch.zeros_like(weight, dtype=torch.bool).index_put(
            (image, query), torch.tensor(True, device=weight.device)
        )
        student = F.log_softmax(corners.reshape(-1, bins) / self.temperature, -1)
        target = F.softmax(teacher["pred_corners"].detach().reshape(-1, bins) / self.temperature, -1)
        loss = (
            F.kl_div(student, target, reduction="none").sum(-1)
            * weight.flatten().repeat_interleave(4)
            * self.temperature**2
        )
        matched = matched.flatten().repeat_interleave(4)
        positive, negative = matched.sum().float().sqrt(), (~matched).sum().float().sqrt()
        mean_positive = loss[matched].mean() if matched.any() else loss.new_zeros(())
        mean_negative = loss[~matched].mean() if (~matched).any() else loss.new_zeros(())
        return (mean_positive * positive + mean_negative * negative) / (positive + negative)


def matched_pairs(
    matches: Indices, targets: list[dict], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per image, the ``matches`` ``(query indices [K], target indices [K])`` and the ``targets`` (``boxes [G,4]``) ->
    the pairs' ``image [M]``, ``query [M]`` and target ``boxes [M,4]`` on ``device``."""
    image = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(matches)]).to(device)
    query = torch.cat([q for q, _ in matches]).to(device)
    return image, query, torch.cat([t["boxes"][j] for t, (_, j) in zip(targets, matches)]).to(device)


def union_matches(layer_indices: list[Indices]) -> Indices:
    """The union of several layers' matches (D-FINE's GO-LSD): per image, every ``(query, target)`` pair any
    layer matched, counted over the layers; each query keeps its most frequent target (ties: the smaller
    target). ``layer_indices``: per layer, per image ``(queries, targets)`` -> per image ``(queries, targets)``."""
    union = []
    for per_image in zip(*layer_indices):
        pairs = torch.cat([torch.stack([q, t], 1) for q, t in per_image]).long()
        unique, counts = torch.unique(pairs, dim=0, return_counts=True)  # sorted by query, then target
        order = torch.sort(counts, descending=True, stable=True).indices
        unique = unique[order]
        first = torch.ones(len(unique), dtype=torch.bool)
        seen: set[int] = set()
        for row, query in enumerate(unique[:, 0].tolist()):
            first[row] = query not in seen
            seen.add(query)
        union.append((unique[first, 0], unique[first, 1]))
    return union
