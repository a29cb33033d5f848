"""``ms_deform_attn`` against transformers' pure-PyTorch ``MultiScaleDeformableAttention`` (one
``grid_sample`` per level), forward and gradients, on uneven levels and locations at and beyond the borders: both
its versions, the C++ CPU kernel and the PyTorch operators."""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.conftest import require_reference, unavailable
from vision_tx.ops import ms_deform_attn
from vision_tx.ops.cpu_kernels import cpu_kernels

# The module (the package exports its function under the same name)
ms_deform_attn_module = importlib.import_module("vision_tx.ops.ms_deform_attn")

MultiScaleDeformableAttention = require_reference(
    "transformers.models.deformable_detr.modeling_deformable_detr"
).MultiScaleDeformableAttention

SHAPES = [(13, 17), (7, 9), (4, 5), (2, 3)]
HEADS, HEAD_DIM, POINTS = 2, 4, 3


def reference(value, shapes, locations, weights):
    spatial = torch.tensor(shapes)
    starts = torch.cat([spatial.new_zeros(1), spatial.prod(1).cumsum(0)[:-1]])
    return MultiScaleDeformableAttention()(value, spatial, shapes, starts, locations, weights, im2col_step=64)


@pytest.fixture(params=["cpu kernel", "pytorch"], autouse=True)
def version(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on the C++ kernel (which must build: under CI a failed build fails) and on the PyTorch
    operators (the kernel switched off)."""
    if request.param == "cpu kernel":
        if cpu_kernels() is None:
            unavailable("the C++ CPU kernel of ms_deform_attn did not build (see the warning)")
        monkeypatch.setattr(ms_deform_attn_module, "_CPUKernel", _CountingCPUKernel)
        _CountingCPUKernel.calls = 0
    else:
        monkeypatch.setattr(ms_deform_attn_module, "cpu_kernels", lambda: None)
    yield request.param
    # float32 / float64 calls reach the kernel; a test whose calls all fell back would test the PyTorch version twice
    if request.param == "cpu kernel" and not any(name in request.node.name for name in WITHOUT_KERNEL_CALLS):
        assert _CountingCPUKernel.calls > 0


WITHOUT_KERNEL_CALLS = ("half_precision", "raise", "kernel_only")  # tests whose calls never reach the kernel


class _CountingCPUKernel(ms_deform_attn_module._CPUKernel):
    calls = 0

    @staticmethod
    def forward(ctx, *args):
        _CountingCPUKernel.calls += 1
        return _KERNEL_FORWARD(ctx, *args)


_KERNEL_FORWARD = ms_deform_attn_module._CPUKernel.forward


def make_inputs(batch: int, queries: int = 23, dtype=torch.float64, seed: int = 0, head_dim: int = HEAD_DIM):
    """Locations spread over [-0.3, 1.3], with some set exactly on 0, 1, pixel centres, pixel edges
    and the last pixel's centre of their level, in x, y or both."""
    generator = torch.Generator().manual_seed(seed)
    levels = len(SHAPES)
    value = torch.randn(batch, sum(h * w for h, w in SHAPES), HEADS, head_dim, generator=generator, dtype=torch.float64)
    locations = (
        torch.rand(batch, queries, HEADS, levels, POINTS, 2, generator=generator, dtype=torch.float64) * 1.6 - 0.3
    )
    for level, (h, w) in enumerate(SHAPES):
        size = torch.tensor([w, h], dtype=torch.float64)
        special = torch.stack(
            [
                torch.zeros(2),
                torch.ones(2),
                torch.tensor([0.0, 1.0]),
                torch.tensor([-0.2, 0.5]),
                torch.tensor([1.1, 0.5]),
                torch.tensor([0.5, 1.0 + 0.5 / h]),  # half a pixel below the map: reads the last row with weight 1/2
                (torch.tensor([2.0, 1.0]) + 0.5) / size,  # pixel centres
                (size - 0.5) / size,  # the last pixel's centre
                torch.tensor([3.0, 2.0]) / size,  # pixel edges
                torch.tensor([-0.5, 0.5]) / size,  # half a pixel outside, left
            ]
        ).to(torch.float64)
        locations[:, : len(special), :, level, 0] = special[None, :, None]
        locations[:, len(special) : 2 * len(special), :, level, 1, 0] = special[None, :, None, 0]  # x only
    weights = torch.rand(batch, queries, HEADS, levels, POINTS, generator=generator, dtype=torch.float64)
    return value.to(dtype), locations.to(dtype), weights.to(dtype)


def forward_and_grads(fn, value, shapes, locations, weights, grad_output=None):
    inputs = [x.detach().clone().requires_grad_() for x in (value, locations, weights)]
    output = fn(inputs[0], shapes, inputs[1], inputs[2])
    if grad_output is None:
        grad_output = torch.randn(output.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    output.backward(grad_output.to(output.dtype))
    return [output.detach()] + [x.grad for x in inputs]


NAMES = ("output", "value grad", "locations grad", "weights grad")


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-13), (torch.float32, 1e-5)])
@pytest.mark.parametrize("head_dim", [HEAD_DIM, 12])  # 12: the kernel's 8-lane dot products and their remainder
def test_matches_transformers(batch: int, dtype: torch.dtype, tolerance: float, head_dim: int) -> None:
    value, locations, weights = make_inputs(batch, dtype=dtype, head_dim=head_dim)
    expected = forward_and_grads(reference, value, SHAPES, locations, weights)
    actual = forward_and_grads(ms_deform_attn, value, SHAPES, locations, weights)
    for name, a, e in zip(NAMES, actual, expected):
        # Location gradients scale with the level's size in pixels (about 70 here, where the other
        # values are below 7), and so does their rounding: compared per 10 units of their largest.
        scale = e.abs().max().item() / 10 if name == "locations grad" else 1.0
        torch.testing.assert_close(a, e, rtol=0, atol=tolerance * scale, msg=lambda m: f"{name}: {m}")


