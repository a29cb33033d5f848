"""2D sine position encoding of DETR ("Attention is all you need" sines, one half per image axis)."""

from __future__ import annotations

import math

import torch
from torch import nn


class SinePositionEncoding(nn.Module):
    """Maps a padding mask ``[B,H,W]`` (True on padding) to encodings ``[B,H,W,2*num_pos_feats]``.

    Positions are counted over the valid pixels only and normalised to ``(0, scale]`` per image, so
    an image's encoding does not depend on how much padding its batch adds. Channels hold the
    ``y`` half, then the ``x`` half, each interleaving sin and cos.
    """

    def __init__(self, num_pos_feats: int = 128, temperature: float = 10000.0, scale: float = 2 * math.pi) -> None:
        super().__init__()
        self.num_pos_feats = num_pos_feats
        self.temperature = temperature
        self.scale = scale

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        valid = (~mask).float()
        y = valid.cumsum(1)
        x = valid.cumsum(2)
        eps = 1e-6
        y = y / (y[:, -1:, :] + eps) * self.scale
        x = x / (x[:, :, -1:] + eps) * self.scale
        exponent = 2 * (torch.arange(self.num_pos_feats, device=mask.device) // 2) / self.num_pos_feats
        wavelength = self.temperature**exponent
        return torch.cat([self._sin_cos(y, wavelength), self._sin_cos(x, wavelength)], dim=-1)

    @staticmethod
    def _sin_cos(position: torch.Tensor, wavelength: torch.Tensor) -> torch.Tensor:
        angles = position[..., None] / wavelength  # [B,H,W,F]; even channels take sin, odd ones cos
        return torch.stack([angles[..., 0::2].sin(), angles[..., 1::2].cos()], dim=-1).flatten(-2)
