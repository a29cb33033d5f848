"""Deformable DETR's encoder and decoder (post-norm layers), the decoder refining its boxes layer by layer."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.heads.detr.mlp import MLP
from vision_tx.heads.detr.transformer import Attention
from vision_tx.heads.dino.deformable_attention import MultiScaleDeformableAttention
from vision_tx.necks.position_encoding import sine_embedding
from vision_tx.ops.feed_forward import residual_feed_forward


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``log(x / (1 - x))`` of ``x [...]`` clamped to [0, 1], numerator and denominator at least ``eps`` ->
    ``[...]``."""
    x = x.clamp(0, 1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))


def box_sine_embedding(boxes: torch.Tensor, num_feats: int, temperature: float = 10000.0) -> torch.Tensor:
    """``boxes [..., 4]`` in [0, 1] -> ``[..., 4 * num_feats]``: a sine embedding (:func:`sine_embedding` of
    ``num_feats`` features, ``temperature`` the wavelengths' base) of each coordinate in turn."""
    return sine_embedding(boxes * (2 * math.pi), num_feats, temperature).flatten(-2)


class FeedForward(nn.Module):
    """``x + linear2(dropout(relu(linear1(x))))``, then LayerNorm: the post-norm FFN block."""

    def __init__(self, dim: int, hidden_dim: int, dropout: float) -> None:
        super().__init__()
        self.linear1 = nn.Linear(dim, hidden_dim)
        self.linear2 = nn.Linear(hidden_dim, dim)
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.dropout.p > 0:
            return self.norm(x + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(x))))))
        return self.norm(
            residual_feed_forward(x, self.linear1.weight, self.linear1.bias, self.linear2.weight, self.linear2.bias)
        )


class DeformableEncoderLayer(nn.Module):
    """Deformable self-attention over the levels' tokens, then the FFN."""

    def __init__(
        self, dim: int, num_heads: int, num_levels: int, num_points: int, dim_feedforward: int, dropout: float
    ) -> None:
        super().__init__()
        self.self_attn = MultiScaleDeformableAttention(dim, num_heads, num_levels, num_points)
        self.norm1 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)
        self.ffn = FeedForward(dim, dim_feedforward, dropout)

    def forward(self, x, position, reference, shapes, padding_mask) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.self_attn(x + position, reference, x, shapes, padding_mask)))
        return self.ffn(x)


class DeformableEncoder(nn.Module):
    """``num_layers`` encoder layers; each token's reference point is its own pixel centre."""

    def __init__(self, layer: DeformableEncoderLayer, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))

    def forward(self, tokens, position, padding_mask, shapes, valid_ratios) -> torch.Tensor:
        """``tokens``, ``position [B,S,D]``, ``padding_mask [B,S]``, ``valid_ratios [B,L,2]`` -> ``[B,S,D]``."""
        reference = self.reference_points(shapes, valid_ratios)
        for layer in self.layers:
            tokens = layer(tokens, position, reference, shapes, padding_mask)
        return tokens

    @staticmethod
    def reference_points(shapes: list[tuple[int, int]], valid_ratios: torch.Tensor) -> torch.Tensor:
        """``[B,S,L,2]``: every token's pixel centre, relative to its level's unpadded area, seen on every level."""
        points = []
        for level, (height, width) in enumerate(shapes):
            y, x = torch.meshgrid(
                torch.arange(height, dtype=valid_ratios.dtype, device=valid_ratios.device) + 0.5,
                torch.arange(width, dtype=valid_ratios.dtype, device=valid_ratios.device) + 0.5,
                indexing="ij",
            )
            ratio = valid_ratios[:, None, level]  # [B,1,2] (width, height)
            points.append(
                torch.stack(
                    [x.flatten()[None] / (ratio[..., 0] * width), y.flatten()[None] / (ratio[..., 1] * height)], -1
                )
            )
        return torch.cat(points, 1)[:, :, None] * valid_ratios[:, None]


