"""DETR outputs -> detections, or panoptic segment maps, in original-image pixels."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torchvision.ops import box_convert, nms

NMS_CANDIDATES = 300


def softmax_detections(outputs: dict, image_sizes: torch.Tensor) -> dict[str, torch.Tensor]:
    """DETR's detections as batch tensors (eager and exported alike): one per query, its most probable real
    class (softmax over all classes, no-object excluded from the max), as DETR scores its predictions for COCO.

    ``outputs``: ``pred_logits [B,Q,C+1]`` (last class: no-object) and ``pred_boxes [B,Q,4]`` (cxcywh, normalised
    to the unpadded image); ``image_sizes [B,2]``: (h, w) the boxes are scaled to. Returns ``{"boxes" [B,Q,4] xyxy
    pixels, "scores" [B,Q], "labels" [B,Q] int64}``."""
    scores, labels = outputs["pred_logits"].softmax(-1)[..., :-1].max(-1)
    return {"boxes": pixel_boxes(outputs["pred_boxes"], image_sizes), "scores": scores, "labels": labels}


@torch.no_grad()
def postprocess_detections(outputs: dict, orig_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Per image ``{"scores" [Q], "labels" [Q] int64, "boxes" [Q,4] xyxy pixels}`` of :func:`softmax_detections` on
    ``outputs`` (``pred_logits [B,Q,C+1]``, ``pred_boxes [B,Q,4]``); ``orig_sizes [B,2]`` holds (h, w) of the original
    images."""
    _check_sizes(orig_sizes, len(outputs["pred_logits"]))
    return per_image(softmax_detections(outputs, orig_sizes))


