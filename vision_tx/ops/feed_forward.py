"""The residual ReLU feed-forward block ``x + linear2(relu(linear1(x)))`` with a hand-written backward.

Autograd runs this block as five kernels over the ``[tokens, hidden]`` activations (the bias copy of
``addmm``, ``relu`` into a new buffer, and in the backward ``threshold_backward`` into another), and
each new buffer of that size (Deformable DETR's encoder: 13600 x 2048 floats, 111 MB) is handed back
to the system by glibc and page-faulted in again on the next call. Here the first product runs as
oneDNN's fused linear kernel on the CPU (bias and ReLU applied while the output is in registers;
elsewhere ReLU runs in place on it), the backward masks the hidden gradient in place, and the
residual is the accumulator of the second product: the same arithmetic, with fewer passes over
memory and no extra buffer. In float32 on the CPU every other product (the second one, with its bias,
the residual added after it, and the four of the backward) runs on oneDNN too where the training
products do (not on Intel CPUs, where MKL's sgemm keeps up; on AMD ones oneDNN is about twice as fast:
see :mod:`vision_tx.ops.linear_autograd`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vision_tx.ops.linear_autograd import onednn_product, onednn_trains, onednn_weight_grad
from vision_tx.ops.onednn import _ONEDNN_DTYPES, _ONEDNN_LINEAR, onednn_linear_may_run


def residual_feed_forward(
    x: torch.Tensor, weight1: torch.Tensor, bias1: torch.Tensor, weight2: torch.Tensor, bias2: torch.Tensor
) -> torch.Tensor:
    """``x [..., D]``, ``weight1 [H, D]``, ``bias1 [H]``, ``weight2 [D, H]``, ``bias2 [D]`` ->
    ``x + relu(x @ weight1.T + bias1) @ weight2.T + bias2``, ``[..., D]``. Under autocast, which picks each
    product's dtype, the plain layers run."""
    if torch.is_autocast_enabled(x.device.type):
        return x + F.linear(F.relu(F.linear(x, weight1, bias1)), weight2, bias2)
    return _ResidualFeedForward.apply(x, weight1, bias1, weight2, bias2)


def _onednn_applies(rows: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether oneDNN's fused linear kernel computes the first product."""
    return onednn_linear_may_run(rows) and rows.dtype == weight.dtype and rows.dtype in _ONEDNN_DTYPES


class _ResidualFeedForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight1, bias1, weight2, bias2):
        rows = x.reshape(-1, x.shape[-1])
        if _onednn_applies(rows, weight1):  # bias and ReLU applied in registers: no bias copy, no ReLU pass
            hidden = _ONEDNN_LINEAR(rows, weight1, bias1, "relu", [], "")
        else:
            hidden = torch.addmm(bias1, rows, weight1.t()).relu_()
        ctx.onednn = onednn_trains(rows, weight2)
        if ctx.onednn:
            output = _ONEDNN_LINEAR(hidden, weight2, bias2, "none", [], "").add_(rows)
        else:
            output = (rows + bias2).addmm_(hidden, weight2.t())
        ctx.save_for_backward(rows, weight1, weight2, hidden)
        return output.view(x.shape)

    @staticmethod
    def backward(ctx, grad_output):
        rows, weight1, weight2, hidden = ctx.saved_tensors
        grad = grad_output.reshape(-1, grad_output.shape[-1])
        product, weight_grad = (onednn_product, onednn_weight_grad) if ctx.onednn else (torch.mm, _weight_grad)
        grad_hidden = product(grad, weight2)
        # ReLU's gradient, in place: zero where the output is zero (the input was <= 0), as threshold_backward.
        torch.ops.aten.threshold_backward.grad_input(grad_hidden, hidden, 0.0, grad_input=grad_hidden)
        grad_x = product(grad_hidden, weight1).add_(grad) if ctx.onednn else torch.addmm(grad, grad_hidden, weight1)
        return (
            grad_x.view(grad_output.shape),
            weight_grad(grad_hidden, rows),
            grad_hidden.sum(0),
            weight_grad(grad, hidden),
            grad.sum(0),
        )


def _weight_grad(grad: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return grad.t().mm(rows)
