"""2-D neighborhood attention (Hassani et al., 2022) in plain PyTorch, with NATTEN's semantics.

Each query attends to the ``k x k`` keys around it; with dilation ``d`` only to keys of its own
dilation group (positions congruent to it modulo ``d``), ``d`` apart. Near a border the window
shifts to stay inside the map (nothing is padded), and the relative position bias follows the
shifted window: the bias of a key is indexed by its offset from the query, in dilated units.

The computation is tiled: a ``T x T`` tile of queries (of one dilation group) needs at most
``(T + k - 1)^2`` keys, so each tile is one dense ``[T*T, (T+k-1)^2]`` matmul with an additive mask.
That keeps the work in large matmuls (fast on CPUs and GPUs alike) and the gathered keys and values
to a few copies of the input, instead of the ``k*k`` copies a per-query gather would need.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vision_tx.ops.size_tables import cached_size_table

# Queries per tile side. Larger tiles mean bigger matmuls but more masked-out work per query.
_TILE = 8


@dataclass(frozen=True)
class _AxisPlan:
    """Index tables for one axis: the map is cut into tiles of ``tile`` queries, each with ``span`` keys."""

    query_index: Tensor  # [tiles * tile] position of each query slot (the last tile of a group repeats its last query)
    key_index: Tensor  # [tiles * span] position of each key slot
    mask: Tensor  # [tiles, tile, span] 0 where the key slot is in the query slot's neighborhood, -inf elsewhere
    bias_index: Tensor  # [tiles, tile, span] key minus query in dilated units, plus kernel - 1
    output_index: Tensor  # [length] query slot that holds each position


@cached_size_table(maxsize=128)
def _axis_plan(length: int, kernel: int, dilation: int, device: torch.device) -> _AxisPlan:
    largest_group = -(-length // dilation)
    tile = min(_TILE, largest_group)
    span = min(tile + kernel - 1, largest_group)
    query_index, key_index, masks, bias_index = [], [], [], []
    output_index = torch.empty(length, dtype=torch.long)
    slots = 0
    for group in range(dilation):
        size = len(range(group, length, dilation))
        tiles = -(-size // tile)
        # Positions inside the group ("dilated units"); padding slots repeat the group's last query.
        queries = torch.arange(tiles * tile).clamp(max=size - 1).view(tiles, tile)
        starts = (queries - kernel // 2).clamp(0, size - kernel)
        # Starts grow by at most one per query, so a tile's windows fit in `span` keys from its first start.
        keys = starts[:, :1].clamp(max=size - span).clamp(min=0) + torch.arange(span)
        inside = (keys[:, None, :] >= starts[:, :, None]) & (keys[:, None, :] < starts[:, :, None] + kernel)
        masks.append(torch.zeros(inside.shape).masked_fill(~inside, float("-inf")))
        bias_index.append((keys[:, None, :] - queries[:, :, None] + kernel - 1).clamp(0, 2 * kernel - 2))
        query_index.append(queries.flatten() * dilation + group)
        key_index.append(keys.clamp(max=size - 1).flatten() * dilation + group)
        positions = torch.arange(size)
        output_index[positions * dilation + group] = slots + positions
        slots += tiles * tile
    return _AxisPlan(
        torch.cat(query_index).to(device),
        torch.cat(key_index).to(device),
        torch.cat(masks).to(device),
        torch.cat(bias_index).to(device),
        output_index.to(device),
    )


def _pair(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(x, int) for x in pair):
        raise ValueError(f"na2d: {name} must be an int or a pair of ints, got {value!r}")
    return pair  # type: ignore[return-value]


def _check(
    q: Tensor, k: Tensor, v: Tensor, kernel: tuple[int, int], dilation: tuple[int, int], rpb: Tensor | None
) -> None:
    if q.dim() != 5 or q.shape != k.shape or v.dim() != 5 or v.shape[:4] != q.shape[:4]:
        raise ValueError(
            "na2d: q, k, v must be [batch, height, width, heads, head_dim] with equal shapes "
            f"(v may differ in head_dim), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if any(x < 1 or x % 2 == 0 for x in kernel):
        raise ValueError(f"na2d: kernel_size must be odd and positive, got {kernel}")
    if any(x < 1 for x in dilation):
        raise ValueError(f"na2d: dilation must be positive, got {dilation}")
    height, width = q.shape[1:3]
    if height < kernel[0] * dilation[0] or width < kernel[1] * dilation[1]:
        raise ValueError(
            f"na2d: the feature map {height}x{width} is smaller than kernel_size x dilation "
            f"({kernel[0] * dilation[0]}x{kernel[1] * dilation[1]}); pad it first"
        )
    bias_shape = (q.shape[3], 2 * kernel[0] - 1, 2 * kernel[1] - 1)
    if rpb is not None and tuple(rpb.shape) != bias_shape:
        raise ValueError(f"na2d: rpb must be [heads, 2*kernel-1, 2*kernel-1] = {bias_shape}, got {tuple(rpb.shape)}")


def na2d(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kernel_size: int | tuple[int, int],
    dilation: int | tuple[int, int] = 1,
    rpb: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Neighborhood attention over a 2-D map, NATTEN's ``na2d`` with the original relative position bias.

    Args:
        ``q``, ``k``, ``v``: ``[B, H, W, heads, head_dim]`` (``v`` may have another ``head_dim``).
        ``kernel_size``: odd neighborhood size (or a pair: rows, columns).
        ``dilation``: neighbor spacing (or a pair); needs ``H >= kernel * dilation`` along each axis.
        ``rpb``: optional relative position bias ``[heads, 2*kernel-1, 2*kernel-1]``.
        ``scale``: query scale, ``head_dim ** -0.5`` by default.

    Returns:
        ``[B, H, W, heads, head_dim_v]``.
    """
    kernel, dilation = _pair(kernel_size, "kernel_size"), _pair(dilation, "dilation")
    _check(q, k, v, kernel, dilation, rpb)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if q.device.type == "cpu":
        out_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else v.dtype
        if out_dtype in (torch.float16, torch.bfloat16):
            # CPU matmuls in half precision are many times slower than in fp32 (and less exact): work in fp32.
            with torch.autocast("cpu", enabled=False):
                out = _tiled_attention(q.float(), k.float(), v.float(), kernel, dilation, rpb, scale)
            return out.to(out_dtype)
    return _tiled_attention(q, k, v, kernel, dilation, rpb, scale)


