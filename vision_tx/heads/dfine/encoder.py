"""D-FINE's hybrid encoder: RT-DETR's (AIFI on the top map, then an FPN and a PAN) whose fusion blocks are GELAN
blocks (RepNCSPELAN4, after YOLOv9) and whose downsampling is a pointwise then a depthwise stride-2 conv."""

from __future__ import annotations

import torch
from torch import nn

from vision_tx.heads.rtdetr.conv import ConvNorm, CSPRepLayer
from vision_tx.heads.rtdetr.hybrid_encoder import HybridEncoder


class GELANBlock(nn.Module):
    """``[B,2*dim,h,w] -> [B,dim,h,w]``: a 1x1 conv-BN-SiLU to ``2 * dim`` channels split in two halves; the second
    half through a CSP layer (``num_blocks`` RepVGG blocks, ``hidden`` wide) and a 3x3 conv-BN-SiLU, that again
    through another pair; the two halves and both results concatenated, a 1x1 conv-BN-SiLU to ``dim``."""

    def __init__(self, dim: int, hidden: int, num_blocks: int) -> None:
        super().__init__()
        self.conv1 = ConvNorm(2 * dim, 2 * dim, 1)
        self.csp_rep1 = CSPRepLayer(dim, hidden, num_blocks)
        self.conv2 = ConvNorm(hidden, hidden, 3)
        self.csp_rep2 = CSPRepLayer(hidden, hidden, num_blocks)
        self.conv3 = ConvNorm(hidden, hidden, 3)
        self.conv4 = ConvNorm(2 * dim + 2 * hidden, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = self.conv1(x).chunk(2, 1)
        third = self.conv2(self.csp_rep1(second))
        fourth = self.conv3(self.csp_rep2(third))
        return self.conv4(torch.cat([first, second, third, fourth], 1))


class SCDown(nn.Sequential):
    """Spatial-channel decoupled downsampling: 1x1 conv-BN, then a 3x3 depthwise stride-2 conv-BN (no activations)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = ConvNorm(dim, dim, 1, activation=False)
        self.conv2 = ConvNorm(dim, dim, 3, stride=2, activation=False, groups=dim)


class GELANHybridEncoder(HybridEncoder):
    """:class:`~vision_tx.heads.rtdetr.HybridEncoder` with D-FINE's fusion: :class:`GELANBlock` (``hidden =
    round(expansion * dim // 2)``), :class:`SCDown` and lateral convs without activation."""

    @staticmethod
    def lateral_conv(dim: int) -> nn.Module:
        return ConvNorm(dim, dim, 1, activation=False)

    @staticmethod
    def fusion_block(dim: int, num_blocks: int, expansion: float) -> nn.Module:
        return GELANBlock(dim, round(expansion * dim // 2), num_blocks)

    @staticmethod
    def downsample_conv(dim: int) -> nn.Module:
        return SCDown(dim)
