"""The batched linear assignment against scipy's solver, and its claim to need no value read back to the host."""

from __future__ import annotations

import pytest
import torch
from scipy.optimize import linear_sum_assignment
from torch._subclasses.fake_tensor import FakeTensorMode

from vision_tx.heads.detr.assignment import batched_linear_assignment


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 4, 4), (5, 7, 30), (2, 12, 40), (2, 0, 5)])
def test_continuous_costs_give_scipys_assignment(shape: tuple[int, int, int]) -> None:
    cost = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))
    columns = batched_linear_assignment(cost)
    assert columns.shape == shape[:2] and columns.dtype == torch.int64
    for matrix, found in zip(cost, columns):
        rows, expected = linear_sum_assignment(matrix.numpy())
        assert found.tolist() == expected.tolist()  # continuous random costs: one optimum


def test_tied_costs_reach_scipys_total_with_distinct_columns() -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(10):
        cost = torch.randint(0, 3, (4, 6, 8), generator=generator).double()
        columns = batched_linear_assignment(cost)
        for matrix, found in zip(cost, columns):
            assert len(set(found.tolist())) == 6
            rows, expected = linear_sum_assignment(matrix.numpy())
            assert matrix[torch.arange(6), found].sum() == matrix[rows, expected].sum()


def test_runs_without_reading_a_value_on_the_host() -> None:
    """Under fake tensors (shapes only) any value-dependent step (``.item()``, boolean indexing) raises."""
    with FakeTensorMode():
        columns = batched_linear_assignment(torch.randn(2, 3, 5))
    assert columns.shape == (2, 3)
    with FakeTensorMode(), pytest.raises(Exception, match="nonzero"):  # the check can fail
        scores = torch.randn(4)
        scores[scores > 0]


def test_more_rows_than_columns_is_named() -> None:
    with pytest.raises(ValueError, match="3 rows but only 2 columns"):
        batched_linear_assignment(torch.zeros(1, 3, 2))
