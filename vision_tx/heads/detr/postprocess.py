"""DETR outputs -> detections in original-image pixels."""

from __future__ import annotations

import torch
from torchvision.ops import box_convert


@torch.no_grad()
def postprocess_detections(outputs: dict, orig_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Scores, category ids and absolute xyxy boxes for every query of every image.

    ``outputs``: ``pred_logits [B,Q,C+1]`` (last class: no-object) and ``pred_boxes [B,Q,4]``
    (cxcywh, normalised to the unpadded image); ``orig_sizes [B,2]`` holds (h, w) of the original
    images. Each query keeps its most probable real class (softmax over all classes, no-object
    excluded from the max), as DETR scores its predictions for COCO evaluation. Returns per image
    ``{"scores" [Q], "labels" [Q] int64, "boxes" [Q,4] xyxy pixels}``.
    """
    logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
    if orig_sizes.shape != (len(logits), 2):
        raise ValueError(
            f"vision_tx/heads/detr/postprocess.py: orig_sizes must be [B,2] = [{len(logits)},2] (h, w), got {list(orig_sizes.shape)}"
        )
    scores, labels = logits.softmax(-1)[..., :-1].max(-1)
    height, width = orig_sizes.to(boxes).unbind(1)
    scale = torch.stack([width, height, width, height], dim=1)[:, None, :]
    boxes = box_convert(boxes, "cxcywh", "xyxy") * scale
    return [{"scores": s, "labels": l, "boxes": b} for s, l, b in zip(scores, labels, boxes)]
