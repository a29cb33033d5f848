"""RT-DETR's efficient hybrid encoder (Zhao et al., 2024): attention within the top level only (AIFI),
then convolutional cross-scale fusion (CCFM): a top-down FPN and a bottom-up PAN of CSP-RepVGG blocks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.heads.rtdetr.aifi import AIFI, AIFILayer
from vision_tx.heads.rtdetr.conv import ConvNorm, CSPRepLayer
from vision_tx.ops.conv import Conv2d


class HybridEncoder(nn.Module):
    """Backbone maps ``in_channels`` (strides 8, 16, 32: highest resolution first) -> as many maps of
    ``dim`` channels at the same strides.

    Each map is projected by a 1x1 conv + BatchNorm; ``num_encoder_layers`` transformer layers run on
    the top (lowest-resolution) map; the FPN then walks down (1x1 lateral conv of the upper map,
    nearest 2x upsampling, concatenation with the lower map, CSP layer) and the PAN back up (3x3
    stride-2 conv, concatenation with the FPN's map, CSP layer). ``expansion`` and ``num_blocks`` set the
    CSP layers' width and depth (RT-DETR-R50: 1.0 and 3).
    """

    def __init__(
        self,
        in_channels: Sequence[int],
        dim: int = 256,
        num_heads: int = 8,
        dim_feedforward: int = 1024,
        dropout: float = 0.0,
        num_encoder_layers: int = 1,
        temperature: float = 10000.0,
        expansion: float = 1.0,
        num_blocks: int = 3,
    ) -> None:
        super().__init__()
        self.input_proj = nn.ModuleList(
            nn.Sequential(Conv2d(c, dim, 1, bias=False), nn.BatchNorm2d(dim)) for c in in_channels
        )
        self.encoder = AIFI(AIFILayer(dim, num_heads, dim_feedforward, dropout), num_encoder_layers, temperature)
        fusions = len(in_channels) - 1
        self.lateral_convs = nn.ModuleList(self.lateral_conv(dim) for _ in range(fusions))
        self.fpn_blocks = nn.ModuleList(self.fusion_block(dim, num_blocks, expansion) for _ in range(fusions))
        self.downsample_convs = nn.ModuleList(self.downsample_conv(dim) for _ in range(fusions))
        self.pan_blocks = nn.ModuleList(self.fusion_block(dim, num_blocks, expansion) for _ in range(fusions))

    @staticmethod
    def lateral_conv(dim: int) -> nn.Module:
        """The FPN's 1x1 conv of the upper map: conv-BN-SiLU."""
        return ConvNorm(dim, dim, 1)

    @staticmethod
    def fusion_block(dim: int, num_blocks: int, expansion: float) -> nn.Module:
        """``[B,2*dim,h,w] -> [B,dim,h,w]``, the FPN's and PAN's fusion of two concatenated maps: a CSP layer."""
        return CSPRepLayer(2 * dim, dim, num_blocks, expansion)

    @staticmethod
    def downsample_conv(dim: int) -> nn.Module:
        """The PAN's stride-2 conv: 3x3 conv-BN-SiLU."""
        return ConvNorm(dim, dim, 3, stride=2)

    def forward(self, maps: Sequence[torch.Tensor], pixel_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """``maps``: ``[B,C_i,h_i,w_i]``; ``pixel_mask [B,H,W]`` True on padding (hidden from the attention)
        -> ``[B,dim,h_i,w_i]`` each."""
        if len(maps) != len(self.input_proj):
            raise ValueError(f"{__name__}: {len(maps)} backbone maps given, built for {len(self.input_proj)}")
        projected = [projection(x) for projection, x in zip(self.input_proj, maps)]
        top_mask = (
            None
            if pixel_mask is None
            else F.interpolate(pixel_mask[None].float(), size=projected[-1].shape[-2:])[0].bool()
        )
        projected[-1] = self.encoder(projected[-1], top_mask)
        # Top-down: each lateral conv's output replaces the upper map among the FPN's outputs.
        fpn = [projected[-1]]
        for index, (lateral, block) in enumerate(zip(self.lateral_convs, self.fpn_blocks)):
            upper = fpn[0] = lateral(fpn[0])
            lower = projected[-2 - index]
            fpn.insert(0, block(torch.cat([F.interpolate(upper, size=lower.shape[-2:], mode="nearest"), lower], 1)))
        # Bottom-up.
        outputs = [fpn[0]]
        for index, (downsample, block) in enumerate(zip(self.downsample_convs, self.pan_blocks)):
            outputs.append(block(torch.cat([downsample(outputs[-1]), fpn[index + 1]], 1)))
        return outputs
