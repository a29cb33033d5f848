"""DETR's attention: the CPU training path (attention weights through ``ops.dropout``) is SDPA's math."""

from __future__ import annotations

import pytest
import torch

from vision_tx import ops
from vision_tx.heads.detr.transformer import Attention, Transformer


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


def test_grad_checkpointing_gives_the_same_outputs_and_gradients() -> None:
    torch.manual_seed(0)
    plain = Transformer(
        dim=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=64, dropout=0.1
    ).train()
    with torch.no_grad():  # every parameter away from its initialisation (norm weights off 1, biases off 0)
        for p in plain.parameters():
            p.add_(0.1 * torch.randn_like(p))
    checkpointed = Transformer(
        dim=32,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=64,
        dropout=0.1,
        grad_checkpointing=True,
    ).train()
    checkpointed.load_state_dict(plain.state_dict())
    src, pos, queries = torch.randn(2, 15, 32), torch.randn(2, 15, 32), torch.randn(5, 32)
    padding = torch.zeros(2, 15, dtype=torch.bool)
    padding[1, 11:] = True
    results = []
    for model in (plain, checkpointed):
        torch.manual_seed(1)  # the same dropout draws; checkpointing must replay them in the backward pass
        hidden, memory = model(src, padding, pos, queries)
        ((hidden * torch.linspace(-1, 1, 32)).sum() + (memory * torch.linspace(1, -1, 32)).sum()).backward()
        results.append((hidden, memory, {n: p.grad for n, p in model.named_parameters()}))
    (hidden_a, memory_a, grads_a), (hidden_b, memory_b, grads_b) = results
    torch.testing.assert_close(hidden_b, hidden_a)
    torch.testing.assert_close(memory_b, memory_a)
    assert grads_a.keys() == grads_b.keys()
    for key in grads_a:
        torch.testing.assert_close(grads_b[key], grads_a[key], rtol=1e-5, atol=1e-6)
