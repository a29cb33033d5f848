"""DETR's encoder-decoder transformer: post-norm layers with position encodings added to q and k.

Tensors are batch-first: image tokens ``[B,S,D]`` (``S = H*W``), object queries ``[B,Q,D]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from vision_tx import ops
from vision_tx.ops.linear_autograd import linear


class Attention(nn.Module):
    """Multi-head attention on ``[B,L,D]`` tensors through ``F.scaled_dot_product_attention``.

    Parameters are laid out as in ``nn.MultiheadAttention`` (``in_proj_weight [3D,D]`` = q, k, v
    rows, ``out_proj``). When ``query is key`` (self-attention with positions added to both), q and
    k come from one matrix product.
    """

    def __init__(self, dim: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"{__name__}: width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.dropout = dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = ops.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``query [B,Lq,D]``, ``key``/``value [B,Lk,D]``, ``key_padding_mask [B,Lk]`` and ``attn_mask [B,Lq,Lk]``
        or ``[Lq,Lk]`` (every image's) (True: ignore) -> ``[B,Lq,D]``."""
        dim = query.shape[-1]
        w, b = self.in_proj_weight, self.in_proj_bias
        if query is key:
            q, k = linear(query, w[: 2 * dim], b[: 2 * dim]).chunk(2, dim=-1)
        else:
            q = linear(query, w[:dim], b[:dim])
            k = linear(key, w[dim : 2 * dim], b[dim : 2 * dim])
        v = linear(value, w[2 * dim :], b[2 * dim :])
        q, k, v = (t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2) for t in (q, k, v))
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        if attn_mask is not None:
            allowed = ~(attn_mask if attn_mask.dim() == 2 else attn_mask[:, None])
            mask = allowed if mask is None else mask & allowed
        p = self.dropout if self.training else 0.0
        if p and q.device.type == "cpu":  # SDPA's CPU path with dropout, with the faster mask of ops.dropout
            scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            out = ops.dropout(scores.softmax(-1), p) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out_proj(out.transpose(1, 2).flatten(2))


class EncoderLayer(nn.Module):
    """Self-attention over image tokens, then a ReLU FFN; each followed by residual + LayerNorm."""

    def __init__(self, dim: int, num_heads: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = Attention(dim, num_heads, dropout)
        self.linear1 = ops.Linear(dim, dim_feedforward)
        self.linear2 = ops.Linear(dim_feedforward, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.dropout = ops.Dropout(dropout)

    def forward(self, src: torch.Tensor, pos: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        q = src + pos
        src = self.norm1(src + self.dropout(self.self_attn(q, q, src, padding_mask)))
        return self.norm2(src + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(src))))))


class DecoderLayer(nn.Module):
    """Query self-attention, cross-attention to the image tokens, ReLU FFN; post-norm after each."""

    def __init__(self, dim: int, num_heads: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = Attention(dim, num_heads, dropout)
        self.cross_attn = Attention(dim, num_heads, dropout)
        self.linear1 = ops.Linear(dim, dim_feedforward)
        self.linear2 = ops.Linear(dim_feedforward, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.dropout = ops.Dropout(dropout)

    def forward(
        self,
        tgt: torch.Tensor,
        query_pos: torch.Tensor,
        memory: torch.Tensor,
        memory_with_pos: torch.Tensor,
        padding_mask: torch.Tensor,
    ) -> torch.Tensor:
        q = tgt + query_pos
        tgt = self.norm1(tgt + self.dropout(self.self_attn(q, q, tgt)))
        attended = self.cross_attn(tgt + query_pos, memory_with_pos, memory, padding_mask)
        tgt = self.norm2(tgt + self.dropout(attended))
        return self.norm3(tgt + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(tgt))))))


def run_layer(layer: nn.Module, checkpointed: bool, *args: torch.Tensor) -> torch.Tensor:
    """``layer(*args)``; with ``checkpointed`` (and gradients on) its activations are recomputed in the
    backward pass instead of stored (the random state is replayed, so dropout draws the same masks)."""
    if checkpointed and torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(layer, *args, use_reentrant=False)
    return layer(*args)


class TransformerEncoder(nn.Module):
    def __init__(self, num_layers: int, dim: int, num_heads: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__()
        self.grad_checkpointing = False
        self.layers = nn.ModuleList(EncoderLayer(dim, num_heads, dim_feedforward, dropout) for _ in range(num_layers))

    def forward(self, src: torch.Tensor, pos: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            src = run_layer(layer, self.grad_checkpointing, src, pos, padding_mask)
        return src


class TransformerDecoder(nn.Module):
    """Decoder layers plus the shared final LayerNorm, applied to every layer's output."""

    def __init__(self, num_layers: int, dim: int, num_heads: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__()
        self.grad_checkpointing = False
        self.layers = nn.ModuleList(DecoderLayer(dim, num_heads, dim_feedforward, dropout) for _ in range(num_layers))
        self.norm = nn.LayerNorm(dim)

    def forward(
        self, query_pos: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, padding_mask: torch.Tensor
    ) -> torch.Tensor:
        tgt = torch.zeros_like(query_pos)
        memory_with_pos = memory + pos
        outputs = []
        for layer in self.layers:
            tgt = run_layer(layer, self.grad_checkpointing, tgt, query_pos, memory, memory_with_pos, padding_mask)
            outputs.append(tgt)
        return self.norm(torch.stack(outputs))


class Transformer(nn.Module):
    """Encoder over image tokens, decoder over learned object queries.

    ``forward(src [B,S,D], padding_mask [B,S] True on padding, pos [B,S,D], query_embed [Q,D])``
    returns every decoder layer's normalised output ``[num_decoder_layers,B,Q,D]`` (the last one is
    the prediction, the others feed the auxiliary losses) and the encoder's output ``[B,S,D]``.
    ``grad_checkpointing`` recomputes each layer's activations in the backward pass instead of storing
    them (the encoder's attention maps hold most of them: ~0.7 GB per 800x1200 image in training).
    """

    def __init__(
        self,
        dim: int = 256,
        num_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.encoder = TransformerEncoder(num_encoder_layers, dim, num_heads, dim_feedforward, dropout)
        self.decoder = TransformerDecoder(num_decoder_layers, dim, num_heads, dim_feedforward, dropout)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        self.set_grad_checkpointing(grad_checkpointing)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recomputes each encoder and decoder layer's activations in the backward pass (less memory, same results)."""
        self.encoder.grad_checkpointing = self.decoder.grad_checkpointing = enable

    def forward(
        self, src: torch.Tensor, padding_mask: torch.Tensor, pos: torch.Tensor, query_embed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        memory = self.encoder(src, pos, padding_mask)
        query_pos = query_embed.unsqueeze(0).expand(src.shape[0], -1, -1)
        return self.decoder(query_pos, memory, pos, padding_mask), memory
