"""The exact linear assignment of a batch of cost matrices as a fixed sequence of tensor operations: no read
back to the host and no shape that depends on the values, so that it runs inside a CUDA graph or a whole-step
``torch.compile`` where scipy's solver (a host call per image) cannot.

The method is the shortest augmenting path one (Kuhn-Munkres with potentials, as in Jonker and Volgenant, 1987):
rows are added one at a time; each search for the cheapest augmenting path walks at most as many columns as rows
already placed, so the row ``i`` search is run exactly ``i + 1`` times for every matrix of the batch, with the
matrices whose search already ended left unchanged. ``R (R + 1)`` steps of a few ``[B, C]`` operations in all: on
the CPU scipy's solver is much faster, so the matcher uses this one only when asked to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def batched_linear_assignment(cost: torch.Tensor) -> torch.Tensor:
    """For each matrix of ``cost [B, R, C]`` (``R <= C``, finite) the distinct column of each row whose total
    cost is the lowest: int64 ``[B, R]`` on ``cost``'s device. Computed in float64 (float32 on devices without it)."""
    batch, rows, cols = cost.shape
    if rows > cols:
        raise ValueError(f"{__name__}: {rows} rows but only {cols} columns: each row needs a column of its own")
    dtype = torch.float32 if cost.device.type == "mps" else torch.float64
    # Row 0 and column 0 are a dummy: column 0 holds the row being placed, owner 0 means a free column.
    padded = F.pad(cost.to(dtype), (1, 0, 1, 0))  # [B, R+1, C+1]
    row_potential = cost.new_zeros(batch, rows + 1, dtype=dtype)
    col_potential = cost.new_zeros(batch, cols + 1, dtype=dtype)
    owner = torch.zeros(batch, cols + 1, dtype=torch.int64, device=cost.device)
    came_from = torch.zeros_like(owner)  # the previous column on the cheapest path to each column
    image = torch.arange(batch, device=cost.device)
    for row in range(1, rows + 1):
        owner[:, 0] = row
        column = torch.zeros(batch, dtype=torch.int64, device=cost.device)
        min_slack = torch.full((batch, cols + 1), torch.inf, dtype=dtype, device=cost.device)
        visited = torch.zeros(batch, cols + 1, dtype=torch.bool, device=cost.device)
        searching = torch.ones(batch, dtype=torch.bool, device=cost.device)
        for _ in range(row):  # a search ends on a free column after at most `row` columns
            visited[image, column] |= searching
            current = owner[image, column]
            slack = padded[image, current] - row_potential[image, current, None] - col_potential
            better = (slack < min_slack) & ~visited & searching[:, None]
            min_slack = torch.where(better, slack, min_slack)
            came_from = torch.where(better, column[:, None], came_from)
            delta, nearest = min_slack.masked_fill(visited, torch.inf).min(-1)
            delta = torch.where(searching, delta, 0.0)[:, None]
            row_potential.scatter_add_(1, owner, visited * delta)
            col_potential = col_potential - visited * delta
            min_slack = min_slack - ~visited * delta
            column = torch.where(searching, nearest, column)
            searching = searching & (owner[image, column] != 0)
        for _ in range(row):  # hand each column on the path to the row of the column before it
            previous = came_from[image, column]
            moving = column != 0
            owner[image, column] = torch.where(moving, owner[image, previous], owner[image, column])
            column = torch.where(moving, previous, column)
    placed = owner[:, None, 1:] == torch.arange(1, rows + 1, device=cost.device)[None, :, None]  # [B, R, C]
    return placed.int().argmax(-1)  # each row owns exactly one column
