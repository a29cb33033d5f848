"""Pictures of predictions, drawn with ``torchvision.utils``: boxes, semantic and panoptic maps."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import torch
from torch import Tensor
from torchvision.io import write_png
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks, make_grid


def palette(num_colors: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """``num_colors`` distinct-looking RGB colours, the same for the same ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    colors = torch.randint(40, 256, (num_colors, 3), generator=generator)
    return [tuple(int(c) for c in row) for row in colors]


def draw_detections(
    image: Tensor,
    boxes: Tensor,
    labels: Tensor,
    scores: Tensor | None = None,
    category_names: Mapping[int, str] | None = None,
    score_threshold: float = 0.5,
) -> Tensor:
    """Draws boxes ``[K,4]`` (xyxy pixels) with ``name score`` captions on ``image`` ``[3,H,W]`` uint8."""
    keep = scores >= score_threshold if scores is not None else torch.ones(len(boxes), dtype=torch.bool)
    boxes, labels = boxes[keep], labels[keep]
    names = category_names or {}
    captions = [names.get(int(label), str(int(label))) for label in labels]
    if scores is not None:
        captions = [f"{caption} {score:.2f}" for caption, score in zip(captions, scores[keep].tolist())]
    colors = palette(max(int(labels.max()) + 1, 1) if len(labels) else 1)
    return draw_bounding_boxes(
        image, boxes, labels=captions, colors=[colors[int(label)] for label in labels], width=2
    )


def draw_semantic(image: Tensor, segmentation: Tensor, num_classes: int, alpha: float = 0.5, ignore_index: int = 255) -> Tensor:
    """Blends class colours of ``segmentation`` ``[H,W]`` (class indices) into ``image`` ``[3,H,W]`` uint8."""
    present = [int(c) for c in segmentation.unique() if int(c) != ignore_index]
    if not present:
        return image
    masks = torch.stack([segmentation == c for c in present])
    colors = palette(num_classes)
    return draw_segmentation_masks(image, masks, alpha=alpha, colors=[colors[c] for c in present])


def draw_panoptic(image: Tensor, segment_ids: Tensor, segment_classes: Mapping[int, int], num_classes: int, alpha: float = 0.5) -> Tensor:
    """Colours each segment of ``segment_ids`` ``[H,W]`` by its class and outlines it in white."""
    ids = [int(i) for i in segment_ids.unique() if int(i) in segment_classes]
    if not ids:
        return image
    masks = torch.stack([segment_ids == i for i in ids])
    colors = palette(num_classes)
    out = draw_segmentation_masks(image, masks, alpha=alpha, colors=[colors[segment_classes[i]] for i in ids])
    edges = torch.zeros_like(segment_ids, dtype=torch.bool)
    edges[1:, :] |= segment_ids[1:, :] != segment_ids[:-1, :]
    edges[:, 1:] |= segment_ids[:, 1:] != segment_ids[:, :-1]
    return draw_segmentation_masks(out, edges[None], alpha=1.0, colors=["white"])


def grid(images: Sequence[Tensor], nrow: int = 4) -> Tensor:
    """uint8 ``[3,H,W]`` images (padded to one size) side by side, ``nrow`` to a row: one uint8 ``[3,H',W']`` image."""
    height = max(i.shape[1] for i in images)
    width = max(i.shape[2] for i in images)
    padded = [torch.nn.functional.pad(i, (0, width - i.shape[2], 0, height - i.shape[1])) for i in images]
    return make_grid(torch.stack(padded), nrow=nrow, padding=2)


def save_grid(images: Sequence[Tensor], path: str | Path, nrow: int = 4) -> Path:
    """Writes :func:`grid` of uint8 ``[3,H,W]`` images into a PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_png(grid(images, nrow), str(path))
    return path
