"""A ``Conv2d`` whose 1x1 form runs on the CPU as a matrix product.

A 1x1 convolution (stride 1, no padding, no groups) is a product of the ``[C_out, C_in]`` weight with each image's
``[C_in, H*W]`` map. On the CPU, PyTorch hands it to oneDNN whenever more than one thread runs, and there, with its
layout conversions in and out of oneDNN's blocked format, it scales badly on small maps: in the main job's training
step (2-vCPU Intel Xeon, two threads, torch 2.14) the 1x1 convolutions took 39% of the time spent in convolutions,
forward and backward, for about a fifth of their arithmetic. As one batched product per layer (``torch.bmm`` on a
channels-first map, ``vision_tx.ops.linear_autograd.linear``, the linear layers' product, on a channels-last one) they
run 1.7 times as fast, forward and backward (``python tools/benchmark.py conv``). Every other case, and code being
compiled or exported (where the graph keeps its ``Conv`` node for onnxruntime's fusions), runs ``nn.Conv2d``'s own
forward. The parameters and their names are ``nn.Conv2d``'s.
"""

from __future__ import annotations

import torch
from torch import nn

from vision_tx.ops.linear_autograd import linear

_PRODUCT_DTYPES = (torch.float32, torch.float64)


class Conv2d(nn.Conv2d):
    """``nn.Conv2d``; the 1x1 form on float CPU maps (outside autocast) as one batched matrix product:
    ``[N, C_in, H, W] -> [N, C_out, H, W]`` in the input's memory format."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
