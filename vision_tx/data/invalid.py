"""Skipping invalid records when a dataset is built with ``skip_invalid=True``.

Without the option every invalid record is an error that names the file, the record and the
problem. With it, records found invalid while the dataset is built are left out with one warning
(the count and the first examples), and an item that fails when it is read (a corrupt image, a
label map that does not fit its image) is replaced by the next valid item, with a warning naming
it: the dataset keeps its length, so every DDP process still gets the same number of batches.
"""

from __future__ import annotations

import warnings
from typing import Callable, Sequence, TypeVar

Item = TypeVar("Item")
EXAMPLES_SHOWN = 3


class InvalidDataError(ValueError):
    """A dataset file or record that cannot be used: the message names the file, the record and the problem."""


class SkippedRecordsWarning(UserWarning):
    """Invalid records were skipped because the dataset was built with ``skip_invalid=True``."""


def warn_skipped(source: object, problems: Sequence[str], total: int, records: str) -> None:
    """One warning: ``len(problems)`` of the ``total`` ``records`` of ``source`` were skipped, and why."""
    shown = "\n  ".join(problems[:EXAMPLES_SHOWN]) + ("\n  ..." if len(problems) > EXAMPLES_SHOWN else "")
    warnings.warn(
        f"{source}: skipped {len(problems)} of {total} {records} with invalid data (skip_invalid=True):\n  {shown}",
        SkippedRecordsWarning,
        stacklevel=3,
    )


def load_skipping_invalid(
    load: Callable[[int], Item], index: int, length: int, error: type[Exception], skipped: set[int]
) -> Item:
    """``load(index)``, or where it raises ``error`` the first of the following indices (in a circle) that
    loads. Indices that failed go in ``skipped`` (per process) and are warned about once."""
    for offset in range(length):
        candidate = (index + offset) % length
        if candidate in skipped:
            continue
        try:
            return load(candidate)
        except error as err:
            skipped.add(candidate)
            warnings.warn(
                f"{err}; item {candidate} skipped (skip_invalid=True) and replaced by the next valid item "
                f"({len(skipped)} skipped so far in this process)",
                SkippedRecordsWarning,
                stacklevel=3,
            )
    raise error(f"no valid item left: all {length} items failed to load")
