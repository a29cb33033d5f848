"""RT-DETR's convolutional fusion blocks: conv-BN(-SiLU), the RepVGG block and the CSP layer of RepVGG blocks."""

from __future__ import annotations

import torch
from torch import nn

from vision_tx.ops.conv import Conv2d


class ConvNorm(nn.Sequential):
    """``kernel_size`` conv (no bias, "same" padding, ``groups``) at ``stride``, BatchNorm, then SiLU (or nothing)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        activation: bool = True,
        groups: int = 1,
    ) -> None:
        super().__init__()
        self.conv = Conv2d(
            in_channels, out_channels, kernel_size, stride, (kernel_size - 1) // 2, groups=groups, bias=False
        )
        self.norm = nn.BatchNorm2d(out_channels)
        self.act = nn.SiLU() if activation else nn.Identity()


class RepVGGBlock(nn.Module):
    """``silu(bn(conv3x3(x)) + bn(conv1x1(x)))`` (Ding et al., RepVGG, 2021), at training time: the two
    branches that reparameterise into one 3x3 conv for deployment."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = ConvNorm(channels, channels, 3, activation=False)
        self.conv2 = ConvNorm(channels, channels, 1, activation=False)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv1(x) + self.conv2(x))


class CSPRepLayer(nn.Module):
    """Cross-stage-partial layer ``[B,C_in,h,w] -> [B,C_out,h,w]``: two 1x1 conv-BN-SiLU branches of
    ``expansion * out_channels`` channels, ``num_blocks`` RepVGG blocks on the first, their sum
    projected to ``out_channels`` by a last 1x1 conv-BN-SiLU (none when the widths agree)."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int = 3, expansion: float = 1.0) -> None:
        super().__init__()
        hidden = int(out_channels * expansion)
        self.conv1 = ConvNorm(in_channels, hidden, 1)
        self.conv2 = ConvNorm(in_channels, hidden, 1)
        self.bottlenecks = nn.Sequential(*(RepVGGBlock(hidden) for _ in range(num_blocks)))
        self.conv3 = ConvNorm(hidden, out_channels, 1) if hidden != out_channels else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))
