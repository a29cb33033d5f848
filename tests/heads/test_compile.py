"""DETR's and DINO's transformer layers compile to one graph (no graph break) in training, dropout
and the deformable attention's backward included."""

from __future__ import annotations

import torch

from tests.compiling import graph_breaks, summed
from vision_tx.heads.detr.transformer import Transformer
from vision_tx.heads.dino.transformer import DeformableDecoderLayer, DeformableEncoderLayer

SHAPES = [(4, 5), (2, 3)]  # two levels: 26 tokens
TOKENS = sum(h * w for h, w in SHAPES)


def test_detr_transformer_compiles_without_graph_break() -> None:
    transformer = Transformer(
        32, 4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=64, dropout=0.1
    ).train()
    src = torch.randn(2, 20, 32, requires_grad=True)
    padding = torch.zeros(2, 20, dtype=torch.bool)
    padding[1, 15:] = True
    assert (
        graph_breaks(lambda x: summed(transformer(x, padding, torch.randn(2, 20, 32), torch.randn(5, 32))), src) == []
    )


def test_dino_encoder_layer_compiles_without_graph_break() -> None:
    layer = DeformableEncoderLayer(32, 4, len(SHAPES), 2, 64, 0.1).train()
    tokens = torch.randn(2, TOKENS, 32, requires_grad=True)
    reference = torch.rand(2, TOKENS, len(SHAPES), 2)
    padding = torch.zeros(2, TOKENS, dtype=torch.bool)
    assert graph_breaks(lambda x: layer(x, torch.randn_like(x), reference, SHAPES, padding).sum(), tokens) == []


def test_dino_decoder_layer_compiles_without_graph_break() -> None:
    layer = DeformableDecoderLayer(32, 4, len(SHAPES), 2, 64, 0.1).train()
    queries = torch.randn(2, 7, 32, requires_grad=True)
    memory = torch.randn(2, TOKENS, 32, requires_grad=True)
    boxes = torch.rand(2, 7, len(SHAPES), 4)
    attn_mask = torch.zeros(7, 7, dtype=torch.bool)
    attn_mask[:3, 3:] = True  # denoising queries hidden from the matching ones
    padding = torch.zeros(2, TOKENS, dtype=torch.bool)
    assert (
        graph_breaks(
            lambda q, m: layer(q, torch.randn_like(q), boxes, m, SHAPES, padding, attn_mask).sum(), queries, memory
        )
        == []
    )
