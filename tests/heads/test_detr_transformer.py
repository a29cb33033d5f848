"""DETR's attention: the CPU training path (attention weights through ``ops.dropout``) is SDPA's math."""

from __future__ import annotations

import pytest
import torch

from vision_tx import ops
from vision_tx.heads.detr.transformer import Attention


def test_cpu_training_attention_is_sdpa_with_the_ops_dropout(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    attention = Attention(32, num_heads=4, dropout=0.1)
    query, key = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, 4:] = True
    expected = attention.eval()(query, key, key, padding)  # F.scaled_dot_product_attention, no dropout

    calls = []

    def record(weights: torch.Tensor, p: float) -> torch.Tensor:
        calls.append((tuple(weights.shape), p, weights[1, :, :, 4:].abs().max().item()))
        return weights

    monkeypatch.setattr(ops, "dropout", record)
    torch.testing.assert_close(attention.train()(query, key, key, padding), expected)
    assert calls == [((2, 4, 5, 7), 0.1, 0.0)]  # weights of every head, none on the padding
