"""Multi-scale deformable attention (Zhu et al., Deformable DETR, 2021), in PyTorch operators and a C++ CPU kernel.

Each query reads ``points`` bilinearly sampled values per head and per level of a feature pyramid
and sums them with its attention weights. Sampling follows ``grid_sample`` with
``align_corners=False`` and zeros outside the map: location (0, 0) is the top-left corner of the
top-left pixel, (1, 1) the bottom-right corner of the bottom-right one.

How it is computed: every sample is the weighted sum of its four neighbouring pixels, so the whole
operator is one weighted gather-sum over rows of the (zero-bordered) value table, with the
attention weight folded into the four bilinear weights. ``F.embedding_bag`` does that gather-sum
without materialising the gathered rows; the backward computes the weights' gradient as the dot
products of the output gradient with the same rows (``torch.sparse.sampled_addmm``) and the
table's gradient as the transposed gather-sum (rows sorted by the pixel they read). The usual
way, one ``grid_sample`` per level and a product with the weights, builds a ``[B*heads, head_dim,
Q, L*P]`` tensor and is slower, forward and backward (``benchmarks/ms_deform_attn.py``).
Pixel positions and bilinear weights are computed in at least fp32, also for bf16/fp16 inputs.

On the CPU, float32 and float64 inputs run a C++ kernel instead (``vision_tx/ops/csrc/ms_deform_attn_cpu.cpp``,
built on first use by :mod:`vision_tx.ops.cpu_kernels`): the same sums as one loop per query forward and one per
(image, head) backward, 4-5x faster than the operators above at the main job's shapes. Compiled or exported code,
dispatch modes and machines where the kernel does not build run the PyTorch version.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from vision_tx.ops.cpu_kernels import cpu_kernels, kernel_inputs


def level_shapes(spatial_shapes: torch.Tensor | Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """The levels' ``(height, width)`` as Python ints, from ``spatial_shapes``: a list or an int tensor ``[L, 2]``
    (symbolic sizes, under ``torch.export``, stay symbolic)."""
    if isinstance(spatial_shapes, torch.Tensor):
        spatial_shapes = spatial_shapes.tolist()
    return [
        (h if isinstance(h, torch.SymInt) else int(h), w if isinstance(w, torch.SymInt) else int(w))
        for h, w in spatial_shapes
    ]


def ms_deform_attn(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor | Sequence[Sequence[int]],
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> torch.Tensor:
    """Multi-scale deformable attention.

    ``value [B, S, heads, head_dim]``: the levels' tokens concatenated, highest resolution first
    (``S = sum(h * w)``); ``spatial_shapes``: the levels' ``(h, w)``;
    ``sampling_locations [B, Q, heads, L, P, 2]``: (x, y) in [0, 1];
    ``attention_weights [B, Q, heads, L, P]`` -> ``[B, Q, heads * head_dim]``.
    """
    shapes = level_shapes(spatial_shapes)
    _check_shapes(value, shapes, sampling_locations, attention_weights)
    if _cpu_kernel_may_run(value, sampling_locations, attention_weights):
        flat_shapes = [size for shape in shapes for size in shape]
        return _CPUKernel.apply(value, flat_shapes, sampling_locations, attention_weights)
    batch, _, heads, head_dim = value.shape
    queries = sampling_locations.shape[1]
    table, rows_per_batch = _bordered_table(value, shapes)
    top_left, corner_offsets, frac, weights = _samples(
        sampling_locations, attention_weights, shapes, rows_per_batch, heads
    )
    output = _BilinearRowSum.apply(
        table,
        top_left.flatten(0, 2).flatten(1),
        corner_offsets,
        frac.flatten(0, 2).flatten(1, 2),
        weights.flatten(0, 2).flatten(1),
    )
    return output.view(batch, queries, heads * head_dim)


def _cpu_kernel_may_run(value: torch.Tensor, locations: torch.Tensor, weights: torch.Tensor) -> bool:
    """Whether the C++ kernel computes: plain float CPU tensors of one dtype (:func:`kernel_inputs`), and the kernel
    built."""
    return kernel_inputs(value, locations, weights) and cpu_kernels() is not None


class _CPUKernel(torch.autograd.Function):
    """:func:`ms_deform_attn` by the C++ kernel; ``shapes`` flat ``[h0, w0, h1, w1, ...]``."""

    @staticmethod
    def forward(
        ctx, value: torch.Tensor, shapes: list[int], locations: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(value, locations, weights)
        ctx.shapes = shapes
        return cpu_kernels().ms_deform_attn_forward(value, shapes, locations, weights)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        value, locations, weights = ctx.saved_tensors
        grad_value, grad_locations, grad_weights = cpu_kernels().ms_deform_attn_backward(
            grad_output, value, ctx.shapes, locations, weights
        )
        return grad_value, None, grad_locations, grad_weights


def _check_shapes(
    value: torch.Tensor, shapes: list[tuple[int, int]], locations: torch.Tensor, weights: torch.Tensor
) -> None:
    problem = None
    if value.dim() != 4 or locations.dim() != 6 or locations.shape[-1] != 2 or weights.dim() != 5:
        problem = (
            "expected value [B, S, heads, head_dim], sampling_locations [B, Q, heads, L, P, 2], "
            "attention_weights [B, Q, heads, L, P]"
        )
    elif sum(h * w for h, w in shapes) != value.shape[1]:
        problem = f"value has {value.shape[1]} tokens but spatial_shapes {shapes} give {sum(h * w for h, w in shapes)}"
    elif locations.shape[3] != len(shapes):
        problem = f"sampling_locations has {locations.shape[3]} levels but spatial_shapes has {len(shapes)}"
    elif locations.shape[0] != value.shape[0] or locations.shape[2] != value.shape[2]:
        problem = "value and sampling_locations disagree on batch size or heads"
    elif weights.shape != locations.shape[:-1]:
        problem = "attention_weights must have the shape of sampling_locations without its last dimension"
    if problem:
        raise ValueError(
            f"{__name__}: {problem} (value {tuple(value.shape)}, sampling_locations "
            f"{tuple(locations.shape)}, attention_weights {tuple(weights.shape)})"
        )


def _bordered_table(value: torch.Tensor, shapes: list[tuple[int, int]]) -> tuple[torch.Tensor, int]:
    """``value`` with each level given a border of zero pixels, as rows ``[B * S' * heads, head_dim]``
    (row ``(b * S' + token) * heads + head``), and ``S' = sum((h + 2) * (w + 2))``.

    With the border, the four neighbours of any sample whose 2x2 neighbourhood touches the map are
    rows of the table, and the ones outside it read zeros, as ``grid_sample``'s zeros padding does.
    """
    batch, _, heads, head_dim = value.shape
    levels = value.split([h * w for h, w in shapes], dim=1)
    bordered = [
        F.pad(level.view(batch, h, w, heads, head_dim), (0, 0, 0, 0, 1, 1, 1, 1)).flatten(1, 2)
        for level, (h, w) in zip(levels, shapes)
    ]
    table = torch.cat(bordered, dim=1)
    return table.view(-1, head_dim), table.shape[1] * heads


def _samples(
    locations: torch.Tensor,
    attention_weights: torch.Tensor,
    shapes: list[tuple[int, int]],
    rows_per_batch: int,
    heads: int,
) -> tuple[torch.Tensor, ...]:
    """Each sample's top-left neighbouring pixel as a table row ``[B, Q, heads, L, P]`` (int64), the
    row offsets of its four neighbours per level ``[L*P, 4]``, its position between them
    ``[B, Q, heads, L, P, 2]`` (x, y in [0, 1)) and its attention weight ``[B, Q, heads, L, P]``
    (zero where its 2x2 neighbourhood lies wholly outside its level)."""
    device = locations.device
    compute_dtype = torch.promote_types(locations.dtype, torch.float32)
    points = locations.shape[4]
    height = torch.tensor([h for h, _ in shapes], device=device)[:, None]  # [L, 1], broadcast over points
    width = torch.tensor([w for _, w in shapes], device=device)[:, None]
    sizes = torch.stack([width, height], -1).to(compute_dtype)  # [L, 1, 2] (x, y)
    # grid_sample's own arithmetic (grid = 2 * loc - 1, then (grid + 1) * size / 2 - 0.5), so that
    # floor() picks the same pixels as it does for samples exactly on a pixel centre.
    pixel = (locations.to(compute_dtype) * 2 - 1 + 1) * (sizes / 2) - 0.5
    corner = pixel.detach().nan_to_num(nan=-2.0).floor()  # a NaN location reads nothing, never out of bounds
    frac = pixel - corner  # differentiable: the bilinear weights' gradient reaches the locations
    touches = ((corner >= -1) & (corner < sizes)).all(-1)  # the 2x2 neighbourhood meets the level
    # The top-left neighbour in the bordered level (which starts one pixel up and left), clamped
    # into it for samples that do not touch the level (their weight is zero).
    x, y = (corner + 1).clamp_(min=0).minimum(sizes).long().unbind(-1)
    bordered_width = width + 2
    starts = torch.tensor([0] + [(h + 2) * (w + 2) for h, w in shapes[:-1]], device=device).cumsum(0)[:, None]
    batch_index = torch.arange(locations.shape[0], device=device).view(-1, 1, 1, 1, 1)
    head_index = torch.arange(heads, device=device).view(1, 1, -1, 1, 1)
    top_left = (starts + y * bordered_width + x) * heads + (batch_index * rows_per_batch + head_index)
    # Neighbours: top-left, top-right, bottom-left, bottom-right.
    corner_offsets = (
        torch.cat(
            [torch.zeros_like(bordered_width), torch.ones_like(bordered_width), bordered_width, bordered_width + 1], -1
        )
        * heads
    )
    return top_left, corner_offsets.repeat_interleave(points, 0), frac, attention_weights.to(compute_dtype) * touches


class _BilinearRowSum(torch.autograd.Function):
    """``output[n] = sum_m weight[n, m] * bilinear(table rows top_left[n, m] + corner_offsets[m], frac[n, m])``.

    ``table [R, D]``; ``top_left [N, M]`` (int64), ``corner_offsets [M, 4]`` (int64: rows of the
    top-left, top-right, bottom-left, bottom-right neighbours relative to the top-left one);
    ``frac [N, M, 2]`` (x, y within the 2x2 neighbourhood); ``weight [N, M]`` -> ``[N, D]``.
    The gradients of ``frac`` and ``weight`` are closed-form from the dot products of the output's
    gradient with the neighbours' rows; the table's is the transposed sum.
    """

    @staticmethod
    def forward(
        ctx,
        table: torch.Tensor,
        top_left: torch.Tensor,
        corner_offsets: torch.Tensor,
        frac: torch.Tensor,
        weight: torch.Tensor,
    ) -> torch.Tensor:
        index = (top_left[..., None] + corner_offsets).flatten(1)  # [N, M*4]
        corner_weights = _corner_weights(frac, weight).to(table.dtype)  # [N, M, 4]
        ctx.save_for_backward(table, top_left, corner_offsets, index, corner_weights, frac, weight)
        if torch.compiler.is_exporting():  # ONNX has no EmbeddingBag: its translation loops over the N bags one by one
            rows = table.index_select(0, index.flatten()).view(*index.shape, table.shape[1])  # [N, M*4, D]
            return (rows * corner_weights.flatten(1)[..., None]).sum(1)
        return F.embedding_bag(index, table, mode="sum", per_sample_weights=corner_weights.flatten(1))

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        table, top_left, corner_offsets, index, corner_weights, frac, weight = ctx.saved_tensors
        grad_output = grad_output.contiguous()
        grad_table = grad_frac = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_table = _transposed_row_sum(grad_output, top_left, corner_offsets, corner_weights, table.shape[0])
        if ctx.needs_input_grad[3] or ctx.needs_input_grad[4]:
            dots = _row_dots(grad_output, table, index).view(*top_left.shape, 4)  # [N, M, 4]
            fx, fy = frac.unbind(-1)
            top = torch.lerp(dots[..., 0], dots[..., 1], fx)  # the sample's value along the top row, . grad
            bottom = torch.lerp(dots[..., 2], dots[..., 3], fx)
            grad_weight = torch.lerp(top, bottom, fy).to(weight.dtype)
            grad_fx = weight * torch.lerp(dots[..., 1] - dots[..., 0], dots[..., 3] - dots[..., 2], fy)
            grad_frac = torch.stack([grad_fx, weight * (bottom - top)], -1).to(frac.dtype)
        return grad_table, None, None, grad_frac, grad_weight


def _corner_weights(frac: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``[N, M, 4]``: the bilinear weights of the four neighbours times the attention weight."""
    fx, fy = frac.unbind(-1)
    upper, lower = weight * (1 - fy), weight * fy
    return torch.stack([upper * (1 - fx), upper * fx, lower * (1 - fx), lower * fx], -1)


def _transposed_row_sum(
    grad_output: torch.Tensor,
    top_left: torch.Tensor,
    corner_offsets: torch.Tensor,
    corner_weights: torch.Tensor,
    rows: int,
) -> torch.Tensor:
    """``grad_table[r] = sum over the (n, m, corner) reading row r of corner_weights * grad_output[n]``,
    one gather-sum per corner over the samples sorted by the row they read (no scatter, no
    ``[N*M*4, D]`` buffer). Adding a corner's offset keeps the order sorted: it is constant within
    each level's block of rows and moves no row out of its block."""
    flat = top_left.flatten()
    # A stable sort fixes the summation order (deterministic results); int32 keys sort faster.
    order = torch.sort(flat.int() if rows < 2**31 else flat, stable=True).indices
    grad_rows = order // top_left.shape[1]
    # [4, N*M]: each corner's weights contiguous (embedding_bag's fast path needs it), gathered straight
    # from the transposed view (no transposed copy).
    sorted_weights = corner_weights.view(-1, 4).t().index_select(1, order)
    grad_table = None
    ones = flat.new_ones(()).expand(flat.numel())
    for corner in range(4):
        # Each row's count of readers (a scatter-add rather than bincount: its output size is static, so it compiles).
        counts = flat.new_zeros(rows).scatter_add_(0, (top_left + corner_offsets[:, corner]).flatten(), ones)
        part = F.embedding_bag(
            grad_rows, grad_output, counts.cumsum(0) - counts, mode="sum", per_sample_weights=sorted_weights[corner]
        )
        grad_table = part if grad_table is None else grad_table.add_(part)
    return grad_table


def _row_dots(grad_output: torch.Tensor, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``[N, K]``: ``grad_output[n] . table[index[n, k]]``, the dot products only at the pairs read
    (a sampled matrix product over a sparse pattern with ``K`` entries per row). Compiled code, which
    cannot trace sparse tensors, gathers the rows and takes the dot products: the compiler fuses the two
    into one loop, with no ``[N, K, D]`` buffer."""
    count, per_row = index.shape
    dtype = torch.promote_types(table.dtype, torch.float32)  # the sparse kernel has no bf16/fp16
    if torch.compiler.is_compiling():
        rows = table.to(dtype).index_select(0, index.flatten()).view(count, per_row, -1)
        return (rows * grad_output.to(dtype)[:, None]).sum(-1)
    crow = torch.arange(0, count * per_row + 1, per_row, device=index.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        pattern = torch.sparse_csr_tensor(
            crow,
            index.flatten(),
            torch.zeros(1, dtype=dtype, device=index.device).expand(index.numel()),
            size=(count, table.shape[0]),
            check_invariants=False,
        )
        dots = torch.sparse.sampled_addmm(pattern, grad_output.to(dtype), table.to(dtype).t(), beta=0)
    return dots.values().view(count, per_row)
