"""Pictures of predictions, drawn with ``torchvision.utils`` and PIL: boxes, semantic and panoptic maps,
top classes and confusion matrices."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import Tensor
from torchvision.io import write_png
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks, make_grid

from vision_tx.data.transforms import IMAGENET_MEAN, IMAGENET_STD


def denormalize(image: torch.Tensor) -> torch.Tensor:
    """Undoes the ImageNet normalisation of ``image [3,H,W]`` float -> ``[3,H,W]`` uint8 on the CPU."""
    mean = image.new_tensor(IMAGENET_MEAN)[:, None, None]
    std = image.new_tensor(IMAGENET_STD)[:, None, None]
    return (image.float() * std + mean).clamp(0, 1).mul(255).round().to(torch.uint8).cpu()


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
    """Draws ``boxes [K,4]`` (xyxy pixels) of ``labels [K]`` with ``name score`` captions (names from
    ``category_names``, label -> name, else the label; ``scores [K]`` when given) on ``image`` ``[3,H,W]`` uint8,
    those scoring under ``score_threshold`` left out; returns ``[3,H,W]`` uint8."""
    keep = scores >= score_threshold if scores is not None else torch.ones(len(boxes), dtype=torch.bool)
    boxes, labels = boxes[keep], labels[keep]
    if not len(boxes):
        return image  # nothing to draw (torchvision would warn)
    names = category_names or {}
    captions = [names.get(int(label), str(int(label))) for label in labels]
    if scores is not None:
        captions = [f"{caption} {score:.2f}" for caption, score in zip(captions, scores[keep].tolist())]
    colors = palette(max(int(labels.max()) + 1, 1) if len(labels) else 1)
    return draw_bounding_boxes(image, boxes, labels=captions, colors=[colors[int(label)] for label in labels], width=2)


def draw_semantic(
    image: Tensor, segmentation: Tensor, num_classes: int, alpha: float = 0.5, ignore_index: int = 255
) -> Tensor:
    """Blends the colours (a palette of ``num_classes``, opacity ``alpha``) of the classes of ``segmentation`` ``[H,W]``
    (class indices, ``ignore_index`` left uncoloured) into ``image`` ``[3,H,W]`` uint8; returns ``[3,H,W]`` uint8."""
    present = [int(c) for c in segmentation.unique() if int(c) != ignore_index]
    if not present:
        return image
    masks = torch.stack([segmentation == c for c in present])
    colors = palette(num_classes)
    return draw_segmentation_masks(image, masks, alpha=alpha, colors=[colors[c] for c in present])


def draw_panoptic(
    image: Tensor, segment_ids: Tensor, segment_classes: Mapping[int, int], num_classes: int, alpha: float = 0.5
) -> Tensor:
    """Colours each segment of ``segment_ids`` ``[H,W]`` on ``image [3,H,W]`` uint8 by its class (``segment_classes``:
    segment id -> class; a palette of ``num_classes``, opacity ``alpha``) and outlines it in white; segments without a
    class are left out. Returns ``[3,H,W]`` uint8."""
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
    """uint8 ``images [3,H,W]`` (padded to one size) side by side, ``nrow`` to a row: one uint8 ``[3,H',W']`` image."""
    height = max(i.shape[1] for i in images)
    width = max(i.shape[2] for i in images)
    padded = [torch.nn.functional.pad(i, (0, width - i.shape[2], 0, height - i.shape[1])) for i in images]
    return make_grid(torch.stack(padded), nrow=nrow, padding=2)


def save_grid(images: Sequence[Tensor], path: str | Path, nrow: int = 4) -> Path:
    """Writes :func:`grid` of uint8 ``images [3,H,W]``, ``nrow`` to a row, into a PNG at ``path``; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_png(grid(images, nrow), str(path))
    return path


def _text_block(lines: Sequence[str], width: int, line_height: int = 12) -> Image.Image:
    block = Image.new("RGB", (width, line_height * len(lines) + 4), (0, 0, 0))
    draw = ImageDraw.Draw(block)
    for i, line in enumerate(lines):
        draw.text((3, 2 + i * line_height), line, fill=(255, 255, 255))
    return block


