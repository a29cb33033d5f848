"""``vision_tx.ops.conv.Conv2d``: its 1x1 form, run as a matrix product on the CPU, gives ``F.conv2d``'s output and
gradients in float64 on channels-first and channels-last maps, with and without a bias; its depthwise form, whose
weight gradient the C++ kernel computes, gives ``F.conv2d``'s gradients (any channel count, kernel, padding, maps
smaller than the kernel), the same bits on any number of threads; every other form, and code being exported, runs
``nn.Conv2d``'s own convolution."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import unavailable
from vision_tx.ops import conv as conv_module
from vision_tx.ops.conv import Conv2d
from vision_tx.ops.cpu_kernels import cpu_kernels


def _layer_and_input(
    in_channels: int, out_channels: int, bias: bool, channels_last: bool, **conv_kwargs
) -> tuple[Conv2d, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    conv = Conv2d(in_channels, out_channels, bias=bias, **{"kernel_size": 1, **conv_kwargs}).double()
    with torch.no_grad():  # away from the initialisation: every weight and the bias a random value
        for parameter in conv.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64))
    x = torch.randn(3, in_channels, 5, 7, generator=generator, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return conv, x.requires_grad_()


def _output_and_gradients(conv: nn.Conv2d, x: torch.Tensor, forward) -> list[torch.Tensor]:
    out = forward(x)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    return [out, *torch.autograd.grad(out, [x, *conv.parameters()], grad)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("channels_last", [False, True], ids=["channels_first", "channels_last"])
@pytest.mark.parametrize("in_out", [(6, 4), (4, 9)])
def test_pointwise_form_gives_conv2d_output_and_gradients(
    bias: bool, channels_last: bool, in_out: tuple[int, int]
) -> None:
    conv, x = _layer_and_input(*in_out, bias=bias, channels_last=channels_last)
    assert conv._runs_as_product(x)
    got = _output_and_gradients(conv, x, conv)
    expected = _output_and_gradients(conv, x, lambda t: F.conv2d(t, conv.weight, conv.bias))
    for name, a, b in zip(["output", "input gradient", "weight gradient", "bias gradient"], got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)
    assert got[0].is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


@pytest.mark.parametrize(
    "conv_kwargs",
    [dict(kernel_size=3, padding=1), dict(stride=2), dict(groups=2), dict(padding=1)],
    ids=["3x3", "stride_2", "groups", "padded"],
)
def test_other_forms_run_the_convolution(conv_kwargs: dict) -> None:
    conv, x = _layer_and_input(4, 6, bias=True, channels_last=False, **conv_kwargs)
    assert not conv._runs_as_product(x)
    torch.testing.assert_close(conv(x), nn.Conv2d.forward(conv, x), rtol=0, atol=0)


def test_strided_inputs_and_autocast_run_the_convolution() -> None:
    conv, x = _layer_and_input(4, 6, bias=True, channels_last=False)
    assert not conv._runs_as_product(x[:, :, :, ::2])  # neither channels-first nor channels-last in memory
    with torch.autocast("cpu", torch.bfloat16):
        assert not conv._runs_as_product(x.float())


def test_state_dict_is_nn_conv2d_s() -> None:
    ours, plain = Conv2d(4, 6, 1), nn.Conv2d(4, 6, 1)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in plain.state_dict().items()}
    plain.load_state_dict(ours.state_dict())


def test_export_keeps_the_convolution_node() -> None:
    conv, x = _layer_and_input(4, 6, bias=True, channels_last=False)
    program = torch.export.export(conv.float(), (x.detach().float(),))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert any("conv2d" in target for target in targets) and not any("bmm" in target for target in targets)


class _CountingKernels:
    """The built kernels, counting the depthwise weight gradients they compute."""

    def __init__(self, kernels) -> None:
        self.kernels, self.calls = kernels, 0

    def depthwise_conv2d_weight_grad(self, *args):
        self.calls += 1
        return self.kernels.depthwise_conv2d_weight_grad(*args)


@pytest.fixture
def counting_kernels(monkeypatch: pytest.MonkeyPatch) -> _CountingKernels:
    kernels = cpu_kernels()
    if kernels is None:
        unavailable("the C++ CPU kernels did not build (see the warning)")
    counting = _CountingKernels(kernels)
    monkeypatch.setattr(conv_module, "cpu_kernels", lambda: counting)
    return counting


def _depthwise(channels: int, kernel_size: int, padding: int, bias: bool, size: tuple[int, int], dtype=torch.float64):
    """A depthwise layer with every parameter random and a channels-last input of ``size`` that needs its gradient."""
    generator = torch.Generator().manual_seed(0)
    conv = Conv2d(channels, channels, kernel_size, padding=padding, groups=channels, bias=bias).to(dtype)
    with torch.no_grad():
        for parameter in conv.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=dtype))
    x = torch.randn(2, channels, *size, generator=generator, dtype=dtype)
    return conv, x.contiguous(memory_format=torch.channels_last).requires_grad_()


@pytest.mark.parametrize(
    "channels, kernel_size, padding, size",
    [(32, 7, 3, (11, 9)), (20, 7, 3, (5, 9)), (3, 7, 3, (2, 2)), (17, 3, 0, (6, 7)), (33, 5, 1, (8, 5))],
    ids=["convnext", "channels_past_a_block", "map_smaller_than_kernel", "unpadded", "padding_below_half"],
)
@pytest.mark.parametrize("bias", [True, False])
def test_depthwise_form_gives_conv2d_gradients(
    counting_kernels: _CountingKernels, channels: int, kernel_size: int, padding: int, size: tuple, bias: bool
) -> None:
    conv, x = _depthwise(channels, kernel_size, padding, bias, size)
    assert conv._depthwise_kernel_runs(x)
    got = _output_and_gradients(conv, x, conv)
    expected = _output_and_gradients(
        conv, x, lambda t: F.conv2d(t, conv.weight, conv.bias, padding=padding, groups=channels)
    )
    for name, a, b in zip(["output", "input gradient", "weight gradient", "bias gradient"], got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)
    assert counting_kernels.calls == 1


def test_depthwise_float32_weight_gradient_is_close_and_the_same_on_any_thread_count(
    counting_kernels: _CountingKernels,
) -> None:
    """float32 against float64 autograd; partial sums fixed by the map, not the threads: bit for bit on 1 and 2."""
    conv, x = _depthwise(48, 7, 3, True, (23, 17), dtype=torch.float32)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    grad = grad.contiguous(memory_format=torch.channels_last)
    threads = torch.get_num_threads()
    weight_grads = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            weight_grads.append(torch.autograd.grad(conv(x), conv.weight, grad)[0])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(weight_grads[0], weight_grads[1])
    reference = conv.double()
    out = F.conv2d(x.double(), reference.weight, reference.bias, padding=3, groups=48)
    expected = torch.autograd.grad(out, reference.weight, grad.double())[0]
    torch.testing.assert_close(weight_grads[0].double(), expected, rtol=1e-5, atol=1e-4)
    assert counting_kernels.calls == 2


def test_depthwise_kernel_only_where_it_applies(counting_kernels: _CountingKernels) -> None:
    """Channels-first maps, strides, depth multipliers, inference, frozen weights and autocast run ``nn.Conv2d``."""
    conv, x = _depthwise(8, 7, 3, True, (9, 9))
    assert conv._depthwise_kernel_runs(x)
    assert not conv._depthwise_kernel_runs(x.contiguous())
    with torch.no_grad():
        assert not conv._depthwise_kernel_runs(x)
    strided = Conv2d(8, 8, 7, stride=2, padding=3, groups=8).double()
    multiplied = Conv2d(8, 16, 7, padding=3, groups=8).double()
    assert not strided._depthwise_kernel_runs(x) and not multiplied._depthwise_kernel_runs(x)
    with torch.autocast("cpu", torch.bfloat16):
        assert not conv._depthwise_kernel_runs(x)
    conv.weight.requires_grad_(False)
    assert not conv._depthwise_kernel_runs(x)
    torch.testing.assert_close(conv(x), F.conv2d(x, conv.weight, conv.bias, padding=3, groups=8), rtol=0, atol=0)
    assert counting_kernels.calls == 0
