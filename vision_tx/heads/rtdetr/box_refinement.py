"""A dense second look at each final box: a grid of features around the box, read from the finest level of the
decoder's memory, regresses a shift of each of its four edges (the RoI box head of two-stage detectors, Cascade
R-CNN's last stage, put after a DETR decoder, whose deformable attention reads a few points per level only)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import box_convert

from vision_tx.heads.detr.mlp import MLP
from vision_tx.ops.conv import Conv2d


def box_grid_points(boxes: torch.Tensor, size: int, enlarge: float) -> torch.Tensor:
    """The centres of a ``size x size`` grid of bins over each box of ``boxes [B,Q,4]`` (cx, cy, w, h), the box
    first widened ``enlarge`` times about its centre -> ``[B,Q,size*size,2]`` (x, y), row by row."""
    steps = (torch.arange(size, dtype=boxes.dtype, device=boxes.device) + 0.5) / size - 0.5
    offset_y, offset_x = torch.meshgrid(steps, steps, indexing="ij")
    offsets = torch.stack([offset_x, offset_y], -1).reshape(-1, 2)  # [size*size, 2]
    return boxes[..., None, :2] + offsets * boxes[..., None, 2:] * enlarge


class RoIBoxRefinement(nn.Module):
    """Shifts each edge of each box by a fraction of the box's size, regressed from the features under it.

    The ``feature_map [B,D,h,w]`` is reduced to ``channels`` (1x1 conv, BatchNorm, SiLU); each box of
    ``boxes [B,Q,4]`` (cx, cy, w, h normalised to the unpadded image, as the decoder's) widened ``enlarge`` times,
    so that its edges lie inside, is read as ``size x size`` bins, each the mean of ``samples_per_bin`` squared
    bilinear samples spread evenly over it (RoIAlign with that sampling ratio); an MLP turns them into four shifts of
    the left, top, right and bottom edges, ``max_shift * tanh`` of its output times the box's width or height (so the
    box keeps a positive size). The MLP's last layer starts at zero: the refinement starts as the identity.
    """

    def __init__(
        self,
        dim: int,
        channels: int = 16,
        size: int = 7,
        enlarge: float = 1.25,
        max_shift: float = 0.25,
        samples_per_bin: int = 2,
    ) -> None:
        super().__init__()
        self.size, self.enlarge, self.max_shift, self.samples_per_bin = size, enlarge, max_shift, samples_per_bin
        self.reduce = nn.Sequential(Conv2d(dim, channels, 1, bias=False), nn.BatchNorm2d(channels), nn.SiLU())
        self.edges = MLP(channels * size * size, dim, 4, 3)
        nn.init.zeros_(self.edges.layers[-1].weight)
        nn.init.zeros_(self.edges.layers[-1].bias)

    def sample(self, feature_map: torch.Tensor, boxes: torch.Tensor, valid_ratio: torch.Tensor) -> torch.Tensor:
        """``feature_map [B,C,h,w]`` (padded), ``boxes [B,Q,4]``, ``valid_ratio [B,2]`` (the unpadded fraction of the
        map: width, height) -> the grid's samples ``[B,Q,C*size*size]`` (channel by channel, each row by row)."""
        size, per_side = self.size, self.samples_per_bin
        points = (
            box_grid_points(boxes, size * per_side, self.enlarge) * valid_ratio[:, None, None]
        )  # fractions of the padded map
        samples = F.grid_sample(feature_map, 2 * points - 1, mode="bilinear", padding_mode="zeros", align_corners=False)
        if per_side > 1:  # [B,C,Q,(size*per_side)^2] -> the mean of each bin's per_side x per_side samples
            samples = samples.unflatten(-1, (size, per_side, size, per_side)).mean((-3, -1)).flatten(-2)
        return samples.transpose(1, 2).flatten(2)  # [B,C,Q,size*size] -> [B,Q,C*size*size]

    def forward(self, boxes: torch.Tensor, feature_map: torch.Tensor, valid_ratio: torch.Tensor) -> torch.Tensor:
        """``boxes [B,Q,4]`` (cx, cy, w, h), ``feature_map [B,D,h,w]``, ``valid_ratio [B,2]`` -> the refined boxes
        ``[B,Q,4]``."""
        shifts = (
            self.max_shift * self.edges(self.sample(self.reduce(feature_map), boxes, valid_ratio)).tanh()
        )  # [B,Q,4]
        corners = box_convert(boxes, "cxcywh", "xyxy") + shifts * boxes[..., 2:].repeat(
            1, 1, 2
        )  # each edge by its side
        return box_convert(corners, "xyxy", "cxcywh")
