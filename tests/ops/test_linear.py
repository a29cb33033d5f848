"""``vision_tx.ops.Linear``: nn.Linear (+ GELU) whichever kernel runs, gradients where they are asked for."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from torch import nn

from vision_tx.ops import Linear
from vision_tx.ops.linear import _ONEDNN_LINEAR, _takes_onednn


def _pair(bias: bool, activation: str | None) -> tuple[Linear, nn.Module]:
    torch.manual_seed(0)
    ours = Linear(48, 80, bias=bias, activation=activation)
    reference = nn.Linear(48, 80, bias=bias)
    reference.load_state_dict(ours.state_dict())  # same keys as nn.Linear
    return ours, nn.Sequential(reference, nn.GELU()) if activation == "gelu" else reference


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("shape", [(5, 48), (2, 3, 7, 48)])
def test_inference_equals_nn_linear(bias: bool, activation: str | None, shape: tuple[int, ...]) -> None:
    ours, reference = _pair(bias, activation)
    x = torch.randn(shape) * 3
    strided = torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]  # not contiguous
    with torch.inference_mode():
        for inputs in (x, strided):
            torch.testing.assert_close(ours(inputs), reference(inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(_ONEDNN_LINEAR is None, reason="this torch build has no oneDNN linear kernel")
def test_the_fused_kernel_runs_only_where_no_gradient_is_asked_for() -> None:
    layer = Linear(8, 4, activation="gelu")
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert _takes_onednn(x, layer)
        assert not _takes_onednn(x.double(), layer.double())
        layer.float()
    assert not _takes_onednn(x, layer)  # trainable weights: autograd path
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        assert not _takes_onednn(x, layer)
    layer.requires_grad_(False)
    assert _takes_onednn(x, layer)  # frozen layer on a constant input: nothing to differentiate
    assert not _takes_onednn(x.requires_grad_(), layer)
    assert not _takes_onednn(torch.randn(3, 8, device="meta"), layer)


@pytest.mark.parametrize("frozen", [False, True])
def test_gradients_equal_nn_linear(frozen: bool) -> None:
    ours, reference = _pair(True, "gelu")
    for module in (ours, reference):
        module.requires_grad_(not frozen)
    x = torch.randn(6, 48, requires_grad=True)
    grads = []
    for module in (ours, reference):
        out = module(x)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads.append([x.grad.clone()] + [p.grad for p in module.parameters() if p.grad is not None])
        x.grad = None
    assert len(grads[0]) == len(grads[1]) == (1 if frozen else 3)
    for ours_grad, reference_grad in zip(*grads):
        torch.testing.assert_close(ours_grad, reference_grad)


def test_autocast_and_double_keep_nn_linear_semantics() -> None:
    ours, reference = _pair(True, "gelu")
    x = torch.randn(4, 48)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        assert ours(x).dtype == reference(x).dtype == torch.bfloat16
    with torch.no_grad():
        torch.testing.assert_close(ours.double()(x.double()), reference.double()(x.double()))


def test_flop_counters_count_it_as_a_linear_layer() -> None:
    ours, reference = _pair(True, "gelu")
    x = torch.randn(2, 10, 48)
    counts = []
    for module in (ours, reference):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            module(x)
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] == 2 * 20 * 48 * 80


def test_unknown_activation_is_refused() -> None:
    with pytest.raises(ValueError, match="activation must be one of"):
        Linear(4, 4, activation="relu")
