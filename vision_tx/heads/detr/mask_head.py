"""DETR's panoptic mask head (Carion et al., 2020, sec. 4.4): per-query attention maps over the
encoder output, refined into one mask per query by a small convolutional FPN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.ops.conv import Conv2d

GROUPS = 8  # GroupNorm groups in the mask head, as in DETR


class AttentionMaps(nn.Module):
    """Multi-head attention weights of each query over the image positions, without the values.

    ``forward(queries [B,Q,D], memory [B,D,h,w], padding_mask [B,h,w] bool | None) -> [B,Q,heads,h,w]``.
    As in DETR (and its checkpoints), one softmax runs over all heads and positions of a query
    jointly; padded positions get weight 0.
    """

    def __init__(self, query_dim: int, hidden_dim: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if hidden_dim % num_heads:
            raise ValueError(f"{__name__}: width {hidden_dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.scale = (hidden_dim // num_heads) ** -0.5
        self.q_proj = nn.Linear(query_dim, hidden_dim)
        self.k_proj = nn.Linear(query_dim, hidden_dim)
        self.dropout = nn.Dropout(dropout)
        for proj in (self.q_proj, self.k_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def forward(
        self, queries: torch.Tensor, memory: torch.Tensor, padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        batch, num_queries = queries.shape[:2]
        q = self.q_proj(queries).unflatten(-1, (self.num_heads, -1))  # [B,Q,M,C]
        k = self.k_proj(memory.flatten(2).transpose(1, 2)).unflatten(-1, (self.num_heads, -1))  # [B,hw,M,C]
        logits = torch.einsum("bqmc,bsmc->bqms", q * self.scale, k)
        if padding_mask is not None:
            logits = logits.masked_fill(padding_mask.flatten(1)[:, None, None, :], float("-inf"))
        weights = logits.flatten(2).softmax(-1).view(batch, num_queries, self.num_heads, *memory.shape[-2:])
        return self.dropout(weights)


def _conv_norm_relu(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.GroupNorm(GROUPS, out_channels), nn.ReLU()
    )


class MaskHead(nn.Module):
    """DETR's MaskHeadSmallConv: one mask logit map per query at stride 4.

    The input is the image's features ``[B,C,h,w]`` (stride 32) concatenated, for every query, with
    its attention maps ``[B,Q,heads,h,w]`` (``dim = C + heads`` channels). Five conv3x3 + GroupNorm(8)
    + ReLU blocks narrow it to ``dim``, ``context_dim/2``, ``/4``, ``/8``, ``/16`` channels; before
    blocks 3-5 the map is upsampled (nearest) to the next backbone map (stride 16, 8, 4, with
    ``fpn_dims`` channels) and that map, through a 1x1 adapter, is added. A last conv3x3 gives one
    channel. Layer sizes are DETR's, so the official checkpoints map one to one.
    """

    def __init__(self, dim: int, fpn_dims: list[int], context_dim: int) -> None:
        super().__init__()
        if len(fpn_dims) != 3:
            raise ValueError(f"{__name__}: fpn_dims must hold the channels at stride 16, 8 and 4, got {fpn_dims}")
        widths = [context_dim // 2, context_dim // 4, context_dim // 8, context_dim // 16]
        if dim % GROUPS or context_dim % (16 * GROUPS):
            raise ValueError(
                f"{__name__}: the head's GroupNorm({GROUPS}) layers need an input width "
                f"(DETR width + attention heads, here {dim}) divisible by {GROUPS} and a DETR width (here "
                f"{context_dim}) divisible by {16 * GROUPS}: e.g. hidden_dim 128 or 256 with 8 heads"
            )
        self.blocks = nn.ModuleList(_conv_norm_relu(a, b) for a, b in zip([dim, dim, *widths[:-1]], [dim, *widths]))
        self.adapters = nn.ModuleList(Conv2d(c, w, 1) for c, w in zip(fpn_dims, widths[:-1]))
        self.out_conv = nn.Conv2d(widths[-1], 1, 3, padding=1)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_uniform_(module.weight, a=1)
                nn.init.zeros_(module.bias)

    def forward(
        self, features: torch.Tensor, attention_maps: torch.Tensor, fpn_features: list[torch.Tensor]
    ) -> torch.Tensor:
        """``features [B,C,h,w]``, ``attention_maps [B,Q,heads,h,w]``, ``fpn_features``: backbone maps at
        stride 16, 8, 4 ``[B,fpn_dims[i],H_i,W_i]`` -> mask logits ``[B,Q,H_4,W_4]`` (size of the last one)."""
        batch, num_queries, num_heads = attention_maps.shape[:3]
        first = self.blocks[0][0]
        if features.shape[1] + num_heads != first.in_channels:
            raise ValueError(
                f"{__name__}: {features.shape[1]} feature channels + {num_heads} attention heads "
                f"!= the head's input width {first.in_channels}"
            )
        # The first conv sees the image's features once per query; it is linear, so the features'
        # share is computed once per image and broadcast over the queries.
        split = features.shape[1]
        x = F.conv2d(features, first.weight[:, :split], first.bias, padding=1)[:, None] + F.conv2d(
            attention_maps.flatten(0, 1), first.weight[:, split:], padding=1
        ).unflatten(0, (batch, num_queries))
        x = self.blocks[0][1:](x.flatten(0, 1))
        x = self.blocks[1](x)
        for adapter, block, fpn in zip(self.adapters, self.blocks[2:], fpn_features):
            fpn = adapter(fpn)
            x = F.interpolate(x, size=fpn.shape[-2:], mode="nearest").unflatten(0, (batch, num_queries))
            x = block((x + fpn[:, None]).flatten(0, 1))
        return self.out_conv(x).view(batch, num_queries, *x.shape[-2:])
