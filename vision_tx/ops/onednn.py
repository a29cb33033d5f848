"""oneDNN's fused CPU linear kernel (``torch.ops.mkldnn._linear_pointwise``): its handle, the dtypes it
computes in, and where it may run."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode


def _onednn_linear_op():
    try:
        return torch.ops.mkldnn._linear_pointwise.default if torch.backends.mkldnn.is_available() else None
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return None


def _onednn_bf16_supported() -> bool:
    try:
        return _ONEDNN_LINEAR is not None and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        return False


_ONEDNN_LINEAR = _onednn_linear_op()
_ONEDNN_DTYPES = (torch.float32, torch.bfloat16) if _onednn_bf16_supported() else (torch.float32,)


def onednn_linear_may_run(x: torch.Tensor) -> bool:
    """Whether oneDNN's fused linear kernel may compute on ``x``: a plain CPU tensor, outside code being
    compiled and outside dispatch modes (FLOP counters and other modes must see the aten ops)."""
    return (
        _ONEDNN_LINEAR is not None
        and type(x) is torch.Tensor  # not an FX proxy or a tensor subclass
        and x.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and not is_in_torch_dispatch_mode()
    )
