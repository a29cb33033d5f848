"""Flattening a feature pyramid: the valid ratios that map a box coordinate of the unpadded image onto each level."""

from __future__ import annotations

import torch

from vision_tx.necks.multiscale import flatten_levels
from vision_tx.ops import ms_deform_attn

STRIDES = (8, 16, 32)


def pixel_centre_maps(batch: int, height: int, width: int) -> list[torch.Tensor]:
    """Per level ``[B,2,h,w]``: each cell holds the pixel coordinates (x, y) of its centre, ``(i + 0.5) * stride``."""
    maps = []
    for stride in STRIDES:
        h, w = -(-height // stride), -(-width // stride)
        y, x = torch.meshgrid(
            (torch.arange(h, dtype=torch.float64) + 0.5) * stride,
            (torch.arange(w, dtype=torch.float64) + 0.5) * stride,
            indexing="ij",
        )
        maps.append(torch.stack([x, y])[None].expand(batch, -1, -1, -1))
    return maps


def read_at(levels, points: torch.Tensor, level: int) -> torch.Tensor:
    """What the deformable attention reads on ``level`` at ``points [B,Q,2]`` of the unpadded image (normalised)."""
    locations = points[:, :, None, None, None, :] * levels.valid_ratios[:, None, None, :, None, :]  # [B,Q,1,L,1,2]
    weights = torch.zeros(*locations.shape[:-1], dtype=points.dtype)
    weights[:, :, :, level] = 1.0
    return ms_deform_attn(levels.tokens[:, :, None], levels.shapes, locations, weights)


def test_with_strides_every_level_reads_the_pixel_a_point_names() -> None:
    """A 200 x 150 image in a 256 x 192 batch (200 is no multiple of 16 or 32): with the strides, the point (u, v) of
    the image reads pixel (u * 200, v * 150) at every level; the nearest-sampled cells' ratios (Deformable DETR's)
    read it 8 pixels to the right at stride 16 and 24 at stride 32."""
    pixel_mask = torch.zeros(2, 192, 256, dtype=torch.bool)
    pixel_mask[1, :, 200:] = True
    pixel_mask[1, 150:] = True
    maps = pixel_centre_maps(2, 192, 256)
    points = torch.tensor([[0.125, 0.2], [0.5, 0.5], [0.85, 0.8]], dtype=torch.float64).expand(2, -1, -1)
    expected = points * torch.tensor([[[256.0, 192.0]], [[200.0, 150.0]]], dtype=torch.float64)
    exact = flatten_levels(maps, pixel_mask, strides=STRIDES)
    torch.testing.assert_close(exact.valid_ratios[1], torch.tensor([[200 / 256, 150 / 192]] * 3, dtype=torch.float64))
    for level in range(3):
        torch.testing.assert_close(read_at(exact, points, level), expected)
    cells = flatten_levels(maps, pixel_mask)
    right_edge_error = [read_at(cells, points, level)[1, -1, 0] - expected[1, -1, 0] for level in range(3)]
    torch.testing.assert_close(
        torch.stack(right_edge_error), torch.tensor([0.0, 8.0, 24.0], dtype=torch.float64) * 0.85
    )
