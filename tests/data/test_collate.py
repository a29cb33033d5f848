"""Batching detection samples: padding, pixel mask, plain-tensor targets."""

from __future__ import annotations

import pytest
import torch
from torchvision import tv_tensors

from vision_tx.data.collate import collate_detection


def _sample(height: int, width: int) -> tuple[tv_tensors.Image, dict]:
    image = tv_tensors.Image(torch.rand(3, height, width))
    boxes = tv_tensors.BoundingBoxes([[1.0, 2.0, 3.0, 4.0]], format="XYXY", canvas_size=(height, width))
    return image, {
        "boxes": boxes,
        "labels": torch.tensor([3]),
        "image_id": height,
        "size": torch.tensor([height, width]),
    }


@pytest.mark.parametrize(("size_divisibility", "padded_hw"), [(0, (30, 50)), (32, (32, 64))])
def test_padding_and_pixel_mask(size_divisibility: int, padded_hw: tuple[int, int]) -> None:
    batch = [_sample(20, 50), _sample(30, 10)]
    out = collate_detection(batch, size_divisibility=size_divisibility)
    images, pixel_mask = out["images"], out["pixel_mask"]
    assert images.shape == (2, 3, *padded_hw) and type(images) is torch.Tensor
    assert pixel_mask.shape == (2, *padded_hw) and pixel_mask.dtype == torch.bool
    for i, (image, _) in enumerate(batch):
        h, w = image.shape[-2:]
        expected_mask = torch.ones(padded_hw, dtype=torch.bool)
        expected_mask[:h, :w] = False
        assert torch.equal(pixel_mask[i], expected_mask)
        assert torch.equal(images[i, :, :h, :w], image.as_subclass(torch.Tensor))
        assert (images[i][:, pixel_mask[i]] == 0).all()
    assert [t["image_id"] for t in out["targets"]] == [20, 30]
    assert all(type(t["boxes"]) is torch.Tensor for t in out["targets"])
