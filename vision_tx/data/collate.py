"""Batching detection samples of different sizes: zero padding plus a pixel mask."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


def collate_detection(
    batch: Sequence[tuple[torch.Tensor, dict[str, Any]]], size_divisibility: int = 0
) -> dict[str, Any]:
    """Pads the images of ``batch`` (pairs of ``[3, H_i, W_i]`` image and target) at the bottom and right.

    Returns ``{"images": [B, 3, H, W], "pixel_mask": [B, H, W] bool (True on padding), "targets": list}``
    where ``H, W`` are the largest image sides, rounded up to a multiple of ``size_divisibility`` when
    it is positive. Target tensors lose their ``tv_tensors`` types (boxes become a plain ``[K, 4]``).
    """
    images = [image for image, _ in batch]
    height = max(image.shape[-2] for image in images)
    width = max(image.shape[-1] for image in images)
    if size_divisibility > 0:
        height = math.ceil(height / size_divisibility) * size_divisibility
        width = math.ceil(width / size_divisibility) * size_divisibility
    padded = images[0].new_zeros((len(images), images[0].shape[0], height, width)).as_subclass(torch.Tensor)
    pixel_mask = torch.ones((len(images), height, width), dtype=torch.bool)
    for i, image in enumerate(images):
        h, w = image.shape[-2:]
        padded[i, :, :h, :w] = image
        pixel_mask[i, :h, :w] = False
    targets = [
        {
            key: value.as_subclass(torch.Tensor) if isinstance(value, torch.Tensor) else value
            for key, value in target.items()
        }
        for _, target in batch
    ]
    return {"images": padded, "pixel_mask": pixel_mask, "targets": targets}
