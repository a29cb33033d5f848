"""When a configured augmentation runs: the long-run schedule written beside its probability.

A datamodule or a training transform takes ``augmentation_schedule``, a mapping from the name of one of its
augmentations to a :class:`LongRun` (or the mapping of its fields, as a config writes it)::

    mixup_probability: 0.5
    augmentation_schedule:
      mixup: {from_epochs: 40, close_at_drop: true}

An augmentation the schedule does not name runs at its probability throughout. The schedule is read and applied by
:class:`vision_tx.lightning.augmentation.LongRunAugmentation`, through the holder's
``augmentation_probabilities()`` and ``set_augmentation_probabilities()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LongRun:
    """An augmentation held off (probability 0) unless the run is known to last at least ``from_epochs`` epochs;
    with ``close_at_drop``, off again from the epoch after the learning rate first drops (YOLO's last stretch)."""

    from_epochs: float = 0.0
    close_at_drop: bool = False

    def __post_init__(self) -> None:
        if not self.from_epochs >= 0:
            raise ValueError(f"LongRun: from_epochs must be at least 0, got {self.from_epochs}")


def read_schedule(
    owner: str, schedule: Mapping[str, LongRun | Mapping[str, Any]] | None, probabilities: Mapping[str, float]
) -> dict[str, LongRun]:
    """``schedule`` as :class:`LongRun` entries, checked against ``probabilities`` (the holder's augmentations by
    name): each entry names one of them. An entry whose probability is 0 (``--data.mixup_probability 0`` over a
    config that schedules mixup) switches nothing, and the messages leave it out. ``owner`` names the holder in
    errors."""
    entries: dict[str, LongRun] = {}
    for name, entry in (schedule or {}).items():
        if name not in probabilities:
            raise ValueError(
                f"{owner}: augmentation_schedule names {name!r}; its augmentations are {sorted(probabilities)}"
            )
        entries[name] = entry if isinstance(entry, LongRun) else LongRun(**entry)
    return entries
