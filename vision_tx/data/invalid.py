"""Skipping invalid records when a dataset is built with ``skip_invalid=True``.

Without the option every invalid record is an error that names the file, the record and the
problem. With it, records found invalid while the dataset is built are left out with one warning
(the count and the first examples), and an item that fails when it is read (a corrupt image, a
label map that does not fit its image) is replaced by the next valid item, with a warning naming
it: the dataset keeps its length, so every DDP process still gets the same number of batches.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Generic, TypeVar

from torch.utils.data import Dataset

Item = TypeVar("Item")
EXAMPLES_SHOWN = 3


class InvalidDataError(ValueError):
    """A dataset file or record that cannot be used: the message names the file, the record and the problem."""


class SkippedRecordsWarning(UserWarning):
    """Invalid records were skipped because the dataset was built with ``skip_invalid=True``."""


def warn_skipped(source: object, problems: Sequence[str], total: int, records: str) -> None:
    """One warning: ``len(problems)`` of the ``total`` ``records`` of ``source`` were skipped, and why (the first
    ``problems``, one line each)."""
    shown = "\n  ".join(problems[:EXAMPLES_SHOWN]) + ("\n  ..." if len(problems) > EXAMPLES_SHOWN else "")
    warnings.warn(
        f"{source}: skipped {len(problems)} of {total} {records} with invalid data (skip_invalid=True):\n  {shown}",
        SkippedRecordsWarning,
        stacklevel=3,
    )


class SkippingDataset(Dataset, Generic[Item]):
    """A dataset whose ``_load(index)`` raises ``format_error`` for an item that cannot be read.

    With ``skip_invalid`` such an item is replaced by the first of the following indices (in a
    circle) that loads; indices that failed go in a per-process set and are warned about once.
    """

    format_error: type[Exception] = InvalidDataError

    def __init__(self, skip_invalid: bool) -> None:
        self.skip_invalid = skip_invalid
        self._skipped: set[int] = set()

    def _load(self, index: int) -> Item:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Item:
        if not self.skip_invalid:
            return self._load(index)
        length = len(self)  # type: ignore[arg-type]
        for offset in range(length):
            candidate = (index + offset) % length
            if candidate in self._skipped:
                continue
            try:
                return self._load(candidate)
            except self.format_error as err:
                self._skipped.add(candidate)
                warnings.warn(
                    f"{err}; item {candidate} skipped (skip_invalid=True) and replaced by the next valid item "
                    f"({len(self._skipped)} skipped so far in this process)",
                    SkippedRecordsWarning,
                    stacklevel=2,
                )
        raise self.format_error(f"no valid item left: all {length} items failed to load")
