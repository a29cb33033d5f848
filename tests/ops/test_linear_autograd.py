"""``vision_tx.ops.linear_autograd``: the oneDNN training path of ``Linear`` has F.linear's (+ GELU's) gradients,
and gives way to the plain operators under autocast, other dtypes, devices, compiling and dispatch modes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from tests.conftest import unavailable
from tests.parity import perturb_
from vision_tx.ops import Linear, linear_autograd
from vision_tx.ops.linear_autograd import linear, onednn_trains
from vision_tx.ops.onednn import _ONEDNN_LINEAR, onednn_training_enabled, set_onednn_training


@pytest.fixture
def onednn_linear() -> Iterator[None]:
    """The oneDNN training path switched on, whatever this CPU's default (off on Intel CPUs)."""
    if _ONEDNN_LINEAR is None:
        unavailable("this torch build has no oneDNN linear kernel (torch.ops.mkldnn._linear_pointwise)")
    default = onednn_training_enabled()
    set_onednn_training(True)
    yield
    set_onednn_training(default)


def _fast_path_ran(out: torch.Tensor) -> bool:
    return type(out.grad_fn).__name__ == "_OneDNNLinearBackward"


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("in_out", [(48, 80), (96, 24)], ids=["wide", "narrow"])  # both weight-gradient orientations
@pytest.mark.parametrize("shape", [(5,), (2, 3, 7)])
def test_gradients_equal_float64_reference(
    onednn_linear: None, bias: bool, activation: str | None, in_out: tuple[int, int], shape: tuple[int, ...]
) -> None:
    layer = perturb_(Linear(*in_out, bias=bias, activation=activation))
    x = torch.randn(*shape, in_out[0], requires_grad=True)
    out = layer(x)
    assert _fast_path_ran(out)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x, *layer.parameters()], grad_out)
    x64 = x.detach().double().requires_grad_()
    params64 = [p.detach().double().requires_grad_() for p in layer.parameters()]
    expected = F.linear(x64, params64[0], params64[1] if bias else None)
    expected = F.gelu(expected) if activation else expected
    expected_grads = torch.autograd.grad(expected, [x64, *params64], grad_out.double())
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        assert got.shape == want.shape
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * want.abs().max().item())


def test_frozen_weights_and_constant_inputs_get_no_gradient(onednn_linear: None) -> None:
    layer = Linear(8, 4, activation="gelu")
    layer.weight.requires_grad_(False)
    x = torch.randn(3, 8, requires_grad=True)
    layer(x).sum().backward()
    assert layer.weight.grad is None and layer.bias.grad is not None and x.grad is not None
    layer.weight.requires_grad_(True)
    x = torch.randn(3, 8)
    layer(x).sum().backward()
    assert layer.weight.grad is not None


def test_other_dtypes_devices_and_autocast_take_the_plain_operators(onednn_linear: None) -> None:
    layer = Linear(8, 4, activation="gelu")
    x = torch.randn(3, 8, requires_grad=True)
    assert onednn_trains(x, layer.weight)
    assert not onednn_trains(x.double(), layer.weight.double())
    assert not onednn_trains(x.bfloat16(), layer.weight.bfloat16())
    assert not onednn_trains(torch.randn(3, 8, device="meta"), layer.weight)
    assert not onednn_trains(torch.randn(0, 8), layer.weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_trains(x, layer.weight)
        out = layer(x)
    assert out.dtype == torch.bfloat16 and not _fast_path_ran(out)
    assert not _fast_path_ran(layer.double()(x.double()))


def test_switched_off_the_plain_operators_train(onednn_linear: None) -> None:
    layer = perturb_(Linear(8, 4, activation="gelu"))
    x = torch.randn(3, 8, requires_grad=True)
    assert _fast_path_ran(layer(x))
    set_onednn_training(False)
    assert not onednn_trains(x, layer.weight)
    out = layer(x)
    assert not _fast_path_ran(out)
    torch.testing.assert_close(out, F.gelu(F.linear(x, layer.weight, layer.bias)), rtol=0, atol=0)


def test_compiling_and_dispatch_modes_see_the_aten_ops(onednn_linear: None) -> None:
    layer = Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        assert not _fast_path_ran(layer(x))
    assert counter.get_total_flops() == 2 * 3 * 8 * 4
    explanation = torch._dynamo.explain(layer)(x)
    assert explanation.graph_break_count == 0


def test_the_functional_form_on_weight_slices_gives_f_linears_gradients(onednn_linear: None) -> None:
    weight, bias = torch.randn(12, 8, requires_grad=True), torch.randn(12, requires_grad=True)
    x = torch.randn(2, 5, 8, requires_grad=True)
    results = []
    for function in (linear, F.linear):
        out = function(x, weight[4:], bias[4:])
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), (x, weight, bias))
        results.append((out, *grads))
    assert _fast_path_ran(linear(x, weight[4:], bias[4:]))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(results[0][2][:4], torch.zeros(4, 8))


def test_broadcast_gradients_reach_onednn_dense(onednn_linear: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``out.sum()`` hands the backward a stride-0 gradient; oneDNN takes such operands down a path about
    400x slower (a 256x512 -> 4608 layer: 6.3 s against 17 ms), so no product may see one."""
    strides = []

    def recording(a, weight, *args):
        strides.extend([a.stride(), weight.stride()])
        return _ONEDNN_LINEAR(a, weight, *args)

    monkeypatch.setattr(linear_autograd, "_ONEDNN_LINEAR", recording)
    layer = perturb_(Linear(16, 24))
    x = torch.randn(2, 5, 16, requires_grad=True)
    out = layer(x)
    assert _fast_path_ran(out)
    out.sum().backward()
    assert len(strides) == 6  # the forward, the input gradient, the weight gradient
    assert all(0 not in s for s in strides), strides
    expected = torch.autograd.grad(
        F.linear(x.double(), layer.weight.double(), layer.bias.double()).sum(), [x, layer.weight]
    )
    torch.testing.assert_close(x.grad, expected[0].float())
    torch.testing.assert_close(layer.weight.grad, expected[1].float())
