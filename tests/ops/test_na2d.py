"""``na2d`` against natten (no bias) and against dense attention with NATTEN's neighborhood as a mask."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.conftest import require_reference, unavailable
from vision_tx.ops import na2d


def _natten_na2d():
    natten = require_reference("natten")
    warnings.filterwarnings("ignore", module="torch.nn.attention.flex_attention")
    try:
        natten.na2d(*(torch.randn(1, 7, 7, 1, 8) for _ in range(3)), kernel_size=7)
    except Exception as err:  # noqa: BLE001 - any failure means natten cannot run here
        unavailable(f"natten.na2d raises on this machine: {type(err).__name__}: {err}")
    return natten.na2d


def _axis_neighborhood(length: int, kernel: int, dilation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query x key tables along one axis: in-neighborhood (bool) and bias index (long).

    Written from NATTEN's definition in window-centre form: within its dilation group a query's
    window is centred on it, the centre clamped so that the window stays inside the group.
    """
    pos = torch.arange(length)
    group, index = pos % dilation, pos // dilation
    group_size = (length - group + dilation - 1) // dilation
    centre = torch.minimum(index.clamp(min=kernel // 2), group_size - 1 - kernel // 2)
    inside = (group[:, None] == group[None, :]) & ((index[None, :] - centre[:, None]).abs() <= kernel // 2)
    bias_index = (index[None, :] - index[:, None] + kernel - 1).clamp(0, 2 * kernel - 2)
    return inside, bias_index


def dense_reference(q, k, v, kernel: int, dilation: int, rpb: torch.Tensor | None) -> torch.Tensor:
    """Attention over all keys, ``-inf`` outside each query's neighborhood, bias gathered per (query, key) pair."""
    batch, height, width, heads, dim = q.shape
    rows, row_bias = _axis_neighborhood(height, kernel, dilation)
    cols, col_bias = _axis_neighborhood(width, kernel, dilation)
    inside = (rows[:, None, :, None] & cols[None, :, None, :]).reshape(height * width, height * width)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.flatten(1, 2), k.flatten(1, 2)) * dim**-0.5
    if rpb is not None:
        bias = rpb[:, row_bias[:, None, :, None], col_bias[None, :, None, :]]  # [heads, H, W, H, W]
        scores = scores + bias.reshape(heads, height * width, height * width)
    attn = scores.masked_fill(~inside, float("-inf")).softmax(-1)
    return torch.einsum("bhqk,bkhd->bqhd", attn, v.flatten(1, 2)).reshape(batch, height, width, heads, -1)


@pytest.mark.parametrize("size, dilation", [((7, 7), 1), ((13, 17), 1), ((56, 56), 1), ((14, 17), 2), ((56, 56), 2)])
def test_matches_natten_without_bias(size: tuple[int, int], dilation: int) -> None:
    reference = _natten_na2d()
    q, k, v = (torch.randn(2, *size, 2, 16) for _ in range(3))
    expected = reference(q, k, v, kernel_size=7, dilation=dilation)
    # natten has no float64 backend on the CPU: float32, measured up to 7e-7 apart.
    torch.testing.assert_close(na2d(q, k, v, 7, dilation), expected, rtol=0, atol=3e-6)


@pytest.mark.parametrize(
    "size, kernel, dilation",
    [((7, 7), 7, 1), ((13, 17), 7, 1), ((30, 23), 7, 1), ((14, 17), 7, 2), ((23, 31), 5, 3), ((13, 12), 3, 4)],
)
def test_bias_and_gradients_match_dense_reference(size: tuple[int, int], kernel: int, dilation: int) -> None:
    q, k, v = (torch.randn(2, *size, 3, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    rpb = torch.randn(3, 2 * kernel - 1, 2 * kernel - 1, dtype=torch.float64, requires_grad=True)
    ours = na2d(q, k, v, kernel, dilation, rpb=rpb)
    expected = dense_reference(q, k, v, kernel, dilation, rpb)
    # float64 throughout: measured ~1e-15 for outputs and gradients.
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)
    grad_out = torch.randn_like(ours)
    grads = torch.autograd.grad(ours, (q, k, v, rpb), grad_out)
    expected_grads = torch.autograd.grad(expected, (q, k, v, rpb), grad_out)
    for name, got, want in zip("q k v rpb".split(), grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=lambda m: f"grad of {name}: {m}")


def test_float32_bias_matches_dense_reference_and_scale_is_used() -> None:
    q, k, v = (torch.randn(1, 15, 11, 2, 16) for _ in range(3))
    rpb = torch.randn(2, 13, 13)
    expected = dense_reference(q * 2.0 * 16**0.5, k, v, 7, 1, rpb)  # scale 2 instead of 16 ** -0.5
    torch.testing.assert_close(na2d(q, k, v, 7, rpb=rpb, scale=2.0), expected, rtol=0, atol=1e-5)


def test_bfloat16_autocast_returns_bfloat16_close_to_float32() -> None:
    q, k, v = (torch.randn(1, 12, 10, 2, 16) for _ in range(3))
    rpb = torch.randn(2, 13, 13)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = na2d(q, k, v, 7, rpb=rpb)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), na2d(q, k, v, 7, rpb=rpb), rtol=0, atol=2e-2)


def test_value_head_dim_may_differ() -> None:
    q, k = torch.randn(2, 1, 9, 9, 1, 8).unbind(0)
    v = torch.randn(1, 9, 9, 1, 4)
    out = na2d(q, k, v, 3)
    torch.testing.assert_close(out, dense_reference(q, k, v, 3, 1, None), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "shapes, kwargs, message",
    [
        ([(1, 9, 9, 2, 8)] * 3, dict(kernel_size=4), "odd"),
        ([(1, 9, 9, 2, 8)] * 3, dict(kernel_size=5, dilation=2), "smaller than kernel_size x dilation"),
        ([(1, 9, 9, 2, 8)] * 3, dict(kernel_size=3, rpb=torch.zeros(2, 3, 3)), "rpb must be"),
        ([(1, 9, 9, 2, 8), (1, 9, 8, 2, 8), (1, 9, 9, 2, 8)], dict(kernel_size=3), "equal shapes"),
        ([(9, 9, 2, 8)] * 3, dict(kernel_size=3), "batch, height, width, heads, head_dim"),
        ([(1, 9, 9, 2, 8)] * 3, dict(kernel_size=3, dilation=0), "dilation must be positive"),
    ],
)
def test_bad_input_is_refused_clearly(shapes, kwargs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        na2d(*(torch.randn(s) for s in shapes), **kwargs)
