"""Mask2Former's three inferences (Cheng et al., 2022, sec. 4 and the official ``MaskFormer.forward``), on
one image's class logits ``[Q,C+1]`` and mask logits ``[Q,H,W]`` already at the output size."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from vision_tx.heads.detr.postprocess import number_segments, per_segment, segments, thing_table


def resize_masks(masks: torch.Tensor, size: tuple[int, int], orig_size: tuple[int, int]) -> torch.Tensor:
    """Mask logits ``masks [Q,h,w]`` (or ``[B,Q,h,w]``) at stride 4 of the padded input -> ``[Q,H0,W0]`` (or
    ``[B,Q,H0,W0]``): upsampled bilinearly to
    the padded input, cropped to the unpadded image ``size`` and resized bilinearly to ``orig_size``."""
    height, width = size
    padded = (4 * masks.shape[-2], 4 * masks.shape[-1])
    if height > padded[0] or width > padded[1]:
        raise ValueError(
            f"{__name__}: size {list(size)} exceeds the padded input {list(padded)} that the stride-4 masks cover"
        )
    batched = masks.dim() == 4  # [B,Q,h,w]: every image of one size (the exported models')
    masks = F.interpolate(masks if batched else masks[None], size=padded, mode="bilinear", align_corners=False)[
        :, :, :height, :width
    ]
    masks = F.interpolate(masks, size=tuple(orig_size), mode="bilinear", align_corners=False)
    return masks if batched else masks[0]


def semantic_inference(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Per-class scores ``[C,H,W]`` of one image's ``logits [Q,C+1]`` and mask logits ``masks [Q,H,W]``: each query's
    mask probability weighted by its class probabilities (the no-object class dropped), summed over queries; batched:
    ``[B,Q,C+1]``, ``[B,Q,H,W]`` -> ``[B,C,H,W]``."""
    return torch.einsum("...qc,...qhw->...chw", logits.softmax(-1)[..., :-1], masks.sigmoid())


def panoptic_inference(
    logits: torch.Tensor,
    masks: torch.Tensor,
    is_thing: Mapping[int, bool],
    object_mask_threshold: float = 0.8,
    overlap_threshold: float = 0.8,
) -> dict:
    """One image's segment map (:func:`panoptic_segments` of ``logits [Q,C+1]`` and ``masks [Q,H,W]``, its
    ``object_mask_threshold`` and ``overlap_threshold``); ``is_thing``: category id -> thing.

    Returns ``{"segment_ids": int64 [H,W] (0: void), "segments_info": [{"id", "category_id", "isthing", "area",
    "score"}]}``, the format of ``postprocess_panoptic``.
    """
    thing, _ = thing_table(is_thing, logits.shape[-1] - 1)
    segment_ids, labels, scores = panoptic_segments(
        logits[None], masks[None], thing, object_mask_threshold, overlap_threshold
    )
    return segments(segment_ids[0], labels[0], scores[0], is_thing)