def _tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kernel: tuple[int, int],
    dilation: tuple[int, int],
    rpb: Tensor | None,
    scale: float,
) -> Tensor:
    batch, height, width, heads, _ = q.shape
    rows = _axis_plan(height, kernel[0], dilation[0], q.device)
    cols = _axis_plan(width, kernel[1], dilation[1], q.device)
    row_tiles, row_tile, row_span = rows.mask.shape
    col_tiles, col_tile, col_span = cols.mask.shape

    def tiled(x: Tensor, row_index: Tensor, col_index: Tensor, row_size: int, col_size: int) -> Tensor:
        # [B, H, W, heads, C] -> [B * heads * tiles, row_size * col_size, C]
        x = x.index_select(1, row_index).index_select(2, col_index)
        x = x.view(batch, row_tiles, row_size, col_tiles, col_size, heads, -1).permute(0, 5, 1, 3, 2, 4, 6)
        return x.reshape(batch * heads * row_tiles * col_tiles, row_size * col_size, -1)

    q_tiles = tiled(q * scale, rows.query_index, cols.query_index, row_tile, col_tile)
    k_tiles = tiled(k, rows.key_index, cols.key_index, row_span, col_span)
    v_tiles = tiled(v, rows.key_index, cols.key_index, row_span, col_span)

    # Additive terms, [tiles_r, tiles_c, tile_r, tile_c, span_r, span_c] (per head with a bias).
    extra = rows.mask[:, None, :, None, :, None] + cols.mask[None, :, None, :, None, :]
    if rpb is not None:
        bias = rpb[:, rows.bias_index][..., cols.bias_index]  # [heads, tr, tile_r, span_r, tc, tile_c, span_c]
        extra = extra + bias.permute(0, 1, 4, 2, 5, 3, 6)
    scores = q_tiles @ k_tiles.transpose(1, 2)
    scores = (scores.view(batch, heads, *extra.shape[-6:]) + extra).view_as(scores)
    # Half-precision scores are normalised in fp32; fp32 and fp64 in their own precision.
    attn = scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(v_tiles.dtype)
    out = attn @ v_tiles  # [B * heads * tiles, tile_r * tile_c, head_dim_v]
    out = out.view(batch, heads, row_tiles, col_tiles, row_tile, col_tile, -1).permute(0, 2, 4, 3, 5, 1, 6)
    out = out.reshape(batch, row_tiles * row_tile, col_tiles * col_tile, heads, -1)
    return out.index_select(1, rows.output_index).index_select(2, cols.output_index)
