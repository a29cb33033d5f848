"""vision_tx ``na2d`` against ``natten.na2d`` on NAT's first level: batch 2, 56x56, 2 heads of 32, kernel 7.

Rows: forward, forward + backward, forward under autocast (bf16 on the CPU, fp16 on CUDA). No bias,
since natten >= 0.20 has none. On the CPU natten runs its flex-attention backend, which has no
backward there, so the forward + backward row compares against dense SDPA with the same
neighborhood as a boolean mask (what one would write without natten).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from benchmarks.timing import Row, compare
from vision_tx.ops import na2d

SHAPE = (2, 56, 56, 2, 32)
KERNEL = 7


def _neighborhood(length: int, kernel: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Query x key along one axis (no dilation): in NATTEN's clamped window (bool), and the offset's
    row of the ``2*kernel-1`` bias table (long)."""
    positions = torch.arange(length, device=device)
    centers = positions.clamp(kernel // 2, length - 1 - kernel // 2)
    inside = (positions[None, :] - centers[:, None]).abs() <= kernel // 2
    return inside, (positions[None, :] - positions[:, None] + kernel - 1).clamp(0, 2 * kernel - 2)


def masked_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: int,
    dilation: int = 1,
    rpb: torch.Tensor | None = None,
) -> torch.Tensor:
    """``na2d`` as dense SDPA over all keys: ``q, k, v [B, H, W, heads, d]``, ``rpb [heads, 2k-1, 2k-1]``
    -> ``[B, H, W, heads, d]``; the neighbourhood is a boolean mask, or with ``rpb`` an additive one."""
    if dilation != 1:
        raise NotImplementedError("masked_sdpa: dilation 1 only")
    batch, height, width, heads, dim = q.shape
    (rows, row_bias), (cols, col_bias) = (_neighborhood(n, kernel_size, q.device) for n in (height, width))
    mask = (rows[:, None, :, None] & cols[None, :, None, :]).reshape(height * width, height * width)
    if rpb is not None:
        bias = rpb[:, row_bias[:, None, :, None], col_bias[None, :, None, :]].reshape(
            heads, height * width, height * width
        )
        mask = bias.masked_fill(~mask, float("-inf"))
    q, k, v = (x.flatten(1, 2).transpose(1, 2) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).reshape(batch, height, width, heads, dim)


def run(device: str, quick: bool) -> list[Row]:
    import natten

    warnings.filterwarnings("ignore", module="torch.nn.attention.flex_attention")
    iters = 2 if quick else 3  # per process
    amp_dtype = torch.bfloat16 if device == "cpu" else torch.float16
    q, k, v = (torch.randn(SHAPE, device=device) for _ in range(3))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

    def forward(fn):
        def call():
            with torch.no_grad():
                fn(q, k, v, kernel_size=KERNEL)

        return call

    def forward_backward(fn):
        def call():
            fn(qg, kg, vg, kernel_size=KERNEL).sum().backward()

        return call

    def autocast(fn):
        def call():
            with torch.no_grad(), torch.autocast(device.split(":")[0], dtype=amp_dtype):
                fn(q, k, v, kernel_size=KERNEL)

        return call

    backward_reference, backward_name = (masked_sdpa, "masked SDPA") if device == "cpu" else (natten.na2d, "natten")
    cases = (
        ("forward", forward(na2d), forward(natten.na2d), "natten"),
        ("forward+backward", forward_backward(na2d), forward_backward(backward_reference), backward_name),
        (f"forward {str(amp_dtype)[6:]} autocast", autocast(na2d), autocast(natten.na2d), "natten"),
    )
    name = "x".join(map(str, SHAPE))
    return [
        compare(
            f"na2d {name} k{KERNEL} {label}",
            ours,
            reference,
            ref_name,
            device,
            unit_items=SHAPE[0],
            warmup=1,
            iters=iters,
        )
        for label, ours, reference, ref_name in cases
    ]
