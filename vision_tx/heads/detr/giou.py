"""The generalized IoU loss of box pairs without boolean indexing: torchvision's ``generalized_box_iou_loss``
picks the overlapping pairs with a mask (a read back to the host on a GPU, a dynamic shape for compilers and
CUDA graphs, and a handful of extra operators in every training step); here they are selected with ``where``."""

from __future__ import annotations

import torch


def paired_intersection_union(boxes: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Intersection and union areas ``[...]`` of each box of ``boxes [..., 4]`` with the box at the same place of
    ``other`` (both xyxy), as torchvision's IoU losses compute them."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    x1o, y1o, x2o, y2o = other.unbind(-1)
    width = torch.minimum(x2, x2o) - torch.maximum(x1, x1o)
    height = torch.minimum(y2, y2o) - torch.maximum(y1, y1o)
    intersection = torch.where((width > 0) & (height > 0), width * height, 0.0)
    return intersection, (x2 - x1) * (y2 - y1) + (x2o - x1o) * (y2o - y1o) - intersection


def paired_giou_loss(boxes: torch.Tensor, other: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """``1 - GIoU`` of each box of ``boxes [..., 4]`` with the box at the same place of ``other`` (both xyxy) ->
    ``[...]``: torchvision's ``generalized_box_iou_loss`` (Rezatofighi et al., 2019), values and gradients,
    ``eps`` in both divisions as there."""
    intersection, union = paired_intersection_union(boxes, other)
    hull_size = torch.maximum(boxes[..., 2:], other[..., 2:]) - torch.minimum(boxes[..., :2], other[..., :2])
    hull = hull_size[..., 0] * hull_size[..., 1]
    return 1 - (intersection / (union + eps) - (hull - union) / (hull + eps))
