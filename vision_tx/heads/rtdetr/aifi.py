"""RT-DETR's attention-based intra-scale feature interaction (AIFI): transformer encoder layers over the
tokens of one map, with a fixed 2-D sine-cosine position embedding."""

from __future__ import annotations

import copy

import torch
from torch import nn

from vision_tx.ops import Linear


def sincos_position_embedding(
    height: int,
    width: int,
    dim: int,
    temperature: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
) -> torch.Tensor:
    """``[h*w, dim]`` (row-major tokens of a ``height`` x ``width`` map, ``dim`` a multiple of 4) of ``dtype`` on
    ``device``: ``[sin(y w_k) | cos(y w_k) | sin(x w_k) | cos(x w_k)]`` with ``w_k = temperature ** (-k / (dim / 4))``
    (``temperature`` the wavelengths' base), ``x``, ``y`` the integer column and row."""
    if dim % 4:
        raise ValueError(f"{__name__}: the embedding width {dim} is not divisible by 4")
    omega = temperature ** -(torch.arange(dim // 4, dtype=torch.float64, device=device) / (dim // 4))
    y, x = torch.meshgrid(
        torch.arange(height, dtype=torch.float64, device=device),
        torch.arange(width, dtype=torch.float64, device=device),
        indexing="ij",
    )
    out_y, out_x = y.flatten()[:, None] * omega, x.flatten()[:, None] * omega
    return torch.cat([out_y.sin(), out_y.cos(), out_x.sin(), out_x.cos()], 1).to(dtype)


class AIFILayer(nn.Module):
    """Post-norm transformer encoder layer: ``norm1(x + attn(x + pos, x + pos, x))``, then
    ``norm2(x + linear2(gelu(linear1(x))))``."""

    def __init__(self, dim: int, num_heads: int, dim_feedforward: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.linear1 = Linear(dim, dim_feedforward, activation="gelu")
        self.linear2 = Linear(dim_feedforward, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, position: torch.Tensor, padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [B,S,D]``, ``position [1 or B,S,D]``, ``padding_mask [B,S]`` True on padding -> ``[B,S,D]``."""
        q = k = x + position
        x = self.norm1(x + self.dropout(self.self_attn(q, k, x, key_padding_mask=padding_mask, need_weights=False)[0]))
        return self.norm2(x + self.dropout(self.linear2(self.dropout(self.linear1(x)))))


class AIFI(nn.Module):
    """``num_layers`` :class:`AIFILayer` over a map ``[B,D,h,w] -> [B,D,h,w]``."""

    def __init__(self, layer: AIFILayer, num_layers: int, temperature: float = 10000.0) -> None:
        super().__init__()
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.temperature = temperature

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``padding_mask [B,h,w]`` True on padding: those tokens are not attended to."""
        batch, dim, height, width = x.shape
        position = sincos_position_embedding(height, width, dim, self.temperature, x.dtype, x.device)[None]
        tokens = x.flatten(2).transpose(1, 2)
        # Skipping a mask without padding needs its values on the host: taken on the CPU only (on a GPU the read would
        # wait for the device and keep the step out of a CUDA graph), and never in export (a data-dependent branch).
        on_host = padding_mask is not None and padding_mask.device.type == "cpu" and not torch.compiler.is_exporting()
        shortcut = padding_mask is None or (on_host and not padding_mask.any())
        flat_mask = None if shortcut else padding_mask.flatten(1)
        for layer in self.layers:
            tokens = layer(tokens, position, flat_mask)
        return tokens.transpose(1, 2).reshape(batch, dim, height, width)
