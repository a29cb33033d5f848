"""Training batches that depend only on (seed, epoch), so that a run resumes mid-epoch exactly.

``ResumableLoader`` is the training DataLoader of every datamodule. Its order comes from
``EpochSampler`` (a seed + epoch permutation, shared out among the processes like
``DistributedSampler``) and each sample's augmentations from a generator seeded by
``(seed, epoch, index)`` (``SeededSamples``), so neither depends on the number of workers nor on
what the process did before. Lightning saves ``ResumableLoader.state_dict()`` (epoch, batches
served) in checkpoints and hands it back on resume; the next epoch's iteration then skips the
batches already trained on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def process_share() -> tuple[int, int]:
    """``(world_size, rank)`` of the running process group, ``(1, 0)`` outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The augmentation seed of sample ``index`` in ``epoch`` of a run with ``seed``: a well-mixed 32-bit function of
    the three."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1)[0])


class SeededSamples(Dataset):
    """``dataset`` read with keys ``(index, seed)``: ``dataset[index]`` with torch's generator seeded by ``seed``.

    The process's own generator state is put back afterwards, so reading data never changes the
    random numbers the model draws (dropout).
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, seed = key
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.dataset[index]


class EpochSampler(DistributedSampler):
    """This process's share of a permutation drawn from ``seed + epoch``, as ``(index, sample_seed)`` keys.

    Global batch ``t`` (``batch_size`` per process, ``world_size`` processes) is the permutation's
    slice ``[t * batch_size * world_size, (t + 1) * batch_size * world_size)`` and process ``r``
    takes its ``r``-th block of ``batch_size``: the same images, grouped the same way, as one
    process with ``accumulate_grad_batches=world_size``. The incomplete last global batch is
    dropped. ``skip`` (set by ``ResumableLoader``) drops the first keys of the next iteration.
    With ``repeats > 1`` (DeiT's repeated augmentation) each index of the permutation comes
    ``repeats`` times in a row, the epoch cut back to the dataset's length: a global batch holds
    ``repeats`` differently augmented copies of each of its images (copy ``c`` is seeded as index
    ``index + c * len(dataset)``).
    ``num_replicas`` and ``rank`` default to the running process group's.
    Being a ``DistributedSampler``, it is left in place by Lightning under DDP.
    """

    def __init__(
        self,
        dataset: Sequence,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        repeats: int = 1,
    ) -> None:
        if repeats < 1:
            raise ValueError(f"EpochSampler: repeats must be >= 1, got {repeats}")
        world_size, own_rank = process_share()
        world_size = world_size if num_replicas is None else num_replicas
        super().__init__(
            dataset,
            num_replicas=world_size,
            rank=own_rank if rank is None else rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=True,
        )
        self.batch_size = batch_size
        self.repeats = repeats
        self.num_samples = len(dataset) // (batch_size * world_size) * batch_size
        self.total_size = self.num_samples * world_size
        self.skip = 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        if self.shuffle:
            order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(len(self.dataset))
        copies = torch.arange(self.repeats).repeat(len(order))
        order = order.repeat_interleave(self.repeats)
        keyed = torch.stack([order, order + copies * len(self.dataset)], 1)[: self.total_size]
        mine = keyed.view(-1, self.num_replicas, self.batch_size, 2)[:, self.rank].flatten(0, 1).tolist()[self.skip :]
        self.skip = 0
        return iter([(index, sample_seed(self.seed, self.epoch, seed_index)) for index, seed_index in mine])


class ResumableLoader(DataLoader):
    """A training DataLoader over ``dataset`` whose batches are fixed by (seed, epoch) and which resumes mid-epoch.

    ``seed`` defaults to the one given to ``seed_everything`` (``PL_GLOBAL_SEED``), else 0.
    ``state_dict()`` holds the epoch and the batches served in it; after ``load_state_dict`` the
    next iteration of that epoch starts after them (Lightning's fit loop calls both, through its
    check for a ``_Stateful`` loader). The length stays the whole epoch's, as Lightning expects.
    ``repeats`` is the repeated augmentation of :class:`EpochSampler`. Other keyword arguments go to ``DataLoader``.
    """

    def __init__(
        self, dataset: Dataset, batch_size: int, seed: int | None = None, repeats: int = 1, **kwargs: Any
    ) -> None:
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0)) if seed is None else seed
        # The loader's own generator seeds the workers, so creating an iterator draws nothing
        # from the process's generator either.
        super().__init__(
            SeededSamples(dataset),
            batch_size=batch_size,
            sampler=EpochSampler(dataset, batch_size, seed, repeats=repeats),
            drop_last=True,
            generator=torch.Generator().manual_seed(seed),
            **kwargs,
        )
        self._epoch = 0
        self._served = 0
        self._resume_at: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        # A generator: the epoch is read at the first batch, after Lightning's ``set_epoch``.
        epoch = self.sampler.epoch
        skip = self._resume_at[1] if self._resume_at is not None and self._resume_at[0] == epoch else 0
        self._resume_at = None
        self.sampler.skip = skip * self.batch_size
        self._epoch, self._served = epoch, skip
        for batch in super().__iter__():
            self._served += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "batches": self._served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_at = (int(state["epoch"]), int(state["batches"]))
