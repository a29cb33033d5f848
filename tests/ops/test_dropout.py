"""``vision_tx.ops.dropout``: drop rate, scaling, gradients and seeding of the CPU mask."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vision_tx.ops import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_rate_and_scale(p: float) -> None:
    torch.manual_seed(0)
    n = 1_000_003  # not a multiple of the four flips per draw
    out = dropout(torch.ones(n), p)
    dropped = (out == 0).double().mean().item()
    assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / n)  # five standard deviations
    kept = out[out != 0]
    threshold = round(p * 65536)
    assert torch.all(kept == 65536 / (65536 - threshold))  # the exact inverse keep probability


def test_every_16_bit_slot_of_a_draw_is_used_evenly() -> None:
    torch.manual_seed(1)
    out = dropout(torch.ones(400_000, 4), 0.5)
    rates = (out == 0).double().mean(0)
    assert torch.all((rates - 0.5).abs() < 5 * math.sqrt(0.25 / 400_000)), rates


def test_gradient_is_the_mask_times_the_scale() -> None:
    torch.manual_seed(2)
    x = torch.randn(3, 5, 7, requires_grad=True)
    out = dropout(x, 0.3)
    out.backward(torch.ones_like(out))
    scale = 65536 / (65536 - round(0.3 * 65536))
    torch.testing.assert_close(x.grad, (out != 0).float() * scale)
    torch.testing.assert_close(out, x.detach() * x.grad)


def test_seeded_identity_and_edge_cases() -> None:
    x = torch.randn(64, 33).t()  # not contiguous
    torch.manual_seed(3)
    first = dropout(x, 0.2)
    torch.manual_seed(3)
    assert torch.equal(first, dropout(x, 0.2))
    assert dropout(x, 0.2, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.count_nonzero(dropout(x, 1.0)) == 0
    assert dropout(x.bfloat16(), 0.2).dtype == torch.bfloat16
    module = Dropout(0.2).eval()
    assert module(x) is x
    module.train()
    torch.manual_seed(3)
    assert torch.equal(module(x), first)


def test_other_devices_use_torch_dropout(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(F, "dropout", lambda x, p, training: calls.append((x.device.type, p)) or x)
    dropout(torch.randn(4, 4, device="meta"), 0.2)
    dropout(torch.randn(4, 4), 0.2)
    assert calls == [("meta", 0.2)]