def panoptic_segments(
    logits: torch.Tensor,
    masks: torch.Tensor,
    thing: torch.Tensor,
    object_mask_threshold: float = 0.8,
    overlap_threshold: float = 0.8,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask2Former's panoptic inference as batch tensors (eager and exported alike, no loop over queries).

    ``logits [B,Q,C+1]``, mask logits ``masks [B,Q,H,W]`` at the output size; ``thing``: bool by class (see
    ``heads.detr.postprocess.thing_table``). Queries whose best class is real and above ``object_mask_threshold``
    compete for each pixel (score times mask probability); a query's segment is its won pixels of probability
    >= 0.5, kept when it holds at least ``overlap_threshold`` of the query's own mask (probability >= 0.5); the
    queries of one stuff class share the segment of the first. Returns ``segment_ids [B,H,W]`` (0: void, segments
    1..S) and per segment ``labels [B,Q]`` (-1 past S) and ``scores [B,Q]`` (its first query's probability)."""
    queries = logits.shape[1]
    scores, classes = logits.softmax(-1).max(-1)  # [B,Q]
    keep = (classes != logits.shape[-1] - 1) & (scores > object_mask_threshold)
    probs = masks.sigmoid()  # [B,Q,H,W]
    owner = torch.where(keep[..., None, None], scores[..., None, None] * probs, float("-inf")).argmax(1)  # [B,H,W]
    won = owner[:, None] == torch.arange(queries, device=owner.device)[None, :, None, None]
    own = probs >= 0.5
    segment = won & own
    area, own_area = won.flatten(2).sum(2), own.flatten(2).sum(2)
    ratio = area.double() / own_area.clamp(min=1).double()
    accepted = keep & (area > 0) & (own_area > 0) & segment.flatten(2).any(2) & (ratio >= overlap_threshold)
    segment_of_query, starts, ids = number_segments(classes, accepted, thing)
    segment_ids = (segment.long() * segment_of_query[..., None, None]).sum(1)
    return segment_ids, per_segment(classes, starts, ids, -1), per_segment(scores, starts, ids, 0.0)


def instance_inference(
    logits: torch.Tensor, masks: torch.Tensor, topk: int = 100, thing_classes: set[int] | None = None
) -> dict[str, torch.Tensor]:
    """One image's ``topk`` best instances (:func:`instance_detections` of ``logits [Q,C+1]`` and ``masks [Q,H,W]``),
    then, with
    ``thing_classes`` (panoptic models), only those of these classes. Returns ``{"scores" [N], "labels" [N] int64,
    "masks" bool [N,H,W]}``, best first."""
    found = {key: value[0] for key, value in instance_detections(logits[None], masks[None], topk).items()}
    if thing_classes is not None:
        keep = [label in thing_classes for label in found["labels"].tolist()]
        keep = torch.tensor(keep, dtype=torch.bool, device=logits.device)
        found = {key: value[keep] for key, value in found.items()}
    return found


def instance_detections(logits: torch.Tensor, masks: torch.Tensor, topk: int) -> dict[str, torch.Tensor]:
    """Mask2Former's instances as batch tensors (eager and exported alike): the ``topk`` best (query, class) pairs of
    the class probabilities (``logits [B,Q,C+1]``, no-object dropped; mask logits ``masks [B,Q,H,W]`` at the output
    size), best first. Score: the class probability times the mean mask probability over the mask's foreground
    (logit > 0). Returns ``{"scores" [B,K], "labels" [B,K] int64, "masks" bool [B,K,H,W]}``."""
    scores, labels, foreground = instance_candidates(logits, masks, topk)
    order = scores.argsort(dim=1, descending=True)
    return {
        "scores": scores.gather(1, order),
        "labels": labels.gather(1, order),
        "masks": foreground.gather(1, order[..., None, None].expand_as(foreground)),
    }


def instance_candidates(
    logits: torch.Tensor, masks: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``topk`` best (query, class) pairs of each image's class probabilities (``logits [B,Q,C+1]``, mask
    logits ``masks [B,Q,H,W]``), in that ranking: ``scores [B,K]`` (class probability times the mean mask probability
    over the foreground), ``labels [B,K]`` and the foregrounds ``bool [B,K,H,W]``."""
    probs = logits.softmax(-1)[..., :-1]
    num_classes = probs.shape[-1]
    class_scores, index = probs.flatten(1).topk(min(topk, probs.shape[1] * num_classes), dim=1)
    query, labels = torch.div(index, num_classes, rounding_mode="floor"), index % num_classes
    mask_logits = torch.gather(masks, 1, query[..., None, None].expand(-1, -1, *masks.shape[-2:]))
    foreground = mask_logits > 0
    mask_scores = (mask_logits.sigmoid() * foreground).flatten(2).sum(2) / (foreground.flatten(2).sum(2) + 1e-6)
    return class_scores * mask_scores, labels, foreground
