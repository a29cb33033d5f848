"""``vision_tx.ops.Linear``: nn.Linear (+ GELU) whichever kernel runs, gradients where they are asked for."""

from __future__ import annotations

import copy as copy_module
import pickle

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tests.conftest import unavailable
from vision_tx.ops import Linear, set_weight_packing
from vision_tx.ops.linear import _ONEDNN_DTYPES, _ONEDNN_LINEAR, _PACKED, _onednn_dtype


@pytest.fixture
def onednn_linear() -> None:
    """The fused oneDNN linear kernel that ``Linear`` uses at inference: without it the test fails
    under CI and skips elsewhere."""
    if _ONEDNN_LINEAR is None:
        unavailable("this torch build has no oneDNN linear kernel (torch.ops.mkldnn._linear_pointwise)")


def _pair(bias: bool, activation: str | None) -> tuple[Linear, nn.Module]:
    torch.manual_seed(0)
    ours = Linear(48, 80, bias=bias, activation=activation)
    reference = nn.Linear(48, 80, bias=bias)
    reference.load_state_dict(ours.state_dict())  # same keys as nn.Linear
    return ours, nn.Sequential(reference, nn.GELU()) if activation == "gelu" else reference


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("shape", [(5, 48), (2, 3, 7, 48), (2100, 48)])
@pytest.mark.parametrize("eval_mode", [False, True], ids=["train-mode", "eval-mode"])  # eval: packed weight
def test_inference_equals_nn_linear(
    bias: bool, activation: str | None, shape: tuple[int, ...], eval_mode: bool
) -> None:
    ours, reference = _pair(bias, activation)
    ours.train(not eval_mode)
    x = torch.randn(shape) * 3
    strided = torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]  # not contiguous
    with torch.inference_mode():
        for inputs in (x, strided):
            torch.testing.assert_close(ours(inputs), reference(inputs), rtol=1e-5, atol=1e-5)


def test_the_fused_kernel_runs_only_where_no_gradient_is_asked_for(onednn_linear: None) -> None:
    layer = Linear(8, 4, activation="gelu")
    x = torch.randn(3, 8)
    bf16 = torch.bfloat16 if torch.bfloat16 in _ONEDNN_DTYPES else None
    with torch.no_grad():
        assert _onednn_dtype(x, layer) == torch.float32
        assert _onednn_dtype(x.double(), layer.double()) is None
        assert _onednn_dtype(x.bfloat16(), layer.bfloat16()) == bf16
        assert _onednn_dtype(x, layer) is None  # input and weight dtypes differ: F.linear's error
        layer.float()
    assert _onednn_dtype(x, layer) is None  # trainable weights: autograd path
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert _onednn_dtype(x, layer) == _onednn_dtype(x.bfloat16(), layer) == bf16
        with torch.autocast("cpu", dtype=torch.float16):
            assert _onednn_dtype(x, layer) is None
    layer.requires_grad_(False)
    assert _onednn_dtype(x, layer) == torch.float32  # frozen layer on a constant input: nothing to differentiate
    assert _onednn_dtype(x.requires_grad_(), layer) is None
    assert _onednn_dtype(torch.randn(3, 8, device="meta"), layer) is None


@pytest.mark.parametrize("eval_mode", [False, True], ids=["train-mode", "eval-mode"])
@pytest.mark.parametrize("bf16_model", [False, True], ids=["autocast", "bf16-weights"])
def test_bf16_inference_equals_nn_linear(eval_mode: bool, bf16_model: bool) -> None:
    ours, reference = _pair(True, "gelu")
    ours.train(not eval_mode)
    if bf16_model:
        ours.bfloat16(), reference.bfloat16()
    x = torch.randn(300, 48)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=not bf16_model):
        inputs = x.bfloat16() if bf16_model else x
        actual, expected = ours(inputs), reference(inputs)
    assert actual.dtype == expected.dtype == torch.bfloat16
    exact = nn.functional.gelu(x.double() @ ours.weight.double().T + ours.bias.double())
    # oneDNN applies GELU before rounding to bf16, F.linear after: both within bf16's rounding of the exact value
    for result in (actual, expected):
        torch.testing.assert_close(result.double(), exact, rtol=2**-7, atol=0.02)


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


def test_the_packed_weight_follows_every_change_of_the_weight(onednn_linear: None) -> None:
    ours, reference = _pair(True, "gelu")
    ours.eval()
    x = torch.randn(9, 48)

    def check() -> None:
        with torch.inference_mode():
            torch.testing.assert_close(ours(x), reference(x), rtol=1e-5, atol=1e-5)

    check()
    assert ours in _PACKED
    with torch.no_grad():  # in place, as optimizers and EMA updates do
        ours.weight.mul_(-2)
        reference[0].weight.mul_(-2)
    check()
    new = {"weight": torch.randn(80, 48), "bias": torch.randn(80)}
    ours.load_state_dict(new)
    reference[0].load_state_dict(new)
    check()
    ours.weight.data = torch.randn(80, 48)  # a new tensor under the same parameter
    reference[0].weight.data = ours.weight.data.clone()
    check()
    ours.train()
    assert ours not in _PACKED
    copy = pickle.loads(pickle.dumps(ours.eval()))  # the side table never travels with the layer
    ours(x)
    deep = copy_module.deepcopy(ours)
    with torch.inference_mode():
        torch.testing.assert_close(copy(x), reference(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(deep(x), reference(x), rtol=1e-5, atol=1e-5)


def test_a_layer_built_in_inference_mode_runs_in_eval_mode() -> None:
    x = torch.randn(4, 48)
    with torch.inference_mode():
        ours = Linear(48, 80, activation="gelu").eval()  # inference tensors: no version counter
        torch.testing.assert_close(ours(x), nn.functional.gelu(nn.functional.linear(x, ours.weight, ours.bias)))
    assert ours not in _PACKED


def test_weight_packing_can_be_turned_off() -> None:
    ours, reference = _pair(False, None)
    ours.eval()
    try:
        set_weight_packing(False)
        with torch.inference_mode():
            torch.testing.assert_close(ours(torch.ones(3, 48)), reference(torch.ones(3, 48)))
        assert ours not in _PACKED
    finally:
        set_weight_packing(True)


def test_unknown_activation_is_refused() -> None:
    with pytest.raises(ValueError, match="activation must be one of"):
        Linear(4, 4, activation="relu")
