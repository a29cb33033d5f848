"""``vision_tx.ops.conv.Conv2d``: its 1x1 form, run as a matrix product on the CPU, gives ``F.conv2d``'s output and
gradients in float64 on channels-first and channels-last maps, with and without a bias; every other form, and code
being exported, runs ``nn.Conv2d``'s own convolution."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.ops.conv import Conv2d


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