class DeformableDecoderLayer(nn.Module):
    """Self-attention among the queries (``attn_mask`` True where a query may not look), deformable
    cross-attention to the encoder's tokens around each query's box, then the FFN."""

    def __init__(
        self, dim: int, num_heads: int, num_levels: int, num_points: int, dim_feedforward: int, dropout: float
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, num_heads, dropout)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attn = MultiScaleDeformableAttention(dim, num_heads, num_levels, num_points)
        self.norm2 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)
        self.ffn = FeedForward(dim, dim_feedforward, dropout)

    def forward(self, queries, query_pos, reference, memory, shapes, padding_mask, attn_mask=None) -> torch.Tensor:
        q = k = queries + query_pos
        attended = self.self_attn(q, k, queries, attn_mask=attn_mask)
        queries = self.norm1(queries + self.dropout(attended))
        attended = self.cross_attn(queries + query_pos, reference, memory, shapes, padding_mask)
        queries = self.norm2(queries + self.dropout(attended))
        return self.ffn(queries)


class DeformableDecoder(nn.Module):
    """``num_layers`` decoder layers with iterative box refinement.

    Layer ``i`` reads around its reference boxes ``r_i`` (no gradient) and refines them to
    ``r_{i+1} = sigmoid(bbox_embed[i](q_i) + inverse_sigmoid(r_i))``, the next layer's references. The
    layer's outputs are ``h_i = norm(q_i)`` (``final_norm``, DINO; else ``q_i``, Deformable DETR) and
    its box ``sigmoid(bbox_embed[i](h_i) + inverse_sigmoid(r_i))``; with ``look_forward_twice`` (DINO)
    that ``r_i`` keeps the gradient of layer ``i - 1``'s refinement, so layer ``i``'s box loss also
    trains layer ``i - 1``'s box head (and no earlier one). Without a fixed ``query_pos``, each
    layer's query position is ``ref_point_head`` of its reference boxes: of a sine embedding of them
    (``box_encoding="sine"``, DINO) or of the 4 coordinates themselves (``"linear"``, RT-DETR).
    ``eps`` bounds ``inverse_sigmoid`` (DINO 1e-3, Deformable DETR and RT-DETR 1e-5).
    """

    def __init__(
        self,
        layer: DeformableDecoderLayer,
        num_layers: int,
        dim: int,
        query_pos_from_boxes: bool,
        final_norm: bool = True,
        eps: float = 1e-3,
        box_encoding: str = "sine",
    ) -> None:
        super().__init__()
        if box_encoding not in ("sine", "linear"):
            raise ValueError(f"{__name__}: box_encoding must be 'sine' or 'linear', got {box_encoding!r}")
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        head = MLP(2 * dim, dim, dim, 2) if box_encoding == "sine" else MLP(4, 2 * dim, dim, 2)
        self.ref_point_head = head if query_pos_from_boxes else None
        self.box_encoding = box_encoding
        self.norm = nn.LayerNorm(dim) if final_norm else None
        self.dim = dim
        self.eps = eps

    def forward(
        self,
        queries: torch.Tensor,
        boxes: torch.Tensor,
        memory: torch.Tensor,
        shapes: list[tuple[int, int]],
        padding_mask: torch.Tensor,
        valid_ratios: torch.Tensor,
        bbox_embed: nn.ModuleList,
        query_pos: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        look_forward_twice: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``queries [B,Q,D]``, initial ``boxes [B,Q,4]`` (cxcywh in [0, 1], no gradient), the encoder's
        ``memory [B,S,D]`` -> every layer's ``hidden [L,B,Q,D]`` and ``boxes [L,B,Q,4]``."""
        hidden, predicted = [], []
        refined = boxes  # r_i, with the gradient of the refinement that made it
        for layer, box_head in zip(self.layers, bbox_embed):
            reference = refined.detach()
            level_reference = reference[:, :, None] * valid_ratios.repeat(1, 1, 2)[:, None]
            if self.ref_point_head is not None and self.box_encoding == "linear":
                query_pos = self.ref_point_head(reference)
            elif self.ref_point_head is not None:
                query_pos = self.ref_point_head(box_sine_embedding(level_reference[:, :, 0], self.dim // 2))
            queries = layer(queries, query_pos, level_reference, memory, shapes, padding_mask, attn_mask)
            delta = box_head(queries)
            output = queries if self.norm is None else self.norm(queries)
            output_delta = delta if self.norm is None else box_head(output)
            start = refined if look_forward_twice else reference
            box = (output_delta + inverse_sigmoid(start, self.eps)).sigmoid()
            same = output_delta is delta and start is reference
            refined = box if same else (delta + inverse_sigmoid(reference, self.eps)).sigmoid()
            predicted.append(box)
            hidden.append(output)
        return torch.stack(hidden), torch.stack(predicted)
