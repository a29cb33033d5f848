"""oneDNN's fused CPU linear kernel (``torch.ops.mkldnn._linear_pointwise``): its handle, the dtypes it
computes in, where it may run, and whether the training step's products run on it."""

from __future__ import annotations

import os
import platform
from pathlib import Path

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


def mkl_products_keep_up(cpuinfo: str | None = None, mkl: bool | None = None) -> bool:
    """Whether torch's own float32 products (MKL's ``sgemm``) are at least as fast as oneDNN's: where torch is
    built with MKL (``mkl``; default: this build) on an Intel CPU, for which MKL runs its AVX-512 and AMX
    kernels. On other vendors (AMD EPYC: 30-50 GFLOP/s a core against oneDNN's 80-115) MKL takes a slower path
    (docs/BENCHMARKS.md). ``cpuinfo``: the text of ``/proc/cpuinfo`` (default: read, or the platform's
    processor string where there is none)."""
    if mkl is None:
        mkl = torch.backends.mkl.is_available()
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.is_file() else platform.processor()
    return mkl and "GenuineIntel" in cpuinfo


def _training_default() -> bool:
    chosen = os.environ.get("VISION_TX_ONEDNN_TRAINING", "").strip().lower()
    if chosen in ("0", "1", "false", "true"):
        return chosen in ("1", "true")
    if chosen:
        raise ValueError(f"VISION_TX_ONEDNN_TRAINING must be 0 or 1 (or unset: chosen by the CPU), got {chosen!r}")
    return not mkl_products_keep_up()


def set_onednn_training(enabled: bool) -> None:
    """Whether (``enabled``) the training step's float32 products of linear layers (forward, input and weight gradients)
    run on oneDNN (:mod:`vision_tx.ops.linear_autograd`) or through torch's own operators. Default: oneDNN unless
    :func:`mkl_products_keep_up`, or as the environment variable ``VISION_TX_ONEDNN_TRAINING`` (0 or 1) says."""
    global _TRAIN_ON_ONEDNN
    _TRAIN_ON_ONEDNN = bool(enabled) and _ONEDNN_LINEAR is not None


def onednn_training_enabled() -> bool:
    """See :func:`set_onednn_training`."""
    return _TRAIN_ON_ONEDNN


set_onednn_training(_training_default())
