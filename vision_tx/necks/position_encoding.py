"""2D sine position encoding of DETR ("Attention is all you need" sines, one half per image axis)."""

from __future__ import annotations

import math

import torch
from torch import nn


class SinePositionEncoding(nn.Module):
    """Maps a padding mask ``[B,H,W]`` (True on padding) to encodings ``[B,H,W,2*num_pos_feats]``.

    Positions are counted over the valid pixels only and normalised to ``(0, scale]`` per image, so
    an image's encoding does not depend on how much padding its batch adds. Channels hold the
    ``y`` half, then the ``x`` half, each interleaving sin and cos. ``offset`` is added to the
    positions (1..n) before normalising: DETR and DINO use 0, Deformable DETR -0.5 (pixel centres).
    """

    def __init__(
        self, num_pos_feats: int = 128, temperature: float = 10000.0, scale: float = 2 * math.pi, offset: float = 0.0
    ) -> None:
        super().__init__()
        self.num_pos_feats = num_pos_feats
        self.temperature = temperature
        self.scale = scale
        self.offset = offset

    def forward(self, mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        valid = (~mask).to(dtype)
        y = valid.cumsum(1)
        x = valid.cumsum(2)
        eps = 1e-6
        y = (y + self.offset) / (y[:, -1:, :] + eps) * self.scale
        x = (x + self.offset) / (x[:, :, -1:] + eps) * self.scale
        return torch.cat(
            [
                sine_embedding(y, self.num_pos_feats, self.temperature),
                sine_embedding(x, self.num_pos_feats, self.temperature),
            ],
            dim=-1,
        )


def sine_embedding(position: torch.Tensor, num_feats: int, temperature: float = 10000.0) -> torch.Tensor:
    """``position [...]`` (already scaled, e.g. to [0, 2 pi]) -> ``[..., num_feats]``: channel ``i`` of the
    ``num_feats`` holds ``sin`` (even ``i``) or ``cos`` (odd ``i``) of ``position / temperature ** (2 * (i // 2) /
    num_feats)``, ``temperature`` the wavelengths' base."""
    exponent = (torch.arange(num_feats, device=position.device) // 2).to(position.dtype) * 2 / num_feats
    angles = position[..., None] / temperature**exponent
    return torch.stack([angles[..., 0::2].sin(), angles[..., 1::2].cos()], dim=-1).flatten(-2)
