"""Mask2Former's transformer decoder (Cheng et al., 2022, sec. 3.2): queries attend only inside the
foreground of their previous mask prediction, one pyramid level per layer, round-robin."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.heads.detr.mlp import MLP
from vision_tx.heads.detr.transformer import Attention
from vision_tx.heads.dino.transformer import FeedForward
from vision_tx.necks.position_encoding import SinePositionEncoding
from vision_tx.ops.conv import Conv2d


class MaskedAttentionLayer(nn.Module):
    """Masked cross-attention to one level, self-attention among the queries, FFN; post-norm after each."""

    def __init__(self, dim: int, num_heads: int, dim_feedforward: int, dropout: float) -> None:
        super().__init__()
        self.cross_attn = Attention(dim, num_heads, dropout)
        self.norm1 = nn.LayerNorm(dim)
        self.self_attn = Attention(dim, num_heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)
        self.ffn = FeedForward(dim, dim_feedforward, dropout)

    def forward(
        self,
        queries: torch.Tensor,
        query_pos: torch.Tensor,
        memory: torch.Tensor,
        memory_pos: torch.Tensor,
        attn_mask: torch.Tensor,
    ) -> torch.Tensor:
        """``queries``, ``query_pos [B,Q,D]``; ``memory``, ``memory_pos [B,S,D]``; ``attn_mask [B,Q,S]`` True where
        a query may not look -> ``[B,Q,D]``."""
        attended = self.cross_attn(queries + query_pos, memory + memory_pos, memory, attn_mask=attn_mask)
        queries = self.norm1(queries + self.dropout(attended))
        q = queries + query_pos
        queries = self.norm2(queries + self.dropout(self.self_attn(q, q, queries)))
        return self.ffn(queries)


class MaskedAttentionDecoder(nn.Module):
    """``levels`` (``[B,in_dim,h_l,w_l]``, lowest resolution first) and ``mask_features [B,mask_dim,H,W]`` ->
    ``{"pred_logits" [B,Q,C+1], "pred_masks" [B,Q,H,W], "aux_outputs": [...]}``.

    Learned query features and positions; a prediction (class logits from the normalised queries,
    masks as the dot product of a 3-layer MLP embedding with the mask features) before the first
    layer and after each. Layer ``i`` reads level ``i % num_levels`` and lets each query attend only
    where its previous mask, resized to that level, has a positive logit (everywhere where that
    foreground is empty). ``aux_outputs`` holds every prediction but the last.
    """

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        hidden_dim: int = 256,
        num_queries: int = 100,
        num_heads: int = 8,
        dim_feedforward: int = 2048,
        num_layers: int = 9,
        mask_dim: int = 256,
        num_levels: int = 3,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.num_levels = num_levels
        self.position_encoding = SinePositionEncoding(hidden_dim // 2)
        self.input_proj = nn.ModuleList(
            Conv2d(in_dim, hidden_dim, 1) if in_dim != hidden_dim else nn.Identity() for _ in range(num_levels)
        )
        self.level_embed = nn.Embedding(num_levels, hidden_dim)
        self.query_feat = nn.Embedding(num_queries, hidden_dim)
        self.query_embed = nn.Embedding(num_queries, hidden_dim)
        self.layers = nn.ModuleList(
            MaskedAttentionLayer(hidden_dim, num_heads, dim_feedforward, dropout) for _ in range(num_layers)
        )
        self.decoder_norm = nn.LayerNorm(hidden_dim)
        self.class_embed = nn.Linear(hidden_dim, num_classes + 1)
        self.mask_embed = MLP(hidden_dim, hidden_dim, mask_dim, 3)
        for layer in self.layers:
            for p in layer.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
        for proj in self.input_proj:
            if isinstance(proj, nn.Conv2d):
                nn.init.kaiming_uniform_(proj.weight, a=1)
                nn.init.zeros_(proj.bias)

    def forward(self, levels: Sequence[torch.Tensor], mask_features: torch.Tensor) -> dict:
        if len(levels) != self.num_levels:
            raise ValueError(f"{__name__}: {len(levels)} levels given, built for {self.num_levels}")
        batch = mask_features.shape[0]
        memory, memory_pos, sizes = [], [], []
        for level, (x, proj) in enumerate(zip(levels, self.input_proj)):
            sizes.append(tuple(x.shape[-2:]))
            no_padding = x.new_zeros((batch, *x.shape[-2:]), dtype=torch.bool)
            memory_pos.append(
                self.position_encoding(no_padding, torch.promote_types(x.dtype, torch.float32))
                .to(x.dtype)
                .flatten(1, 2)
            )
            memory.append(proj(x).flatten(2).transpose(1, 2) + self.level_embed.weight[level])
        query_pos = self.query_embed.weight.expand(batch, -1, -1)
        queries = self.query_feat.weight.expand(batch, -1, -1)
        predictions = [self.predict(queries, mask_features)]
        for i, layer in enumerate(self.layers):
            level = i % self.num_levels
            attn_mask = self.attention_mask(predictions[-1]["pred_masks"], sizes[level])
            queries = layer(queries, query_pos, memory[level], memory_pos[level], attn_mask)
            predictions.append(self.predict(queries, mask_features))
        return {**predictions[-1], "aux_outputs": predictions[:-1]}

    def predict(self, queries: torch.Tensor, mask_features: torch.Tensor) -> dict[str, torch.Tensor]:
        """Class logits ``[B,Q,C+1]`` and mask logits ``[B,Q,H,W]`` of ``queries [B,Q,D]``."""
        normed = self.decoder_norm(queries)
        masks = torch.einsum("bqc,bchw->bqhw", self.mask_embed(normed), mask_features)
        return {"pred_logits": self.class_embed(normed), "pred_masks": masks}

    @staticmethod
    @torch.no_grad()
    def attention_mask(masks: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """``[B,Q,h*w]`` True outside each query's foreground at ``size`` (nowhere for a query without one)."""
        blocked = F.interpolate(masks, size=size, mode="bilinear", align_corners=False).flatten(2) < 0
        return blocked & ~blocked.all(-1, keepdim=True)
