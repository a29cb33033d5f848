"""DETR outputs -> detections, or panoptic segment maps, in original-image pixels."""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torchvision.ops import batched_nms, box_convert


NMS_CANDIDATES = 300


@torch.no_grad()
def postprocess_detections(outputs: dict, orig_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Scores, category ids and absolute xyxy boxes for every query of every image.

    ``outputs``: ``pred_logits [B,Q,C+1]`` (last class: no-object) and ``pred_boxes [B,Q,4]``
    (cxcywh, normalised to the unpadded image); ``orig_sizes [B,2]`` holds (h, w) of the original
    images. Each query keeps its most probable real class (softmax over all classes, no-object
    excluded from the max), as DETR scores its predictions for COCO evaluation. Returns per image
    ``{"scores" [Q], "labels" [Q] int64, "boxes" [Q,4] xyxy pixels}``.
    """
    logits = outputs["pred_logits"]
    _check_sizes(orig_sizes, len(logits))
    scores, labels = logits.softmax(-1)[..., :-1].max(-1)
    return _detections(scores, labels, outputs["pred_boxes"], orig_sizes)


def _check_sizes(orig_sizes: torch.Tensor, batch: int) -> None:
    if orig_sizes.shape != (batch, 2):
        raise ValueError(
            f"{__name__}: orig_sizes must be [B,2] = [{batch},2] (h, w), got {list(orig_sizes.shape)}"
        )


def pixel_boxes(boxes: torch.Tensor, orig_sizes: torch.Tensor) -> torch.Tensor:
    """Normalised cxcywh ``boxes [B,N,4]`` -> absolute xyxy in images of ``orig_sizes [B,2]`` (h, w)."""
    height, width = orig_sizes.to(boxes).unbind(1)
    scale = torch.stack([width, height, width, height], dim=1)[:, None, :]
    return box_convert(boxes, "cxcywh", "xyxy") * scale


def _detections(scores: torch.Tensor, labels: torch.Tensor, boxes: torch.Tensor, orig_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Per image ``scores``, ``labels`` and ``boxes`` (normalised cxcywh ``[B,N,4]`` -> xyxy pixels of ``orig_sizes``)."""
    boxes = pixel_boxes(boxes, orig_sizes)
    return [{"scores": s, "labels": l, "boxes": b} for s, l, b in zip(scores, labels, boxes)]


def sigmoid_scores(logits: torch.Tensor, share_scores: bool = False) -> torch.Tensor:
    """Each (query, class) pair's score from sigmoid ``logits [B,Q,C]``: its probability ``p``, or with
    ``share_scores`` ``p`` times the class's share of the query's summed probabilities (``p_c * p_c / sum(p)``):
    a query torn between two classes scores both lower, a confident one keeps its score. ``[B,Q,C]``."""
    probabilities = logits.sigmoid()
    if not share_scores:
        return probabilities
    return probabilities * probabilities / probabilities.sum(-1, keepdim=True).clamp(min=torch.finfo(probabilities.dtype).tiny)


def sigmoid_candidates(outputs: dict, candidates: int, share_scores: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``candidates`` best (query, class) pairs of sigmoid ``pred_logits [B,Q,C]``, best first: their
    ``scores [B,K]`` (:func:`sigmoid_scores`), ``labels [B,K]`` and normalised cxcywh ``boxes [B,K,4]``
    (``K = min(candidates, Q*C)``)."""
    logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
    num_classes = logits.shape[-1]
    scores, index = sigmoid_scores(logits, share_scores).flatten(1).topk(min(candidates, logits.shape[1] * num_classes), dim=1)
    queries = torch.div(index, num_classes, rounding_mode="floor")
    return scores, index % num_classes, torch.gather(boxes, 1, queries[..., None].expand(-1, -1, 4))


@torch.no_grad()
def postprocess_sigmoid_detections(
    outputs: dict, orig_sizes: torch.Tensor, num_detections: int = 100, nms_threshold: float | None = None,
    share_scores: bool = False,
) -> list[dict[str, torch.Tensor]]:
    """The ``num_detections`` best (query, class) pairs of each image, for sigmoid classifiers (Deformable
    DETR, DINO): ``pred_logits [B,Q,C]`` hold one independent logit per category id, no no-object class.

    A query may give several detections with different classes, as in Deformable DETR's evaluation.
    With ``nms_threshold``, the best ``NMS_CANDIDATES`` pairs go through per-class non-maximum
    suppression at that IoU first (as the official DINO's optional post-processing selects 300 and
    suppresses): a detector trained briefly still gives duplicates that one-to-one matching has not
    yet learnt to silence. ``share_scores``: see :func:`sigmoid_scores`. ``pred_boxes`` and ``orig_sizes``
    as in :func:`postprocess_detections`; returns the same keys, best score first.
    """
    _check_sizes(orig_sizes, len(outputs["pred_logits"]))
    candidates = num_detections if nms_threshold is None else max(num_detections, NMS_CANDIDATES)
    detections = _detections(*sigmoid_candidates(outputs, candidates, share_scores), orig_sizes)
    if nms_threshold is None:
        return detections
    kept = []
    for found in detections:
        keep = batched_nms(found["boxes"].float(), found["scores"].float(), found["labels"], nms_threshold)[:num_detections]
        kept.append({key: value[keep] for key, value in found.items()})
    return kept


def postprocess_sigmoid_per_query(outputs: dict, orig_sizes: torch.Tensor, share_scores: bool = False) -> list[dict[str, torch.Tensor]]:
    """One detection per query for sigmoid classifiers (DINO): its best category id and that score
    (:func:`sigmoid_scores`), in the layout of :func:`postprocess_detections` (``[Q]`` entries in query order)."""
    logits = outputs["pred_logits"]
    _check_sizes(orig_sizes, len(logits))
    scores, labels = sigmoid_scores(logits, share_scores).max(-1)
    return _detections(scores, labels, outputs["pred_boxes"], orig_sizes)


@torch.no_grad()
def postprocess_panoptic(
    outputs: dict,
    sizes: torch.Tensor,
    orig_sizes: torch.Tensor,
    is_thing: Mapping[int, bool],
    threshold: float = 0.85,
    min_area: int = 4,
) -> list[dict]:
    """DETR's PostProcessPanoptic: one segment map per image at its original size.

    ``outputs``: ``pred_logits [B,Q,C+1]`` and ``pred_masks [B,Q,h,w]`` (logits at stride 4 of the
    padded batch); ``sizes`` and ``orig_sizes`` ``[B,2]``: (h, w) of the unpadded model input and of
    the original image; ``is_thing``: category id -> thing (True) or stuff (False).

    A query is kept when its most probable class (no-object included) is a real category of
    ``is_thing`` with probability above ``threshold``. Its mask is upsampled bilinearly 4x, cropped
    to ``sizes``, and every pixel goes to the kept query with the highest mask logit; the segment
    map is then resized (nearest) to ``orig_sizes``. Queries of one stuff category form one
    segment. Segments covering at most ``min_area`` pixels of the original image are dropped and
    the pixels re-assigned among the remaining queries, until none is that small. (DETR's code drops
    merged stuff duplicates in that second round instead of keeping their pixels with the class.)

    Returns per image ``{"segment_ids": int64 [H0,W0] (0: void, segments 1..N), "segments_info":
    [{"id", "category_id", "isthing", "area", "score"}]}`` (a segment's score: its first query's class
    probability); with no query kept, the map is all void.
    """
    logits, masks = outputs["pred_logits"], outputs["pred_masks"]
    for name, value in (("sizes", sizes), ("orig_sizes", orig_sizes)):
        if value.shape != (len(logits), 2):
            raise ValueError(
                f"{__name__}: {name} must be [B,2] = [{len(logits)},2] (h, w), got {list(value.shape)}"
            )
    scores, classes = logits.softmax(-1).max(-1)
    known = torch.tensor([c in is_thing for c in classes.flatten().tolist()], dtype=torch.bool, device=classes.device)
    keep = (classes != logits.shape[-1] - 1) & (scores > threshold) & known.view_as(classes)
    return [
        _panoptic_image(masks[b][keep[b]], classes[b][keep[b]].tolist(), scores[b][keep[b]].tolist(), sizes[b].tolist(),
                        orig_sizes[b].tolist(), is_thing, min_area)
        for b in range(len(logits))
    ]


def _panoptic_image(
    mask_logits: torch.Tensor, classes: list[int], scores: list[float], size: list[int], orig_size: list[int],
    is_thing: Mapping[int, bool], min_area: int
) -> dict:
    """Segment map of one image from the kept queries' ``mask_logits [K,h,w]``, ``classes`` and ``scores``."""
    height, width = size
    padded_size = [4 * n for n in mask_logits.shape[-2:]]
    if height > padded_size[0] or width > padded_size[1]:
        raise ValueError(
            f"{__name__}: sizes {size} exceed the padded input {padded_size} that the stride-4 masks cover"
        )
    if classes:
        mask_logits = F.interpolate(mask_logits[None], scale_factor=4, mode="bilinear", align_corners=False)[0, :, :height, :width]
    while classes:
        segment_of_query, categories, segment_scores, stuff_segment = [], [], [], {}
        for category, score in zip(classes, scores):
            if not is_thing[category] and category in stuff_segment:
                segment_of_query.append(stuff_segment[category])
                continue
            if not is_thing[category]:
                stuff_segment[category] = len(categories)
            segment_of_query.append(len(categories))
            categories.append(category)
            segment_scores.append(score)
        owner = torch.tensor(segment_of_query, device=mask_logits.device)[mask_logits.argmax(0)]
        owner = F.interpolate(owner[None, None].float(), size=orig_size, mode="nearest-exact")[0, 0].long()
        area = torch.bincount(owner.flatten(), minlength=len(categories)).tolist()
        kept_query = [area[s] > min_area for s in segment_of_query]
        if all(kept_query):
            segments_info = [
                {"id": i + 1, "category_id": c, "isthing": bool(is_thing[c]), "area": a, "score": score}
                for i, (c, a, score) in enumerate(zip(categories, area, segment_scores))
            ]
            return {"segment_ids": owner + 1, "segments_info": segments_info}
        mask_logits = mask_logits[torch.tensor(kept_query, device=mask_logits.device)]
        classes = [c for c, kept in zip(classes, kept_query) if kept]
        scores = [s for s, kept in zip(scores, kept_query) if kept]
    return {"segment_ids": torch.zeros(orig_size, dtype=torch.int64, device=mask_logits.device), "segments_info": []}
