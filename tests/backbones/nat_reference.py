"""An independent Neighborhood Attention Transformer, written from the NAT/DiNAT papers and the
semantics of NATTEN <= 0.17 that SHI-Labs' released checkpoints were trained with.

Its modules carry the official key names (``patch_embed.proj.0/1``, ``levels.{i}.blocks.{j}.attn.qkv``,
``levels.{i}.downsample.reduction``, ``norm`` or ``norm{i}``, ``head``), so that its state dict *is*
an official checkpoint layout. Nothing here imports vision_tx.

Neighborhood attention, per query at ``(y, x)`` and per axis: the ``k`` neighbours are taken among
the positions of the query's dilation group (those congruent to it modulo the dilation), centred on
the query and shifted inward where the centred window would leave the map; the bias of a neighbour
is ``rpb[head, dy + k - 1, dx + k - 1]`` with ``dy, dx`` its offset from the query in dilated steps.
A map smaller than ``kernel * dilation`` along an axis is zero-padded at the bottom/right before
the ``qkv`` projection (so padded tokens carry the projection's bias) and cropped before ``proj``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def axis_neighbours(length: int, kernel_size: int, dilation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keys [length, k], bias_rows [length, k])``: each position's neighbours along one axis and the
    row of the ``2k-1`` bias table each neighbour reads. Needs ``length >= kernel_size * dilation``."""
    keys, bias_rows = [], []
    for position in range(length):
        group = list(range(position % dilation, length, dilation))  # the query's dilation group
        index = group.index(position)
        start = min(max(index - kernel_size // 2, 0), len(group) - kernel_size)
        neighbours = group[start : start + kernel_size]
        keys.append(neighbours)
        bias_rows.append([(n - position) // dilation + kernel_size - 1 for n in neighbours])
    return torch.tensor(keys), torch.tensor(bias_rows)


def neighborhood_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rpb: torch.Tensor, kernel_size: int, dilation: int
) -> torch.Tensor:
    """``softmax(q . k_n + rpb) v_n`` over each query's neighbours ``n``: ``q, k, v [B, heads, H, W, d]``
    (``q`` already scaled), ``rpb [heads, 2k-1, 2k-1]`` -> ``[B, heads, H, W, d]``."""
    height, width = q.shape[2:4]
    rows, bias_rows = axis_neighbours(height, kernel_size, dilation)
    cols, bias_cols = axis_neighbours(width, kernel_size, dilation)
    # Gather every query's k x k keys and values: [B, heads, H, W, k, k, d].
    row_index, col_index = rows[:, None, :, None], cols[None, :, None, :]
    keys, values = k[:, :, row_index, col_index], v[:, :, row_index, col_index]
    logits = torch.einsum("bnhwd,bnhwijd->bnhwij", q, keys)
    logits = logits + rpb[:, bias_rows[:, None, :, None], bias_cols[None, :, None, :]]
    weights = logits.flatten(-2).softmax(-1).view_as(logits)
    return torch.einsum("bnhwij,bnhwijd->bnhwd", weights, values)


class NeighborhoodAttention2D(nn.Module):
    """Multi-head neighborhood attention on ``[B, H, W, C]`` maps; parameters ``qkv``, ``rpb``, ``proj``."""

    def __init__(self, dim: int, num_heads: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.num_heads, self.kernel_size, self.dilation = num_heads, kernel_size, dilation
        self.qkv = nn.Linear(dim, 3 * dim)
        self.rpb = nn.Parameter(torch.zeros(num_heads, 2 * kernel_size - 1, 2 * kernel_size - 1))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, height, width, channels = x.shape
        window = self.kernel_size * self.dilation
        x = F.pad(x, (0, 0, 0, max(window - width, 0), 0, max(window - height, 0)))
        padded_height, padded_width = x.shape[1:3]
        qkv = self.qkv(x).view(batch, padded_height, padded_width, 3, self.num_heads, channels // self.num_heads)
        q, k, v = qkv.permute(3, 0, 4, 1, 2, 5)  # each [B, heads, H, W, d]
        out = neighborhood_attention(
            q * (channels // self.num_heads) ** -0.5, k, v, self.rpb, self.kernel_size, self.dilation
        )
        out = out.permute(0, 2, 3, 1, 4).reshape(batch, padded_height, padded_width, channels)
        return self.proj(out[:, :height, :width])


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class NATLayer(nn.Module):
    """Pre-norm attention and MLP residuals, scaled per channel by ``gamma1/2`` when ``layer_scale`` is set."""

    def __init__(
        self, dim: int, num_heads: int, kernel_size: int, dilation: int, mlp_ratio: float, layer_scale: float | None
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = NeighborhoodAttention2D(dim, num_heads, kernel_size, dilation)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        if layer_scale is not None:
            self.gamma1 = nn.Parameter(torch.full((dim,), layer_scale))
            self.gamma2 = nn.Parameter(torch.full((dim,), layer_scale))
        else:
            self.gamma1 = self.gamma2 = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attended = self.attn(self.norm1(x))
        x = x + (attended if self.gamma1 is None else self.gamma1 * attended)
        transformed = self.mlp(self.norm2(x))
        return x + (transformed if self.gamma2 is None else self.gamma2 * transformed)


class ConvDownsampler(nn.Module):
    """3x3 stride-2 convolution without bias to ``2C`` channels, then LayerNorm, on ``[B, H, W, C]``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.reduction = nn.Conv2d(dim, 2 * dim, 3, 2, 1, bias=False)
        self.norm = nn.LayerNorm(2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.reduction(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))


class Level(nn.Module):
    """``blocks`` then (all levels but the last) the ``downsample`` into the next level."""

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        kernel_size: int,
        dilations: Sequence[int],
        mlp_ratio: float,
        layer_scale: float | None,
        downsample: bool,
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            NATLayer(dim, num_heads, kernel_size, dilations[j], mlp_ratio, layer_scale) for j in range(depth)
        )
        self.downsample = ConvDownsampler(dim) if downsample else None


class ConvTokenizer(nn.Module):
    """Two 3x3 stride-2 convolutions (``proj.0``, ``proj.1``, nothing between them), then LayerNorm."""

    def __init__(self, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.Conv2d(3, embed_dim // 2, 3, 2, 1), nn.Conv2d(embed_dim // 2, embed_dim, 3, 2, 1))
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(images).permute(0, 2, 3, 1))


class ReferenceNAT(nn.Module):
    """NAT in the official layout. ``num_classes`` given: the classifier (``norm``, mean pool, ``head``:
    ``[N,3,H,W] -> [N,num_classes]``); otherwise the detection backbone, one ``norm{i}`` per output level:
    ``[N,3,H,W] -> [[N,C_i,H_i,W_i] for i in out_indices]``."""

    def __init__(
        self,
        embed_dim: int,
        depths: Sequence[int],
        num_heads: Sequence[int],
        mlp_ratio: float,
        kernel_size: int = 7,
        dilations: Sequence[Sequence[int]] | None = None,
        layer_scale: float | None = None,
        num_classes: int | None = None,
        out_indices: Sequence[int] = (0, 1, 2, 3),
    ) -> None:
        super().__init__()
        dilations = dilations or [[1] * depth for depth in depths]
        dims = [embed_dim * 2**i for i in range(len(depths))]
        self.patch_embed = ConvTokenizer(embed_dim)
        self.levels = nn.ModuleList(
            Level(
                dims[i], depths[i], num_heads[i], kernel_size, dilations[i], mlp_ratio, layer_scale, i < len(depths) - 1
            )
            for i in range(len(depths))
        )
        self.num_classes = num_classes
        if num_classes is not None:
            self.out_indices = [len(depths) - 1]
            self.norm = nn.LayerNorm(dims[-1])
            self.head = nn.Linear(dims[-1], num_classes)
        else:
            self.out_indices = list(out_indices)
            for i in self.out_indices:
                self.add_module(f"norm{i}", nn.LayerNorm(dims[i]))

    def forward(self, images: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        x = self.patch_embed(images)
        outputs = []
        for i, level in enumerate(self.levels):
            for block in level.blocks:
                x = block(x)
            if i in self.out_indices:
                norm = self.norm if self.num_classes is not None else getattr(self, f"norm{i}")
                outputs.append(norm(x).permute(0, 3, 1, 2))
            if level.downsample is not None:
                x = level.downsample(x)
        if self.num_classes is not None:
            return self.head(outputs[-1].mean((2, 3)))
        return outputs
