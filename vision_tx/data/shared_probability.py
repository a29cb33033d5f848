"""A probability that a running training can change, loader workers included.

A ``DataLoader`` with persistent workers gives each worker its own copy of the dataset when it starts,
so setting a plain attribute later changes only the main process's copy. Kept in a one-element
shared-memory tensor, the value set in the main process is the value every worker reads at its next
sample (:class:`vision_tx.lightning.augmentation.LongRunAugmentation` switches augmentations so).
"""

from __future__ import annotations

from typing import Any

import torch


class SharedProbability:
    """A descriptor: ``obj.<name>`` reads and writes a float in [0, 1] kept in shared memory."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.public_name = name
        self.storage_name = f"_shared_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return float(obj.__dict__[self.storage_name])

    def __set__(self, obj: Any, value: float) -> None:
        value = float(value)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{type(obj).__name__}: {self.public_name} must lie in [0, 1], got {value}")
        shared = obj.__dict__.get(self.storage_name)
        if shared is None:  # __dict__ directly: an nn.Module would take the tensor for a buffer
            obj.__dict__[self.storage_name] = torch.tensor(value, dtype=torch.float64).share_memory_()
        else:
            shared.fill_(value)
