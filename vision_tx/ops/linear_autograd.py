"""A linear layer (optionally followed by exact GELU) for CPU training, every product run by oneDNN.

On the AMD EPYC CPUs this project was first developed on, PyTorch's float32 ``mm``/``addmm`` (MKL's sgemm)
reach 30-50 GFLOP/s per core on the tall, narrow matrices of vision transformers, where oneDNN's
``linear_pointwise`` kernel (AVX-512) reaches 80-115 (Swin-T's shapes, one thread): the forward
product with its bias, the input gradient ``grad @ W`` and the weight gradient ``grad^T @ x``, each
taken as a "linear" of transposed views, in the orientation that measured faster. The same
arithmetic as ``F.linear`` and ``F.gelu``; sums in another order, so results agree to float rounding.
On Intel CPUs MKL runs its own AVX-512 kernels and is as fast or faster (``rtdetr_convnext_toy``'s
training step 7% faster without this path on an Intel Xeon), so there the plain operators run:
:func:`vision_tx.ops.onednn.set_onednn_training` says which.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vision_tx.ops.onednn import _ONEDNN_LINEAR, onednn_linear_may_run, onednn_training_enabled


def onednn_trains(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`onednn_linear_with_grad` may compute ``x @ weight.T`` (``x [..., in]``, ``weight [out, in]``)
    with a gradient: float32 CPU tensors outside autocast (which picks its own dtype), compiling and dispatch modes,
    with some rows, where the training products run on oneDNN (:func:`vision_tx.ops.onednn.onednn_training_enabled`)."""
    return (
        onednn_training_enabled()
        and onednn_linear_may_run(x)
        and type(weight) in (torch.Tensor, torch.nn.Parameter)
        and weight.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and x.numel() > 0
    )


def onednn_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of ``a [M, K]`` and ``b [K, N]`` -> ``[M, N]`` by oneDNN (strided views taken as they are, except
    broadcast ones: a stride-0 operand, such as the gradient of ``out.sum()``, sends oneDNN down a path about 400x
    slower)."""
    a, b = (t.contiguous() if 0 in t.stride() else t for t in (a, b))
    return _ONEDNN_LINEAR(a, b.t(), None, "none", [], "")


def onednn_weight_grad(grad: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``grad^T @ rows`` of ``grad [T, out]`` and ``rows [T, in]`` -> ``[out, in]``, computed with the shorter side as
    the output's rows (measured up to 2x faster than the other orientation), transposed back as a view where needed."""
    if grad.shape[1] <= rows.shape[1]:
        return onednn_product(grad.t(), rows)
    return onednn_product(rows.t(), grad).t()


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, gelu):
        rows = x.reshape(-1, x.shape[-1])
        out = _ONEDNN_LINEAR(rows, weight, bias, "none", [], "")
        ctx.gelu = gelu
        ctx.save_for_backward(rows, weight, out if gelu else None)
        if gelu:
            out = F.gelu(out)
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_output):
        rows, weight, pre = ctx.saved_tensors
        grad = grad_output.reshape(-1, grad_output.shape[-1])
        if ctx.gelu:
            grad = torch.ops.aten.gelu_backward(grad, pre)
        grad_x = (
            onednn_product(grad, weight).view(*grad_output.shape[:-1], weight.shape[1])
            if ctx.needs_input_grad[0]
            else None
        )
        grad_weight = onednn_weight_grad(grad, rows) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, None


def onednn_linear_with_grad(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gelu: bool = False
) -> torch.Tensor:
    """``x @ weight.T + bias`` of ``x [..., in]``, ``weight [out, in]`` and ``bias [out]`` (or None), then exact GELU
    if ``gelu``: ``[..., out]``, with a backward of oneDNN products. Only where :func:`onednn_trains` holds."""
    return _OneDNNLinear.apply(x, weight, bias, gelu)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gelu: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` of ``x [..., in]``, ``weight [out, in]``, ``bias [out]`` or None (then exact GELU
    if ``gelu``) -> ``[..., out]``, through :func:`onednn_linear_with_grad` where a gradient is asked for and
    :func:`onednn_trains` holds."""
    if torch.is_grad_enabled() and onednn_trains(x, weight):
        return onednn_linear_with_grad(x, weight, bias, gelu)
    x = F.linear(x, weight, bias)
    return F.gelu(x) if gelu else x
