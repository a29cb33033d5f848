"""UperNet decode head (Xiao et al., 2018): a pyramid pooling module on the last stage feeding an FPN.

Module names follow mmsegmentation's ``UPerHead`` (``psp_modules``, ``bottleneck``,
``lateral_convs``, ``fpn_convs``, ``fpn_bottleneck``; each block holds ``conv`` and ``bn``), so
its checkpoints' head weights load by name except the classifier (mmseg's ``conv_seg``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.heads.fcn import ConvBNReLU, init_classifier
from vision_tx.ops.conv import Conv2d
from vision_tx.ops.resize_concat_conv import resize_concat_conv2d


class PyramidPooling(nn.ModuleList):
    """PSPNet's pyramid pooling: average pools to ``s x s`` for each scale, then 1x1 conv-BN-ReLU.

    ``[B, C, H, W] -> list of [B, channels, s, s]``, one per scale; PSPNet upsamples them back to
    ``H x W`` before concatenating, which :class:`UperNetHead` folds into its bottleneck convolution.
    """

    def __init__(self, in_channels: int, channels: int, pool_scales: Sequence[int]) -> None:
        super().__init__(
            nn.Sequential(nn.AdaptiveAvgPool2d(scale), ConvBNReLU(in_channels, channels, 1)) for scale in pool_scales
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [stage(x) for stage in self]


class UperNetHead(nn.Module):
    """Multi-level features ``[B, C_i, H_i, W_i]`` (finest first) -> logits ``[B, num_classes, H_0, W_0]``.

    The last level goes through pyramid pooling (its input and the pooled maps concatenated, then a
    3x3 conv-BN-ReLU); the other levels through 1x1 lateral convs. A top-down pass adds each coarser
    map, upsampled, to the next finer one; 3x3 convs smooth every level but the top; all levels are
    upsampled to the finest, concatenated and fused by a 3x3 conv, then dropout and a 1x1 classifier.
    Every conv is conv-BN-ReLU with ``channels`` outputs.
    """

    def __init__(
        self,
        in_channels: Sequence[int],
        num_classes: int,
        channels: int = 512,
        pool_scales: Sequence[int] = (1, 2, 3, 6),
        dropout: float = 0.1,
        align_corners: bool = False,
    ) -> None:
        super().__init__()
        self.align_corners = align_corners
        self.psp_modules = PyramidPooling(in_channels[-1], channels, pool_scales)
        self.bottleneck = ConvBNReLU(in_channels[-1] + len(pool_scales) * channels, channels, 3)
        self.lateral_convs = nn.ModuleList(ConvBNReLU(c, channels, 1) for c in in_channels[:-1])
        self.fpn_convs = nn.ModuleList(ConvBNReLU(channels, channels, 3) for _ in in_channels[:-1])
        self.fpn_bottleneck = ConvBNReLU(len(in_channels) * channels, channels, 3)
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = Conv2d(channels, num_classes, 1)
        init_classifier(self.classifier)

    def _resize(self, x: torch.Tensor, size: torch.Size) -> torch.Tensor:
        return F.interpolate(x, size, mode="bilinear", align_corners=self.align_corners)

    def _fuse(self, block: ConvBNReLU, maps: list[torch.Tensor]) -> torch.Tensor:
        """``block(cat(maps resized to the first's size))``, without building the concatenation."""
        fused = resize_concat_conv2d(maps, block.conv.weight, maps[0].shape[-2:], self.align_corners)
        return block.act(block.bn(fused))

    def forward(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        top = features[-1]
        laterals = [conv(f) for conv, f in zip(self.lateral_convs, features)]
        laterals.append(self._fuse(self.bottleneck, [top, *self.psp_modules(top)]))
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + self._resize(laterals[i], laterals[i - 1].shape[-2:])
        outputs = [conv(x) for conv, x in zip(self.fpn_convs, laterals)] + [laterals[-1]]
        return self.classifier(self.dropout(self._fuse(self.fpn_bottleneck, outputs)))
