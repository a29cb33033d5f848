"""A linear layer that, in CPU inference, runs as one oneDNN kernel with its bias and activation.

``F.linear`` on the CPU copies the bias into the output and then accumulates the product onto it,
and GELU is one more pass over the result: for the narrow, tall matrices of vision transformers
(tens of thousands of tokens by 96-768 channels) these memory passes cost as much as the product.
oneDNN's ``linear_pointwise`` kernel (one that ``torch.compile``'s CPU backend emits) applies bias and
activation while the output is still in registers. It has no backward, so it is taken only where
no gradient is asked for; training and every other device and dtype use ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

_ACTIVATIONS = {None: ("none", ""), "gelu": ("gelu", "none")}  # oneDNN's name and GELU's approximation


def _onednn_linear_op():
    try:
        return torch.ops.mkldnn._linear_pointwise.default if torch.backends.mkldnn.is_available() else None
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return None


_ONEDNN_LINEAR = _onednn_linear_op()


def _takes_onednn(x: torch.Tensor, layer: nn.Linear) -> bool:
    return (
        _ONEDNN_LINEAR is not None
        and type(x) is torch.Tensor  # not an FX proxy or a tensor subclass
        and x.device.type == "cpu"
        and x.dtype == layer.weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not is_in_torch_dispatch_mode()  # FLOP counters and other modes see the aten ops
        and not (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in layer.parameters())))
    )


class Linear(nn.Linear):
    """``nn.Linear`` followed by an optional ``activation`` (``None`` or ``"gelu"``, the exact erf form).

    ``[..., in_features] -> [..., out_features]``; same parameters and state-dict keys as
    ``nn.Linear``, same results up to float rounding whichever kernel runs.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None) -> None:
        if activation not in _ACTIVATIONS:
            raise ValueError(f"vision_tx/ops/linear.py: activation must be one of {list(_ACTIVATIONS)}, got {activation!r}")
        super().__init__(in_features, out_features, bias)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _takes_onednn(x, self):
            name, approximation = _ACTIVATIONS[self.activation]
            return _ONEDNN_LINEAR(x, self.weight, self.bias, name, [], approximation)
        x = F.linear(x, self.weight, self.bias)
        return F.gelu(x) if self.activation == "gelu" else x

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation}" if self.activation else "")
