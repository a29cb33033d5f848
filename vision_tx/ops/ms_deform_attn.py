"""Multi-scale deformable attention (Zhu et al., Deformable DETR, 2021), in pure PyTorch.

Each query reads ``points`` bilinearly sampled values per head and per level of a feature pyramid
and sums them with its attention weights. Sampling follows ``grid_sample`` with
``align_corners=False`` and zeros outside the map: location (0, 0) is the top-left corner of the
top-left pixel, (1, 1) the bottom-right corner of the bottom-right one.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def level_shapes(spatial_shapes: torch.Tensor | Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """The levels' ``(height, width)`` as Python ints, from a list or an int tensor ``[L, 2]``."""
    if isinstance(spatial_shapes, torch.Tensor):
        spatial_shapes = spatial_shapes.tolist()
    return [(int(h), int(w)) for h, w in spatial_shapes]


def ms_deform_attn(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor | Sequence[Sequence[int]],
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> torch.Tensor:
    """Multi-scale deformable attention.

    ``value [B, S, heads, head_dim]``: the levels' tokens concatenated, highest resolution first
    (``S = sum(h * w)``); ``spatial_shapes``: the levels' ``(h, w)``;
    ``sampling_locations [B, Q, heads, L, P, 2]``: (x, y) in [0, 1];
    ``attention_weights [B, Q, heads, L, P]`` -> ``[B, Q, heads * head_dim]``.
    """
    shapes = level_shapes(spatial_shapes)
    batch, tokens, heads, head_dim = value.shape
    _, queries, _, levels, points, _ = sampling_locations.shape
    if sum(h * w for h, w in shapes) != tokens or len(shapes) != levels:
        raise ValueError(
            f"vision_tx/ops/ms_deform_attn.py: value has {tokens} tokens over {levels} levels, "
            f"spatial_shapes {shapes} give {sum(h * w for h, w in shapes)} over {len(shapes)}"
        )
    # One grid_sample per level over (batch x heads) images of head_dim channels.
    value_levels = value.split([h * w for h, w in shapes], dim=1)
    grids = sampling_locations.mul(2).sub(1).transpose(1, 2).flatten(0, 1)  # [B*heads, Q, L, P, 2]
    sampled = []
    for level, (height, width) in enumerate(shapes):
        level_value = value_levels[level].permute(0, 2, 3, 1).reshape(batch * heads, head_dim, height, width)
        sampled.append(
            F.grid_sample(level_value, grids[:, :, level], mode="bilinear", padding_mode="zeros", align_corners=False)
        )  # [B*heads, head_dim, Q, P]
    weights = attention_weights.transpose(1, 2).reshape(batch * heads, 1, queries, levels * points)
    output = (torch.cat(sampled, dim=-1) * weights.to(value.dtype)).sum(-1)  # [B*heads, head_dim, Q]
    return output.view(batch, heads * head_dim, queries).transpose(1, 2)
