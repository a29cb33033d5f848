"""Mask2Former's three inferences (Cheng et al., 2022, sec. 4 and the official ``MaskFormer.forward``), on
one image's class logits ``[Q,C+1]`` and mask logits ``[Q,H,W]`` already at the output size."""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F


def resize_masks(masks: torch.Tensor, size: tuple[int, int], orig_size: tuple[int, int]) -> torch.Tensor:
    """Mask logits ``[Q,h,w]`` (or ``[B,Q,h,w]``) at stride 4 of the padded input -> ``[Q,H0,W0]``: upsampled bilinearly to
    the padded input, cropped to the unpadded image ``size`` and resized bilinearly to ``orig_size``."""
    height, width = size
    padded = (4 * masks.shape[-2], 4 * masks.shape[-1])
    if height > padded[0] or width > padded[1]:
        raise ValueError(f"{__name__}: size {list(size)} exceeds the padded input {list(padded)} that the stride-4 masks cover")
    batched = masks.dim() == 4  # [B,Q,h,w]: every image of one size (the exported models')
    masks = F.interpolate(masks if batched else masks[None], size=padded, mode="bilinear", align_corners=False)[:, :, :height, :width]
    masks = F.interpolate(masks, size=tuple(orig_size), mode="bilinear", align_corners=False)
    return masks if batched else masks[0]


def semantic_inference(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Per-class scores ``[C,H,W]``: each query's mask probability weighted by its class probabilities
    (the no-object class dropped), summed over queries; batched: ``[B,Q,C+1]``, ``[B,Q,H,W]`` -> ``[B,C,H,W]``."""
    return torch.einsum("...qc,...qhw->...chw", logits.softmax(-1)[..., :-1], masks.sigmoid())


def panoptic_inference(
    logits: torch.Tensor,
    masks: torch.Tensor,
    is_thing: Mapping[int, bool],
    object_mask_threshold: float = 0.8,
    overlap_threshold: float = 0.8,
) -> dict:
    """A segment map from the queries whose best class is real with probability above ``object_mask_threshold``.

    Each pixel goes to the kept query with the highest score times mask probability; a query's
    segment is its pixels whose own mask probability is at least 0.5, kept when it holds at least
    ``overlap_threshold`` of the query's own mask (probability >= 0.5). The queries of one stuff
    class form one segment. Returns ``{"segment_ids": int64 [H,W] (0: void), "segments_info":
    [{"id", "category_id", "isthing", "area", "score"}]}``, the format of ``postprocess_panoptic``.
    """
    scores, classes = logits.softmax(-1).max(-1)
    keep = (classes != logits.shape[-1] - 1) & (scores > object_mask_threshold)
    scores, classes, probs = scores[keep], classes[keep].tolist(), masks[keep].sigmoid()
    segment_ids = torch.zeros(masks.shape[-2:], dtype=torch.int64, device=masks.device)
    segments_info: list[dict] = []
    if not classes:
        return {"segment_ids": segment_ids, "segments_info": segments_info}
    owner = (scores[:, None, None] * probs).argmax(0)
    stuff_segment: dict[int, dict] = {}
    for k, category in enumerate(classes):
        own = probs[k] >= 0.5
        won = owner == k
        segment = won & own
        area, original_area = int(won.sum()), int(own.sum())
        if area == 0 or original_area == 0 or not segment.any() or area / original_area < overlap_threshold:
            continue
        thing = bool(is_thing[category])
        if not thing and category in stuff_segment:
            info = stuff_segment[category]
        else:
            info = {"id": len(segments_info) + 1, "category_id": category, "isthing": thing, "area": 0, "score": float(scores[k])}
            segments_info.append(info)
            if not thing:
                stuff_segment[category] = info
        segment_ids[segment] = info["id"]
    for info in segments_info:
        info["area"] = int((segment_ids == info["id"]).sum())
    return {"segment_ids": segment_ids, "segments_info": segments_info}


def instance_inference(logits: torch.Tensor, masks: torch.Tensor, topk: int = 100,
                       thing_classes: set[int] | None = None) -> dict[str, torch.Tensor]:
    """The ``topk`` best (query, class) pairs of the class probabilities (no-object dropped), then, with
    ``thing_classes`` (panoptic models), only the pairs of those classes. Score: the class probability
    times the mean mask probability over the mask's foreground (logit > 0). Returns ``{"scores" [N],
    "labels" [N] int64, "masks" bool [N,H,W]}``, best first."""
    scores, labels, foreground = instance_candidates(logits[None], masks[None], topk)
    scores, labels, foreground = scores[0], labels[0], foreground[0]
    if thing_classes is not None:
        keep = torch.tensor([label in thing_classes for label in labels.tolist()], dtype=torch.bool, device=labels.device)
        scores, labels, foreground = scores[keep], labels[keep], foreground[keep]
    order = scores.argsort(descending=True)
    return {"scores": scores[order], "labels": labels[order], "masks": foreground[order]}


def instance_candidates(logits: torch.Tensor, masks: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``topk`` best (query, class) pairs of each image's class probabilities (``logits [B,Q,C+1]``, mask
    logits ``[B,Q,H,W]``), in that ranking: ``scores [B,K]`` (class probability times the mean mask probability
    over the foreground), ``labels [B,K]`` and the foregrounds ``bool [B,K,H,W]``."""
    probs = logits.softmax(-1)[..., :-1]
    num_classes = probs.shape[-1]
    class_scores, index = probs.flatten(1).topk(min(topk, probs.shape[1] * num_classes), dim=1)
    query, labels = torch.div(index, num_classes, rounding_mode="floor"), index % num_classes
    mask_logits = torch.gather(masks, 1, query[..., None, None].expand(-1, -1, *masks.shape[-2:]))
    foreground = mask_logits > 0
    mask_scores = (mask_logits.sigmoid() * foreground).flatten(2).sum(2) / (foreground.flatten(2).sum(2) + 1e-6)
    return class_scores * mask_scores, labels, foreground