def test_spatial_shapes_as_list_or_tensor() -> None:
    value, locations, weights = make_inputs(2)
    from_list = ms_deform_attn(value, SHAPES, locations, weights)
    from_tensor = ms_deform_attn(value, torch.tensor(SHAPES, dtype=torch.int32), locations, weights)
    torch.testing.assert_close(from_list, from_tensor, rtol=0, atol=0)


def test_zero_outside_and_exact_on_pixel_centres() -> None:
    """A location on a pixel centre reads that pixel; one wholly outside (more than a pixel off) reads zero."""
    value, locations, weights = make_inputs(1)
    weights = torch.zeros_like(weights)
    weights[0, 0, :, 1, 2] = 1.0  # only level 1 (7x9), point 2
    h, w = SHAPES[1]
    row, col = 4, 6
    locations[0, 0, :, 1, 2] = torch.tensor([(col + 0.5) / w, (row + 0.5) / h], dtype=torch.float64)
    level_value = value[0, 13 * 17 : 13 * 17 + h * w].view(h, w, HEADS, HEAD_DIM)
    torch.testing.assert_close(ms_deform_attn(value, SHAPES, locations, weights)[0, 0], level_value[row, col].flatten())
    locations[0, 0, :, 1, 2] = torch.tensor([1 + 1.01 / w, 0.5], dtype=torch.float64)
    assert ms_deform_attn(value, SHAPES, locations, weights).abs().max() == 0


def test_kernel_only_where_it_computes() -> None:
    """The kernel takes plain float32 / float64 CPU tensors of one dtype; anything else runs the PyTorch version."""
    value, locations, weights = make_inputs(1, dtype=torch.float32)
    may_run = ms_deform_attn_module._cpu_kernel_may_run
    assert may_run(value, locations, weights) == (ms_deform_attn_module.cpu_kernels() is not None)
    assert not may_run(value, locations.double(), weights)
    assert not may_run(value.bfloat16(), locations.bfloat16(), weights.bfloat16())
    assert not may_run(value.to("meta"), locations.to("meta"), weights.to("meta"))


def test_nan_location_gives_its_query_nan_and_reads_nothing() -> None:
    """A NaN location (a diverged offset) reads no pixel, makes its query's head's output NaN, and leaves the other
    heads and queries alone."""
    value, locations, weights = make_inputs(1)
    expected = ms_deform_attn(value, SHAPES, locations, weights).view(1, -1, HEADS, HEAD_DIM)
    locations[0, 3, 1, 2, 0, 1] = float("nan")  # query 3, head 1
    output = ms_deform_attn(value, SHAPES, locations, weights).view(1, -1, HEADS, HEAD_DIM)
    assert output[0, 3, 1].isnan().all()
    output[0, 3, 1] = expected[0, 3, 1]
    torch.testing.assert_close(output, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_within_rounding(dtype: torch.dtype) -> None:
    """bf16 / fp16 inputs: forward and gradients within two roundings (relative to their largest value)
    of the float64 result on the same inputs. (Measured: under one; transformers' bf16 location
    gradient is off by more than its size, as its pixel positions are rounded to bf16.)"""
    value, locations, weights = make_inputs(2, dtype=dtype)
    grad_output = torch.randn(2, 23, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = forward_and_grads(
        reference, value.double(), SHAPES, locations.double(), weights.double(), grad_output.to(dtype).double()
    )
    actual = forward_and_grads(ms_deform_attn, value, SHAPES, locations, weights, grad_output.to(dtype))
    eps = torch.finfo(dtype).eps
    for name, a, e in zip(NAMES, actual, expected):
        assert a.dtype == dtype, name
        error = (a.double() - e).abs().max().item() / e.abs().max().item()
        assert error < 2 * eps, f"{name}: relative error {error:.2e} over 2 x {dtype} eps"


def test_gradients_only_where_asked() -> None:
    value, locations, weights = make_inputs(1)
    value.requires_grad_()
    ms_deform_attn(value, SHAPES, locations, weights).sum().backward()
    expected = forward_and_grads(reference, value, SHAPES, locations, weights, torch.ones(1, 23, HEADS * HEAD_DIM))[1]
    torch.testing.assert_close(value.grad, expected)
    locations.requires_grad_()
    ms_deform_attn(value.detach(), SHAPES, locations, weights).sum().backward()
    assert locations.grad is not None and locations.grad.abs().max() > 0


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda v, s, p, w: (v, s[:3], p, w), "value has 310 tokens but spatial_shapes"),
        (lambda v, s, p, w: (v[:, :-1], s, p, w), "value has 309 tokens"),
        (lambda v, s, p, w: (v, s, p[:, :, :, :3], w[:, :, :, :3]), "3 levels but spatial_shapes has 4"),
        (lambda v, s, p, w: (v, s, p, w[..., :2]), "attention_weights must have"),
        (lambda v, s, p, w: (v, s, p[..., :1], w), "expected value"),
        (lambda v, s, p, w: (v[:1], s, p, w), "batch size or heads"),
    ],
)
def test_mismatched_shapes_raise(change, message: str) -> None:
    value, locations, weights = make_inputs(2)
    with pytest.raises(ValueError, match=message):
        ms_deform_attn(*change(value, SHAPES, locations, weights))
