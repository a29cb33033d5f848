"""Mask2Former's pixel decoder (Cheng et al., 2022, sec. 4.1): a multi-scale deformable-attention encoder
over the stride 8-32 maps, then FPN steps down to the stride-4 mask features."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.heads.dino.transformer import DeformableEncoder, DeformableEncoderLayer
from vision_tx.necks.multiscale import MultiScaleProjection
from vision_tx.ops.conv import Conv2d


class PixelDecoder(nn.Module):
    """``maps`` (the backbone's pyramid, highest resolution first) -> ``(mask_features [B,mask_dim,H/s0,W/s0],
    [B,dim,h,w] x num_levels)``, the levels lowest resolution first (the decoder's round order).

    The last ``num_levels`` maps are projected (1x1 conv + GroupNorm), get a sine position encoding
    and a level embedding, and go through ``num_layers`` deformable encoder layers. Each earlier map
    (stride 4 on the usual pyramid) is a lateral 1x1 conv + GroupNorm plus the bilinearly upsampled
    finer level, through a 3x3 conv + GroupNorm + ReLU; the finest is projected to the mask features.
    As in the official code, padding is not masked: the padded pixels are read as image.
    """

    def __init__(
        self,
        in_channels: Sequence[int],
        dim: int = 256,
        mask_dim: int = 256,
        num_layers: int = 6,
        num_heads: int = 8,
        num_points: int = 4,
        dim_feedforward: int = 1024,
        dropout: float = 0.0,
        num_levels: int = 3,
        num_groups: int = 32,
    ) -> None:
        super().__init__()
        if len(in_channels) < num_levels:
            raise ValueError(f"{__name__}: {len(in_channels)} backbone maps, need at least num_levels={num_levels}")
        self.num_levels = num_levels
        # Positions 1..n normalised to 2 pi with temperature 10000, as the official PositionEmbeddingSine.
        self.projection = MultiScaleProjection(
            list(in_channels[-num_levels:])[::-1], dim, num_levels, num_groups, temperature=10000.0
        )
        layer = DeformableEncoderLayer(dim, num_heads, num_levels, num_points, dim_feedforward, dropout)
        self.encoder = DeformableEncoder(layer, num_layers)
        # Lateral and output convolutions, finest map last (the order they run in).
        fpn_channels = list(in_channels[: len(in_channels) - num_levels])[::-1]
        self.lateral_convs = nn.ModuleList(
            nn.Sequential(Conv2d(c, dim, 1, bias=False), nn.GroupNorm(num_groups, dim)) for c in fpn_channels
        )
        self.output_convs = nn.ModuleList(
            nn.Sequential(nn.Conv2d(dim, dim, 3, padding=1, bias=False), nn.GroupNorm(num_groups, dim), nn.ReLU())
            for _ in fpn_channels
        )
        self.mask_features = Conv2d(dim, mask_dim, 1)
        for conv in [*(s[0] for s in self.lateral_convs), *(s[0] for s in self.output_convs)]:
            nn.init.kaiming_uniform_(conv.weight, a=1)  # c2_xavier_fill, as detectron2
        nn.init.kaiming_uniform_(self.mask_features.weight, a=1)
        nn.init.zeros_(self.mask_features.bias)

    def forward(self, maps: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        coarse = list(maps[-self.num_levels :])[::-1]
        no_padding = coarse[0].new_zeros((coarse[0].shape[0], *coarse[-1].shape[-2:]), dtype=torch.bool)
        levels = self.projection(coarse, no_padding)
        memory = self.encoder(levels.tokens, levels.position, None, levels.shapes, levels.valid_ratios)
        outputs = [
            tokens.transpose(1, 2).unflatten(-1, shape)
            for tokens, shape in zip(memory.split([h * w for h, w in levels.shapes], 1), levels.shapes)
        ]
        finer = outputs[-1]
        for lateral, output, x in zip(self.lateral_convs, self.output_convs, maps[: len(maps) - self.num_levels][::-1]):
            x = lateral(x)
            finer = output(x + F.interpolate(finer, size=x.shape[-2:], mode="bilinear", align_corners=False))
        return self.mask_features(finer), outputs
