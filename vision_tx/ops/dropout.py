"""Dropout whose CPU mask costs a quarter of a random draw per element.

``F.dropout`` on the CPU draws one Bernoulli sample per element, serially: in a DETR training step
its 60 calls (attention weights and features) take about 8% of the time. Here one 64-bit draw
gives the coin flips of four elements (16 bits each); an element is dropped when its 16 bits fall
below ``round(p * 65536)``, so the drop probability is ``p`` to within 1/131072, and the kept
elements are scaled by the exact inverse of the keep probability, so that the expected output is
the input. Other devices, where ``F.dropout`` is one fused kernel, use it, and so does code being
compiled (``torch.compile`` draws its own random numbers inside the fused kernel it generates).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 1 << 16


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Zeroes each element of ``x`` (any shape) with probability ``p`` and scales the rest by ``1 / (1 - p)`` when
    ``training``, else returns ``x``; same shape."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    threshold = round(p * _LEVELS)
    draws = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    keep = draws.view(torch.int16)[: x.numel()].view(x.shape) >= threshold - _LEVELS // 2
    return x * (keep * (_LEVELS / (_LEVELS - threshold))).to(x.dtype)


class Dropout(nn.Dropout):
    """``nn.Dropout`` through :func:`dropout` (never in place)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
