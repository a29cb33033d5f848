"""A ``Conv2d`` whose 1x1 form runs on the CPU as a matrix product, and whose depthwise form takes its weight gradient
from a C++ kernel.

A 1x1 convolution (stride 1, no padding, no groups) is a product of the ``[C_out, C_in]`` weight with each image's
``[C_in, H*W]`` map. On the CPU, PyTorch hands it to oneDNN whenever more than one thread runs, and there, with its
layout conversions in and out of oneDNN's blocked format, it scales badly on small maps: in the main job's training
step (2-vCPU Intel Xeon, two threads, torch 2.14) the 1x1 convolutions took 39% of the time spent in convolutions,
forward and backward, for about a fifth of their arithmetic. As one batched product per layer (``torch.bmm`` on a
channels-first map, ``vision_tx.ops.linear_autograd.linear``, the linear layers' product, on a channels-last one) they
run 1.7 times as fast, forward and backward (``python tools/benchmark.py conv``). Every other case, and code being
compiled or exported (where the graph keeps its ``Conv`` node for onnxruntime's fusions), runs ``nn.Conv2d``'s own
forward.

A depthwise convolution (one filter a channel, stride 1: ConvNeXt's 7x7) on a channels-last float CPU map that needs
gradients runs the convolution and its input gradient as ``nn.Conv2d`` does, but its weight gradient in a C++ kernel
(``vision_tx/ops/csrc/depthwise_conv_cpu.cpp``, see :mod:`vision_tx.ops.cpu_kernels`): oneDNN's took 5 ms of a 7x7
convolution's 5.6 ms backward on the main job's largest map, the kernel 1 ms (``python tools/benchmark.py conv``).
Without the kernel, and for every other form, ``nn.Conv2d`` runs. The parameters and their names are ``nn.Conv2d``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from vision_tx.ops.cpu_kernels import cpu_kernels, kernel_inputs
from vision_tx.ops.linear_autograd import linear

_PRODUCT_DTYPES = (torch.float32, torch.float64)


class Conv2d(nn.Conv2d):
    """``nn.Conv2d``; the 1x1 form on float CPU maps (outside autocast) as one batched matrix product:
    ``[N, C_in, H, W] -> [N, C_out, H, W]`` in the input's memory format."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._depthwise_kernel_runs(x):
            return _DepthwiseConv2d.apply(x, self.weight, self.bias, self.padding)
        if not self._runs_as_product(x):
            return super().forward(x)
        batch, channels, height, width = x.shape
        weight = self.weight.reshape(self.out_channels, channels)
        if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
            return linear(x.permute(0, 2, 3, 1), weight, self.bias).permute(0, 3, 1, 2)
        weights = weight.expand(batch, -1, -1)  # one product per image, the weight's gradient summed over them
        if self.bias is None:
            product = torch.bmm(weights, x.reshape(batch, channels, height * width))
        else:
            product = torch.baddbmm(self.bias[None, :, None], weights, x.reshape(batch, channels, height * width))
        return product.view(batch, self.out_channels, height, width)

    def _runs_as_product(self, x: torch.Tensor) -> bool:
        return (
            self.kernel_size == (1, 1)
            and self.stride == (1, 1)
            and self.padding in ((0, 0), "valid")
            and self.groups == 1
            and x.dim() == 4
            and x.device.type == "cpu"
            and x.dtype in _PRODUCT_DTYPES
            and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling()
            and (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last))
        )

    def _depthwise_kernel_runs(self, x: torch.Tensor) -> bool:
        return (
            self.groups == self.in_channels == self.out_channels
            and self.stride == (1, 1)
            and self.dilation == (1, 1)
            and isinstance(self.padding, tuple)
            and self.padding_mode == "zeros"
            and x.dim() == 4
            and x.permute(0, 2, 3, 1).is_contiguous()  # channels-last
            and torch.is_grad_enabled()
            and self.weight.requires_grad
            and not torch.is_autocast_enabled("cpu")
            and kernel_inputs(x, *[p for p in (self.weight, self.bias) if p is not None])
            and cpu_kernels() is not None
        )


class _DepthwiseConv2d(torch.autograd.Function):
    """A stride-1 depthwise convolution of a channels-last map: ``F.conv2d`` forward, the input's and bias's gradients
    by ``convolution_backward``, the weight's by the C++ kernel."""

    @staticmethod
    def forward(
        ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: tuple[int, int]
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.padding, ctx.has_bias = padding, bias is not None
        return F.conv2d(x, weight, bias, padding=padding, groups=weight.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        x, weight = ctx.saved_tensors
        channels = weight.shape[0]
        grad_input = grad_bias = None
        if ctx.needs_input_grad[0]:  # the input's gradient alone: oneDNN's with the bias's took 8x as long
            grad_input = torch.ops.aten.convolution_backward(
                grad_output,
                x,
                weight,
                None,
                [1, 1],
                list(ctx.padding),
                [1, 1],
                False,
                [0, 0],
                channels,
                [True, False, False],
            )[0]
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum((0, 2, 3))
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = cpu_kernels().depthwise_conv2d_weight_grad(
                x.permute(0, 2, 3, 1), grad_output.permute(0, 2, 3, 1), *weight.shape[2:], *ctx.padding
            )
        return grad_input, grad_weight, grad_bias, None
