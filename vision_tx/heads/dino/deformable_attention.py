"""The multi-scale deformable attention module (Zhu et al., Deformable DETR, 2021): each query samples a
few points per head and level around its reference point or box, with offsets and weights it predicts."""

from __future__ import annotations

import math

import torch
from torch import nn

from vision_tx.ops import Linear, ms_deform_attn


class MultiScaleDeformableAttention(nn.Module):
    """``num_heads`` heads of ``dim // num_heads`` channels, ``num_points`` samples per head and level.

    Offsets start on a ring around the reference (head ``h`` looks in direction ``2 pi h / heads``,
    point ``p`` at distance ``p + 1``) and the attention is uniform, as in the paper.
    """

    def __init__(self, dim: int = 256, num_heads: int = 8, num_levels: int = 4, num_points: int = 4) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"{__name__}: dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads, self.num_levels, self.num_points = num_heads, num_levels, num_points
        self.sampling_offsets = Linear(dim, num_heads * num_levels * num_points * 2)
        self.attention_weights = Linear(dim, num_heads * num_levels * num_points)
        self.value_proj = Linear(dim, dim)
        self.output_proj = Linear(dim, dim)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        nn.init.zeros_(self.sampling_offsets.weight)
        angles = torch.arange(self.num_heads, dtype=torch.float32) * (2 * math.pi / self.num_heads)
        ring = torch.stack([angles.cos(), angles.sin()], -1)
        ring = ring / ring.abs().max(-1, keepdim=True).values
        distance = torch.arange(1, self.num_points + 1, dtype=torch.float32)[:, None]
        grid = ring[:, None, None, :] * distance  # [heads, 1, points, 2]
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.expand(-1, self.num_levels, -1, -1).flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for projection in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(projection.weight)
            nn.init.zeros_(projection.bias)

    def forward(
        self,
        query: torch.Tensor,
        reference: torch.Tensor,
        value: torch.Tensor,
        shapes: list[tuple[int, int]],
        padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``query [B,Q,D]`` (position already added), ``reference`` as in :meth:`sampling`; ``value [B,S,D]``
        the levels' tokens; ``padding_mask [B,S]`` True on padding -> ``[B,Q,D]``."""
        value = self.value_proj(value)
        if padding_mask is not None:
            value = value.masked_fill(padding_mask[..., None], 0.0)
        value = value.unflatten(-1, (self.num_heads, -1))
        locations, weights = self.sampling(query, reference, shapes)
        return self.output_proj(ms_deform_attn(value, shapes, locations, weights))

    def sampling(
        self, query: torch.Tensor, reference: torch.Tensor, shapes: list[tuple[int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Where each query reads and with what weight: ``locations [B,Q,heads,L,P,2]`` (x, y normalised
        per level) and ``weights [B,Q,heads,L,P]`` (summing to 1 over levels and points of a head), for
        ``query [B,Q,D]`` and ``reference [B,Q,L,2]`` points (x, y) or ``[B,Q,L,4]`` boxes (cx, cy, w, h),
        normalised per level.

        Around a point, offsets are in pixels of each level; around a box, in units of half its
        size divided by ``num_points``.
        """
        batch, queries, _ = query.shape
        heads, levels, points = self.num_heads, self.num_levels, self.num_points
        offsets = self.sampling_offsets(query).view(batch, queries, heads, levels, points, 2)
        logits = self.attention_weights(query).view(batch, queries, heads, levels * points)
        # softmax written out: torch.softmax over a last dimension this short (12 in the main job) runs 2.4x slower
        # forward and backward on the CPU
        exps = (logits - logits.detach().amax(-1, keepdim=True)).exp()
        weights = (exps / exps.sum(-1, keepdim=True)).view(batch, queries, heads, levels, points)
        if reference.shape[-1] == 2:
            size = torch.tensor([[w, h] for h, w in shapes], dtype=query.dtype, device=query.device)
            locations = reference[:, :, None, :, None, :] + offsets / size[:, None, :]
        elif reference.shape[-1] == 4:
            half_size = reference[:, :, None, :, None, 2:] * (0.5 / points)  # [B,Q,1,L,1,2], before the broadcast
            locations = torch.addcmul(reference[:, :, None, :, None, :2], offsets, half_size)
        else:
            raise ValueError(f"{__name__}: reference must end in 2 or 4 coordinates, got {reference.shape[-1]}")
        return locations, weights
