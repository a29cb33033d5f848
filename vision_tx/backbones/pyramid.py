"""The simple feature pyramid of ViTDet (Li et al., 2022, https://arxiv.org/abs/2203.16527).

A plain ViT has one stride-16 map; each pyramid level resamples it on its own (two 2x2 transposed
convolutions to stride 4, one to stride 8, none at 16, 2x2 max pooling to 32) and projects it to
``out_channels`` with a 1x1 and a 3x3 convolution, each followed by a channel LayerNorm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.ops.conv import Conv2d

PYRAMID_STRIDES = (4, 8, 16, 32)  # of a stride-16 input: levels 0..3


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of ``[N, C, H, W]`` maps."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps).permute(
            0, 3, 1, 2
        )


class PyramidLevel(nn.Module):
    """One level: ``[N, dim, h, w]`` at stride 16 -> ``[N, out_channels, ceil(H/s), ceil(W/s)]`` at stride ``s``."""

    def __init__(self, dim: int, stride: int, out_channels: int) -> None:
        super().__init__()
        if stride not in PYRAMID_STRIDES:
            raise ValueError(f"{__name__}: stride must be one of {PYRAMID_STRIDES}, got {stride}")
        self.stride = stride
        if stride == 4:
            layers: list[nn.Module] = [
                nn.ConvTranspose2d(dim, dim // 2, 2, stride=2),
                LayerNorm2d(dim // 2, eps=1e-6),
                nn.GELU(),
                nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2),
            ]
            channels = dim // 4
        elif stride == 8:
            layers, channels = [nn.ConvTranspose2d(dim, dim // 2, 2, stride=2)], dim // 2
        elif stride == 16:
            layers, channels = [], dim
        else:
            layers, channels = [nn.MaxPool2d(2, ceil_mode=True)], dim
        self.resample = nn.Sequential(*layers)
        self.project = nn.Sequential(
            Conv2d(channels, out_channels, 1, bias=False),
            LayerNorm2d(out_channels, eps=1e-6),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            LayerNorm2d(out_channels, eps=1e-6),
        )

    def forward(self, x: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """``x [N, dim, ceil(H/16), ceil(W/16)]`` of an ``image_size = (H, W)`` image."""
        x = self.resample(x)
        # The transposed convolutions reach 4*ceil(H/16) rows where the contract is ceil(H/4).
        x = x[..., : -(-image_size[0] // self.stride), : -(-image_size[1] // self.stride)]
        return self.project(x)