def draw_top_classes(image: Tensor, probabilities: Tensor, class_names: Sequence[str], k: int = 5) -> Tensor:
    """``image`` ``[3,H,W]`` uint8 with the ``k`` most probable classes of ``probabilities`` ``[C]``
    written under it (``name probability`` per line, the names from ``class_names``); returns ``[3,H+h,max(W,w)]``
    uint8."""
    scores, indices = probabilities.float().topk(min(k, len(probabilities)))
    lines = [f"{class_names[int(i)]} {float(s):.2f}" for s, i in zip(scores, indices)]
    width = max(image.shape[2], 7 * max(len(line) for line in lines) + 6)
    text = _text_block(lines, width)
    canvas = Image.new("RGB", (width, image.shape[1] + text.height), (0, 0, 0))
    canvas.paste(Image.fromarray(image.permute(1, 2, 0).cpu().numpy()), (0, 0))
    canvas.paste(text, (0, image.shape[1]))
    return torch.from_numpy(np.asarray(canvas).copy()).permute(2, 0, 1)


def worst_classes(confusion: Tensor, count: int) -> list[int]:
    """The ``count`` classes of lowest recall in ``confusion`` ``[C,C]`` (rows true, columns predicted),
    each followed by the class it is most often mistaken for; classes never seen are left out."""
    confusion = confusion.double()
    seen = confusion.sum(1) > 0
    recall = torch.where(seen, confusion.diagonal() / confusion.sum(1).clamp_min(1), torch.inf)
    chosen: list[int] = []
    for c in recall.argsort().tolist()[:count]:
        if not seen[c]:
            break
        errors = confusion[c].clone()
        errors[c] = -1
        for index in (c, int(errors.argmax())):
            if index not in chosen:
                chosen.append(index)
    return chosen


def draw_confusion(confusion: Tensor, class_names: Sequence[str], count: int = 10, cell: int = 20) -> Tensor:
    """The ``confusion`` matrix ``[C,C]`` (rows true, columns predicted) restricted to :func:`worst_classes` (``count``
    of them), each row normalised and drawn from white (0) to dark red (1) in cells of ``cell`` pixels, true class
    names from ``class_names`` on the left, column numbers matching the rows' ``#``; returns ``[3,H,W]`` uint8."""
    chosen = worst_classes(confusion, count)
    if not chosen:
        chosen = list(range(min(len(class_names), count)))
    sub = confusion.double()[chosen][:, chosen]
    fractions = (sub / confusion.double()[chosen].sum(1, keepdim=True).clamp_min(1)).numpy()
    labels = [
        f"#{i} {class_names[c][:24]} ({float(confusion[c, c]) / max(float(confusion[c].sum()), 1):.2f})"
        for i, c in enumerate(chosen)
    ]
    left = 7 * max(len(label) for label in labels) + 8
    size = len(chosen)
    canvas = Image.new("RGB", (left + cell * size + 2, cell * (size + 1) + 2), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for j in range(size):
        draw.text((left + j * cell + 3, 4), f"#{j}", fill=(0, 0, 0))
    for i, label in enumerate(labels):
        top = cell * (i + 1)
        draw.text((3, top + 4), label, fill=(0, 0, 0))
        for j in range(size):
            shade = int(255 * (1 - fractions[i, j]))
            draw.rectangle(
                [left + j * cell, top, left + (j + 1) * cell - 1, top + cell - 1],
                fill=(255, shade, shade),
                outline=(200, 200, 200),
            )
    return torch.from_numpy(np.asarray(canvas).copy()).permute(2, 0, 1)


def overlay_heatmap(image: Tensor, heat: Tensor, alpha: float = 0.6) -> Tensor:
    """``heat`` ``[h,w]`` scaled to its own range, resized to ``image`` ``[3,H,W]`` uint8 and blended
    in with opacity ``alpha`` as red (high) over blue (low); returns ``[3,H,W]`` uint8."""
    heat = heat.float().cpu()
    heat = (heat - heat.min()) / (heat.max() - heat.min()).clamp_min(1e-12)
    heat = torch.nn.functional.interpolate(
        heat[None, None], size=image.shape[-2:], mode="bilinear", align_corners=False
    )[0, 0]
    colour = torch.stack([heat, 0.2 * torch.ones_like(heat), 1 - heat]) * 255
    return (image.float().cpu() * (1 - alpha) + colour * alpha).round().clamp(0, 255).to(torch.uint8)
