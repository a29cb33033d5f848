"""The multi-scale input projection of Deformable DETR and DINO: backbone maps -> levels of one width."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.necks.position_encoding import SinePositionEncoding
from vision_tx.ops.conv import Conv2d


@dataclass
class MultiScaleLevels:
    """The levels of a feature pyramid, highest resolution first, flattened for a deformable transformer."""

    tokens: torch.Tensor  # [B,S,D] every level's tokens, concatenated (S = sum of h*w)
    position: torch.Tensor | None  # [B,S,D] sine position encoding plus the level embedding (None: RT-DETR's decoder)
    padding_mask: torch.Tensor  # [B,S] bool, True on padding
    shapes: list[tuple[int, int]]  # the levels' (h, w)
    valid_ratios: torch.Tensor  # [B,L,2] the unpadded fraction of each level, (width, height)


class MultiScaleProjection(nn.Module):
    """Projects backbone maps ``in_channels`` (e.g. strides 8, 16, 32) to ``dim`` channels by 1x1 conv +
    GroupNorm, and adds ``num_levels - len(in_channels)`` lower-resolution levels, each a 3x3 stride-2
    conv + GroupNorm of the previous one (the first of the last backbone map).

    Every level gets a sine position encoding of its padding mask plus a learned level embedding; the
    defaults are DINO's encoding (``temperature`` 20, positions 1..n), Deformable DETR's is
    ``temperature=10000, offset=-0.5`` (pixel centres).
    """

    def __init__(
        self,
        in_channels: Sequence[int],
        dim: int = 256,
        num_levels: int = 4,
        num_groups: int = 32,
        temperature: float = 20.0,
        offset: float = 0.0,
    ) -> None:
        super().__init__()
        if num_levels < len(in_channels):
            raise ValueError(f"{__name__}: num_levels={num_levels} is below the {len(in_channels)} backbone maps given")
        projections = [nn.Sequential(Conv2d(c, dim, 1), nn.GroupNorm(num_groups, dim)) for c in in_channels]
        extra_in = in_channels[-1]
        for _ in range(num_levels - len(in_channels)):
            projections.append(
                nn.Sequential(nn.Conv2d(extra_in, dim, 3, stride=2, padding=1), nn.GroupNorm(num_groups, dim))
            )
            extra_in = dim
        self.input_proj = nn.ModuleList(projections)
        self.level_embed = nn.Parameter(torch.empty(num_levels, dim).normal_())
        self.position_encoding = SinePositionEncoding(dim // 2, temperature, offset=offset)
        self.num_backbone_levels = len(in_channels)
        for projection in self.input_proj:
            nn.init.xavier_uniform_(projection[0].weight)
            nn.init.zeros_(projection[0].bias)

    def forward(
        self, maps: Sequence[torch.Tensor], pixel_mask: torch.Tensor, strides: Sequence[int] | None = None
    ) -> MultiScaleLevels:
        """``maps``: ``[B,C_i,h_i,w_i]`` highest resolution first; ``pixel_mask [B,H,W]`` True on padding;
        ``strides``: every level's pixel stride for exact valid ratios (:func:`flatten_levels`)."""
        if len(maps) != self.num_backbone_levels:
            raise ValueError(f"{__name__}: {len(maps)} backbone maps given, built for {self.num_backbone_levels}")
        levels = [projection(x) for projection, x in zip(self.input_proj, maps)]
        source = maps[-1]
        for projection in self.input_proj[len(maps) :]:
            source = projection(source)
            levels.append(source)

        def position(level: int, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            # float64 models encode in float64; half-precision ones in float32, then cast
            return (
                self.position_encoding(mask, torch.promote_types(dtype, torch.float32)).to(dtype)
                + self.level_embed[level]
            )

        return flatten_levels(levels, pixel_mask, position, strides)


def flatten_levels(
    levels: Sequence[torch.Tensor],
    pixel_mask: torch.Tensor,
    position: Callable[[int, torch.Tensor, torch.dtype], torch.Tensor] | None = None,
    strides: Sequence[int] | None = None,
) -> MultiScaleLevels:
    """``levels``: ``[B,D,h_i,w_i]`` highest resolution first, ``pixel_mask [B,H,W]`` True on padding ->
    their tokens, padding masks, shapes and valid ratios; ``position(level, mask [B,h,w], dtype)``
    gives each level's ``[B,h,w,D]`` position encoding (without it ``position`` is None).

    Without ``strides`` a level's valid ratio is the share of its cells that the nearest-sampled mask leaves
    valid (Deformable DETR's and DINO's convention): a box coordinate then names a point up to a cell away from
    its pixel at the coarse levels (a 200-pixel-wide image in a 256-wide batch: 24 pixels at stride 32). With
    each level's pixel ``strides`` it is the image's exact share of the level's extent, ``w / (w_i * stride_i)``:
    the same pixel at every level."""
    tokens, positions, masks, ratios = [], [], [], []
    if strides is not None:
        image_size = torch.stack([(~pixel_mask[:, 0, :]).sum(1), (~pixel_mask[:, :, 0]).sum(1)], -1)  # (w, h) in pixels
    for level, x in enumerate(levels):
        mask = F.interpolate(pixel_mask[None].float(), size=x.shape[-2:])[0].bool()
        if position is not None:
            positions.append(position(level, mask, x.dtype).flatten(1, 2))
        tokens.append(x.flatten(2).transpose(1, 2))
        masks.append(mask.flatten(1))
        if strides is None:
            valid = ~mask
            ratios.append(
                torch.stack([valid[:, 0, :].sum(1) / mask.shape[2], valid[:, :, 0].sum(1) / mask.shape[1]], -1)
            )
        else:
            extent = (x.shape[-1] * strides[level], x.shape[-2] * strides[level])  # the pixels the level's cells cover
            ratios.append(torch.stack([image_size[:, 0] / extent[0], image_size[:, 1] / extent[1]], -1))
    return MultiScaleLevels(
        torch.cat(tokens, 1),
        torch.cat(positions, 1) if positions else None,
        torch.cat(masks, 1),
        [tuple(x.shape[-2:]) for x in levels],
        torch.stack(ratios, 1).to(levels[0].dtype),
    )