def per_image(detections: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Batch ``detections`` (``[B,N,...]`` tensors, padding labelled -1 after the kept ones) -> per image
    ``{"scores", "labels", "boxes"}`` without the padding: the eager form of the exported outputs."""
    return [
        {key: detections[key][b][keep] for key in ("scores", "labels", "boxes")}
        for b, keep in enumerate(detections["labels"] >= 0)
    ]


def _check_sizes(orig_sizes: torch.Tensor, batch: int) -> None:
    if orig_sizes.shape != (batch, 2):
        raise ValueError(f"{__name__}: orig_sizes must be [B,2] = [{batch},2] (h, w), got {list(orig_sizes.shape)}")


def checked_sizes(image_sizes: torch.Tensor, outputs: dict) -> torch.Tensor:
    """``image_sizes`` after checking that it is ``[B,2]`` for the batch of ``outputs`` (eager code's check)."""
    _check_sizes(image_sizes, len(outputs["pred_logits"]))
    return image_sizes


def pixel_boxes(boxes: torch.Tensor, orig_sizes: torch.Tensor) -> torch.Tensor:
    """Normalised cxcywh ``boxes [B,N,4]`` -> absolute xyxy in images of ``orig_sizes [B,2]`` (h, w)."""
    height, width = orig_sizes.to(boxes).unbind(1)
    scale = torch.stack([width, height, width, height], dim=1)[:, None, :]
    return box_convert(boxes, "cxcywh", "xyxy") * scale


def sigmoid_scores(logits: torch.Tensor, share_scores: bool = False) -> torch.Tensor:
    """Each (query, class) pair's score from sigmoid ``logits [B,Q,C]``: its probability ``p``, or with
    ``share_scores`` ``p`` times the class's share of the query's summed probabilities (``p_c * p_c / sum(p)``):
    a query torn between two classes scores both lower, a confident one keeps its score. ``[B,Q,C]``."""
    probabilities = logits.sigmoid()
    if not share_scores:
        return probabilities
    return (
        probabilities
        * probabilities
        / probabilities.sum(-1, keepdim=True).clamp(min=torch.finfo(probabilities.dtype).tiny)
    )


def sigmoid_candidates(
    outputs: dict, candidates: int, share_scores: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``candidates`` best (query, class) pairs of ``outputs`` (sigmoid ``pred_logits [B,Q,C]``, ``pred_boxes
    [B,Q,4]``), best first: their ``scores [B,K]`` (:func:`sigmoid_scores`, with ``share_scores``), ``labels [B,K]``
    and normalised cxcywh ``boxes [B,K,4]``
    (``K = min(candidates, Q*C)``)."""
    logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
    num_classes = logits.shape[-1]
    scores, index = (
        sigmoid_scores(logits, share_scores).flatten(1).topk(min(candidates, logits.shape[1] * num_classes), dim=1)
    )
    queries = torch.div(index, num_classes, rounding_mode="floor")
    return scores, index % num_classes, torch.gather(boxes, 1, queries[..., None].expand(-1, -1, 4))


def sigmoid_detections(
    outputs: dict,
    image_sizes: torch.Tensor,
    num_detections: int = 100,
    nms_threshold: float | None = None,
    share_scores: bool = False,
) -> dict[str, torch.Tensor]:
    """The ``num_detections`` best (query, class) pairs of each image as batch tensors (eager and exported
    alike), for sigmoid classifiers (Deformable DETR, DINO, RT-DETR, D-FINE): the ``pred_logits [B,Q,C]`` of
    ``outputs`` hold one independent logit per category id, no no-object class.

    A query may give several detections with different classes, as in Deformable DETR's evaluation.
    With ``nms_threshold``, the best ``NMS_CANDIDATES`` pairs go through per-class non-maximum
    suppression at that IoU first (as the official DINO's optional post-processing selects 300 and
    suppresses): a detector trained briefly still gives duplicates that one-to-one matching has not
    yet learnt to silence; the kept ones come first, best first, and the rest is padding (score 0, label -1).
    ``share_scores``: see :func:`sigmoid_scores`. ``pred_boxes [B,Q,4]`` and ``image_sizes [B,2]`` as in
    :func:`softmax_detections`, whose keys it returns (``[B,N]``, ``"boxes" [B,N,4]`` xyxy pixels,
    ``N = min(num_detections, Q*C)``).
    """
    candidates = num_detections if nms_threshold is None else max(num_detections, NMS_CANDIDATES)
    scores, labels, boxes = sigmoid_candidates(outputs, candidates, share_scores)
    boxes = pixel_boxes(boxes, image_sizes)
    if nms_threshold is None:
        return {"boxes": boxes, "scores": scores, "labels": labels}
    keep = batched_nms_mask(boxes, scores, labels, nms_threshold)
    # The kept candidates first, in their (best-first) order: a unique key per candidate, so no ties.
    candidates = scores.shape[1]
    order = torch.arange(candidates, device=scores.device) + candidates * (~keep).long()
    order = order.argsort(dim=1)[:, :num_detections]
    return {
        "boxes": boxes.gather(1, order[..., None].expand(-1, -1, 4)),
        "scores": (scores * keep).gather(1, order),
        "labels": labels.masked_fill(~keep, -1).gather(1, order),
    }


def batched_nms_mask(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, threshold: float) -> torch.Tensor:
    """Which of the detections ``boxes [B,K,4]`` (xyxy), ``scores [B,K]``, ``labels [B,K]`` survive per-image,
    per-class NMS at IoU ``threshold``: ``bool [B,K]``. One ``torchvision.ops.nms`` over all images, each
    (image, class) pair moved to its own region (torchvision's ``batched_nms`` trick; ONNX's NonMaxSuppression)."""
    batch, candidates = scores.shape
    groups = labels + (labels.max() + 1) * torch.arange(batch, device=labels.device)[:, None]
    offsets = (groups * (boxes.max() + 1)).to(boxes)[..., None]
    kept = nms((boxes + offsets).flatten(0, 1).float(), scores.flatten().float(), threshold)
    mask = torch.zeros(batch * candidates, dtype=torch.bool, device=boxes.device).index_fill(0, kept, True)
    return mask.view(batch, candidates)


@torch.no_grad()
def postprocess_sigmoid_detections(
    outputs: dict,
    orig_sizes: torch.Tensor,
    num_detections: int = 100,
    nms_threshold: float | None = None,
    share_scores: bool = False,
) -> list[dict[str, torch.Tensor]]:
    """Per image the detections of :func:`sigmoid_detections` (the same arguments: ``outputs``, ``orig_sizes [B,2]``
    (h, w), ``num_detections``, ``nms_threshold``, ``share_scores``), without the padding; the keys of
    :func:`postprocess_detections` (``[N]``, ``"boxes" [N,4]`` xyxy pixels), best score first."""
    _check_sizes(orig_sizes, len(outputs["pred_logits"]))
    return per_image(sigmoid_detections(outputs, orig_sizes, num_detections, nms_threshold, share_scores))


def postprocess_sigmoid_per_query(
    outputs: dict, orig_sizes: torch.Tensor, share_scores: bool = False
) -> list[dict[str, torch.Tensor]]:
    """One detection per query of ``outputs`` (``pred_logits [B,Q,C]``, ``pred_boxes [B,Q,4]``) for sigmoid
    classifiers (DINO): its best category id and that score (:func:`sigmoid_scores`, with ``share_scores``), its box
    xyxy in pixels of ``orig_sizes [B,2]`` (h, w), in the layout of :func:`postprocess_detections` (``[Q]`` entries
    in query order)."""
    logits = outputs["pred_logits"]
    _check_sizes(orig_sizes, len(logits))
    scores, labels = sigmoid_scores(logits, share_scores).max(-1)
    return per_image({"boxes": pixel_boxes(outputs["pred_boxes"], orig_sizes), "scores": scores, "labels": labels})


def thing_table(is_thing: Mapping[int, bool], num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``is_thing`` (category id -> thing) as two bool ``[num_classes+1]`` tables (``num_classes`` real classes),
    indexed by class (the last:
    no-object): ``thing`` (ids not in ``is_thing`` count as stuff) and ``known`` (the ids ``is_thing`` names)."""
    thing = torch.zeros(num_classes + 1, dtype=torch.bool)
    known = torch.zeros(num_classes + 1, dtype=torch.bool)
    for category, value in is_thing.items():
        if 0 <= category < num_classes:
            thing[category], known[category] = bool(value), True
    return thing, known


def number_segments(classes: torch.Tensor, accepted: torch.Tensor, thing: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Segments of the ``accepted [B,Q]`` queries of ``classes [B,Q]``, numbered 1..S in query order, the queries
    of one stuff class (``thing``: bool by class) sharing the segment of the first: ``segment_of_query [B,Q]``
    (0: none), and which queries start a segment (``starts [B,Q]``) with its number (``ids [B,Q]``, 0 elsewhere)."""
    index = torch.arange(classes.shape[1], device=classes.device)
    # For each query, the first accepted query of its class at or before it (a stuff query's segment's owner).
    same = (classes[:, :, None] == classes[:, None, :]) & accepted[:, None, :] & (index[None, :] <= index[:, None])
    first = torch.where(thing.to(classes.device)[classes], index, same.long().argmax(-1))
    starts = accepted & (first == index)
    ids = torch.cumsum(starts.long(), 1) * starts
    return torch.where(accepted, ids.gather(1, first), 0), starts, ids


def per_segment(values: torch.Tensor, starts: torch.Tensor, ids: torch.Tensor, fill: float) -> torch.Tensor:
    """``values [B,Q]`` of the queries that start segments (``starts [B,Q]`` bool, numbered by ``ids [B,Q]``) ->
    ``[B,Q]``: segment ``i``'s at index ``i - 1``, ``fill`` past the last."""
    queries = values.shape[1]
    slot = torch.where(starts, ids - 1, queries)
    return values.new_full((values.shape[0], queries + 1), fill).scatter(1, slot, values)[:, :queries]


def segments(
    segment_ids: torch.Tensor, labels: torch.Tensor, scores: torch.Tensor, is_thing: Mapping[int, bool]
) -> dict:
    """One image's batch panoptic outputs (``segment_ids [H,W]``, ``labels [Q]`` and ``scores [Q]`` by segment,
    label -1 past the last; ``is_thing``: category id -> thing) -> ``{"segment_ids", "segments_info": [{"id",
    "category_id", "isthing", "area", "score"}]}``."""
    count = int((labels >= 0).sum())
    areas = torch.bincount(segment_ids.flatten(), minlength=count + 1).tolist()
    segments_info = [
        {"id": i + 1, "category_id": c, "isthing": bool(is_thing[c]), "area": areas[i + 1], "score": score}
        for i, (c, score) in enumerate(zip(labels[:count].tolist(), scores[:count].tolist()))
    ]
    return {"segment_ids": segment_ids, "segments_info": segments_info}


def panoptic_segments(
    logits: torch.Tensor,
    mask_logits: torch.Tensor,
    thing: torch.Tensor,
    known: torch.Tensor,
    threshold: float = 0.85,
    min_area: int = 4,
    orig_size: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DETR's panoptic segments as batch tensors (eager and exported alike, no loop over images or rounds).

    ``logits [B,Q,C+1]``; ``mask_logits [B,Q,H,W]`` upsampled to the unpadded input; ``thing`` and ``known``: see
    :func:`thing_table`. Queries whose most probable class is a known real category above ``threshold`` compete
    for each pixel by mask logit; the segment map is resized (nearest) to ``orig_size`` (default: kept); segments
    of at most ``min_area`` pixels there are dropped and their pixels re-assigned. Two rounds are the eager loop
    exactly: dropping queries only hands their pixels to the others, so every segment that survives the first
    round only grows, and the second round drops nothing. Returns ``segment_ids [B,H0,W0]`` (0: void, segments
    1..S) and per segment ``labels [B,Q]`` (-1 past S) and ``scores [B,Q]`` (its first query's probability)."""
    scores, classes = logits.softmax(-1).max(-1)  # [B,Q]
    kept = (classes != logits.shape[-1] - 1) & (scores > threshold) & known.to(classes.device)[classes]
    for _ in range(2):
        segment_of_query, starts, ids = number_segments(classes, kept, thing)
        owner = torch.where(kept[..., None, None], mask_logits, float("-inf")).argmax(1)  # [B,H,W]
        segment_ids = segment_of_query.gather(1, owner.flatten(1)).view_as(owner)
        if orig_size is not None:
            segment_ids = F.interpolate(segment_ids[:, None].float(), size=orig_size, mode="nearest-exact")[:, 0].long()
        pixels = segment_ids.flatten(1)
        area = pixels.new_zeros(scores.shape[0], scores.shape[1] + 1).scatter_add(1, pixels, torch.ones_like(pixels))
        kept = kept & (area.gather(1, segment_of_query) > min_area)
    return segment_ids, per_segment(classes, starts, ids, -1), per_segment(scores, starts, ids, 0.0)


def upsampled_masks(mask_logits: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """DETR's stride-4 ``mask_logits [B,Q,h,w]`` of the padded batch -> upsampled 4x bilinearly, cropped to ``size``
    (H, W): ``[B,Q,H,W]``."""
    height, width = size
    return F.interpolate(mask_logits, scale_factor=4, mode="bilinear", align_corners=False)[..., :height, :width]


@torch.no_grad()
def postprocess_panoptic(
    outputs: dict,
    sizes: torch.Tensor,
    orig_sizes: torch.Tensor,
    is_thing: Mapping[int, bool],
    threshold: float = 0.85,
    min_area: int = 4,
) -> list[dict]:
    """DETR's PostProcessPanoptic: one segment map per image at its original size, :func:`panoptic_segments` per image.

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
            raise ValueError(f"{__name__}: {name} must be [B,2] = [{len(logits)},2] (h, w), got {list(value.shape)}")
    thing, known = thing_table(is_thing, logits.shape[-1] - 1)
    padded_size = [4 * n for n in masks.shape[-2:]]
    results = []
    for b, (size, orig_size) in enumerate(zip(sizes.tolist(), orig_sizes.tolist())):
        if size[0] > padded_size[0] or size[1] > padded_size[1]:
            raise ValueError(
                f"{__name__}: sizes {size} exceed the padded input {padded_size} that the stride-4 masks cover"
            )
        segment_ids, labels, scores = panoptic_segments(
            logits[b : b + 1],
            upsampled_masks(masks[b : b + 1], size),
            thing,
            known,
            threshold,
            min_area,
            tuple(orig_size),
        )
        results.append(segments(segment_ids[0], labels[0], scores[0], is_thing))
    return results
