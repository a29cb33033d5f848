"""A linear layer that, in CPU inference, runs as one oneDNN kernel with its bias and activation.

``F.linear`` on the CPU copies the bias into the output and then accumulates the product onto it,
and GELU is one more pass over the result: for the narrow, tall matrices of vision transformers
(tens of thousands of tokens by 96-768 channels) these memory passes cost as much as the product.
oneDNN's ``linear_pointwise`` kernel (one that ``torch.compile``'s CPU backend emits) applies bias and
activation while the output is still in registers. It has no backward, so it is taken only where
no gradient is asked for, in float32 or bfloat16 (plain or under CPU bf16 autocast, whose casts it
applies itself). With a gradient, float32 CPU tensors outside autocast take
:func:`vision_tx.ops.linear_autograd.onednn_linear_with_grad` (every product of forward and backward by
oneDNN) where the training products run on oneDNN (not on Intel CPUs:
:func:`vision_tx.ops.onednn.set_onednn_training`); every other case uses ``F.linear``.

The kernel also takes its weight pre-arranged in oneDNN's blocked layout (and, for bf16, converted);
given the plain fp32 matrix it converts and re-arranges it on every call, a pass over weights that are
cold in cache by the time a 28M-parameter model comes back to them (Swin-T, batch 8: 5-8% of the
fp32 forward, 13% under bf16 autocast). So each layer keeps the arranged copy while in ``eval()`` mode,
rebuilt when the weight or bias changes (an in-place update bumps its version; a ``.data`` swap moves
its address) and dropped by ``train()``. That costs one more copy of the weights in inference (half
of one in bf16); ``set_weight_packing(False)`` turns it off.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from vision_tx.ops.linear_autograd import linear
from vision_tx.ops.onednn import _ONEDNN_DTYPES, _ONEDNN_LINEAR, onednn_linear_may_run

_ACTIVATIONS = {None: ("none", ""), "gelu": ("gelu", "none")}  # oneDNN's name and GELU's approximation
INFERENCE_ROWS_HINT = 2048  # rows per call that the packed layout is tuned for; any count works
_PACK_WEIGHTS = True
# layer -> {dtype: (what the copy was made from, packed weight, bias)}: a side table, so that copying
# and pickling layers never meet oneDNN's opaque tensors.
_PACKED: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def set_weight_packing(enabled: bool) -> None:
    """Whether (``enabled``) :class:`Linear` layers in ``eval()`` mode keep a oneDNN-arranged copy of their weight
    for CPU inference (faster; one more copy of the weights in memory). On by default."""
    global _PACK_WEIGHTS
    _PACK_WEIGHTS = enabled
    if not enabled:
        _PACKED.clear()


def _onednn_dtype(x: torch.Tensor, layer: nn.Linear) -> torch.dtype | None:
    """The dtype the oneDNN kernel would compute ``layer(x)`` in, or None where ``F.linear`` must run."""
    if not (
        onednn_linear_may_run(x)
        and layer.weight.device.type == "cpu"
        and not (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in layer.parameters())))
    ):
        return None
    if torch.is_autocast_enabled("cpu"):  # autocast runs linear layers in its dtype
        dtype = torch.get_autocast_dtype("cpu")
        floats = (torch.float32, torch.bfloat16)
        return dtype if dtype in _ONEDNN_DTYPES and x.dtype in floats and layer.weight.dtype in floats else None
    return x.dtype if x.dtype == layer.weight.dtype and x.dtype in _ONEDNN_DTYPES else None


class Linear(nn.Linear):
    """``nn.Linear`` followed by an optional ``activation`` (``None`` or ``"gelu"``, the exact erf form).

    ``[..., in_features] -> [..., out_features]``; same parameters and state-dict keys as
    ``nn.Linear``, same results up to float rounding whichever kernel runs.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None) -> None:
        if activation not in _ACTIVATIONS:
            raise ValueError(f"{__name__}: activation must be one of {list(_ACTIVATIONS)}, got {activation!r}")
        super().__init__(in_features, out_features, bias)
        self.activation = activation

    def _onednn_parameters(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Weight and bias as the oneDNN kernel takes them in ``dtype``: the packed copy in ``eval()`` mode."""

        def convert() -> tuple[torch.Tensor, torch.Tensor | None]:
            return self.weight.detach().to(dtype), None if self.bias is None else self.bias.detach().to(dtype)

        parameters = [p for p in (self.weight, self.bias) if p is not None]
        if self.training or not _PACK_WEIGHTS or any(p.is_inference() for p in parameters):
            return convert()  # (inference tensors have no version counter to tell when to rebuild)
        source = tuple((id(p), p.data_ptr(), p._version) for p in parameters)
        copies = _PACKED.setdefault(self, {})
        if dtype not in copies or copies[dtype][0] != source:
            weight, bias = convert()
            copies[dtype] = (source, torch.ops.mkldnn._reorder_linear_weight(weight, INFERENCE_ROWS_HINT), bias)
        return copies[dtype][1:]

    def train(self, mode: bool = True) -> Linear:
        _PACKED.pop(self, None)
        return super().train(mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = _onednn_dtype(x, self)
        if dtype is not None:
            name, approximation = _ACTIVATIONS[self.activation]
            return _ONEDNN_LINEAR(x.to(dtype), *self._onednn_parameters(dtype), name, [], approximation)
        return linear(x, self.weight, self.bias, gelu=self.activation == "gelu")

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation}" if self.activation else "")
