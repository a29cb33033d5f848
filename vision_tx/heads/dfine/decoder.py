"""D-FINE's decoder: RT-DETR's layers with a gate in place of the cross-attention's residual sum and deformable
attention without value and output projections (its own number of points per level), refining every box
edge's distribution layer by layer around the first layer's boxes."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.heads.detr.mlp import MLP
from vision_tx.heads.dfine.fdr import Gate, LocationQuality, distances_to_boxes, integral, weighting_function
from vision_tx.heads.dino.transformer import FeedForward, inverse_sigmoid
from vision_tx.ops import ms_deform_attn


class PointsPerLevelAttention(nn.Module):
    """Deformable attention over the levels' tokens themselves (no value or output projection), ``num_points[l]``
    samples per head on level ``l``, around boxes: offsets in units of ``offset_scale`` times the box size
    divided by the level's point count. Offsets start on a ring (head ``h`` looks in direction ``2 pi h /
    heads``, the level's point ``p`` at distance ``p + 1``); the attention starts uniform."""

    def __init__(self, dim: int, num_heads: int, num_points: Sequence[int], offset_scale: float = 0.5) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"{__name__}: dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads, self.num_points, self.offset_scale = num_heads, list(num_points), offset_scale
        total = sum(self.num_points)
        self.sampling_offsets = nn.Linear(dim, num_heads * total * 2)
        self.attention_weights = nn.Linear(dim, num_heads * total)
        self.register_buffer(
            "points_scale", torch.cat([torch.full((n,), 1.0 / n) for n in self.num_points]), persistent=False
        )
        self.register_buffer(
            "point_level",
            torch.cat([torch.full((n,), level) for level, n in enumerate(self.num_points)]),
            persistent=False,
        )
        angles = torch.arange(num_heads, dtype=torch.float32) * (2 * math.pi / num_heads)
        ring = torch.stack([angles.cos(), angles.sin()], -1)
        ring = ring / ring.abs().max(-1, keepdim=True).values
        distance = torch.cat([torch.arange(1, n + 1, dtype=torch.float32) for n in self.num_points])[:, None]
        nn.init.zeros_(self.sampling_offsets.weight)
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_((ring[:, None] * distance).flatten())

    def forward(
        self,
        query: torch.Tensor,
        reference: torch.Tensor,
        value: torch.Tensor,
        shapes: list[tuple[int, int]],
        padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``query [B,Q,D]`` (position added), ``reference [B,Q,L,4]`` boxes, ``value [B,S,D]``, ``padding_mask
        [B,S]`` (True on padding) -> ``[B,Q,D]``."""
        if padding_mask is not None:
            value = value.masked_fill(padding_mask[..., None], 0.0)
        locations, weights = self.sampling(query, reference, shapes)
        return ms_deform_attn(value.unflatten(-1, (self.num_heads, -1)), shapes, locations, weights)

    def sampling(
        self, query: torch.Tensor, reference: torch.Tensor, shapes: list[tuple[int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``locations [B,Q,heads,L,P,2]`` and ``weights [B,Q,heads,L,P]`` (``P = max(num_points)``, the missing
        points of a level weigh 0; the weights of a head sum to 1)."""
        batch, queries, _ = query.shape
        heads, total, most = self.num_heads, len(self.points_scale), max(self.num_points)
        offsets = self.sampling_offsets(query).view(batch, queries, heads, total, 2)
        weights = self.attention_weights(query).view(batch, queries, heads, total).softmax(-1)
        boxes = reference[:, :, None, self.point_level]  # [B,Q,1,total,4]
        scale = (self.points_scale * self.offset_scale).to(query.dtype)[:, None]
        locations = boxes[..., :2] + offsets * scale * boxes[..., 2:]
        if all(n == most for n in self.num_points):
            return locations.unflatten(3, (len(shapes), most)), weights.unflatten(3, (len(shapes), most))
        pad = [most - n for n in self.num_points]
        locations = torch.stack([F.pad(x, (0, 0, 0, p)) for x, p in zip(locations.split(self.num_points, 3), pad)], 3)
        weights = torch.stack([F.pad(x, (0, p)) for x, p in zip(weights.split(self.num_points, 3), pad)], 3)
        return locations, weights


class FDRDecoderLayer(nn.Module):
    """Self-attention among the queries (``attn_mask`` True where a query may not look), then
    :class:`PointsPerLevelAttention` to the levels joined to the queries by a :class:`Gate`, then the FFN."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_points: Sequence[int],
        dim_feedforward: int,
        dropout: float,
        offset_scale: float = 0.5,
    ) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attn = PointsPerLevelAttention(dim, num_heads, num_points, offset_scale)
        self.gateway = Gate(dim)
        self.dropout = nn.Dropout(dropout)
        self.ffn = FeedForward(dim, dim_feedforward, dropout)

    def forward(self, queries, query_pos, reference, memory, shapes, padding_mask, attn_mask=None) -> torch.Tensor:
        q = k = queries + query_pos
        attended = self.self_attn(q, k, queries, attn_mask=attn_mask, need_weights=False)[0]
        queries = self.norm1(queries + self.dropout(attended))
        attended = self.cross_attn(queries + query_pos, reference, memory, shapes, padding_mask)
        return self.ffn(self.gateway(queries, self.dropout(attended)))


class FDRDecoder(nn.Module):
    """``num_layers`` layers refining each box edge's distribution (fine-grained distribution refinement).

    Layer 0 gives a direct box ``b0 = sigmoid(pre_bbox_head(h_0) + inverse_sigmoid(r_0))`` around the
    initial boxes ``r_0``; its detached copy is the origin of every layer's edges. Layer ``i``'s edge logits
    are ``c_i = box_heads[i](h_i + h_{i-1}.detach()) + c_{i-1}`` (``c_{-1} = 0``, ``h_{-1} = 0``), its box the
    integral of their softmax under W(n) (:func:`~vision_tx.heads.dfine.fdr.distances_to_boxes`), the next
    layer's reference (detached); its logits ``class_heads[i](h_i)`` plus the location quality of ``c_i``.
    Query positions are ``ref_point_head`` of the reference boxes, clamped to [-10, 10]. ``up`` and
    ``reg_scale`` (W(n)'s range and curvature) are fixed buffers, as the official checkpoints store them.
    """

    def __init__(
        self,
        layer: FDRDecoderLayer,
        num_layers: int,
        dim: int,
        reg_max: int = 32,
        reg_scale: float = 4.0,
        up: float = 0.5,
        lqe_top_k: int = 4,
        lqe_hidden_dim: int = 64,
        lqe_layers: int = 2,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.ref_point_head = MLP(4, 2 * dim, dim, 2)
        self.pre_bbox_head = MLP(dim, dim, 4, 3)
        nn.init.zeros_(self.pre_bbox_head.layers[-1].weight)
        nn.init.zeros_(self.pre_bbox_head.layers[-1].bias)
        self.lqe_layers = nn.ModuleList(
            LocationQuality(reg_max, lqe_top_k, lqe_hidden_dim, lqe_layers) for _ in range(num_layers)
        )
        self.register_buffer("up", torch.tensor([up]))
        self.register_buffer("reg_scale", torch.tensor([reg_scale]))
        self.reg_max = reg_max

    def forward(
        self,
        queries: torch.Tensor,
        boxes: torch.Tensor,
        memory: torch.Tensor,
        shapes: list[tuple[int, int]],
        padding_mask: torch.Tensor,
        valid_ratios: torch.Tensor,
        class_heads: nn.ModuleList,
        box_heads: nn.ModuleList,
        attn_mask: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """``queries [B,Q,D]``, initial ``boxes [B,Q,4]`` (cxcywh, no gradient), ``memory [B,S,D]`` -> every layer's
        ``logits [L,B,Q,C]``, ``boxes [L,B,Q,4]``, ``corners [L,B,Q,4 * (reg_max + 1)]``, the edges' origin
        ``initial [B,Q,4]`` and layer 0's direct ``pre_logits [B,Q,C]`` (no quality term) and ``pre_boxes``."""
        project = weighting_function(self.reg_max, self.up, self.reg_scale)
        reference, previous_hidden, previous_corners = boxes, 0, 0
        logits, layer_boxes, layer_corners = [], [], []
        for i, (layer, class_head, box_head) in enumerate(zip(self.layers, class_heads, box_heads)):
            level_reference = reference[:, :, None] * valid_ratios.repeat(1, 1, 2)[:, None]
            query_pos = self.ref_point_head(reference).clamp(-10, 10)
            queries = layer(queries, query_pos, level_reference, memory, shapes, padding_mask, attn_mask)
            if i == 0:
                pre_boxes = (self.pre_bbox_head(queries) + inverse_sigmoid(reference)).sigmoid()
                pre_logits = class_head(queries)
                initial = pre_boxes.detach()
            corners = box_head(queries + previous_hidden) + previous_corners
            box = distances_to_boxes(initial, integral(corners, project), self.reg_scale)
            logits.append(self.lqe_layers[i](class_head(queries), corners))
            layer_boxes.append(box)
            layer_corners.append(corners)
            reference, previous_hidden, previous_corners = box.detach(), queries.detach(), corners
        return {
            "logits": torch.stack(logits),
            "boxes": torch.stack(layer_boxes),
            "corners": torch.stack(layer_corners),
            "initial": initial,
            "pre_logits": pre_logits,
            "pre_boxes": pre_boxes,
        }
