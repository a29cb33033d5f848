"""Training batches that depend only on (seed, epoch), so that a run resumes mid-epoch exactly.

``ResumableLoader`` is the training DataLoader of every datamodule. Its order comes from
``EpochSampler`` (a seed + epoch permutation, shared out among the processes like
``DistributedSampler``, optionally grouped into batches of one orientation) and each sample's augmentations from a
generator seeded by ``(seed, epoch, index)`` (``SeededSamples``), with one number drawn per batch for what
a batch shares (:func:`batch_draw`: its image scale), so none depends on the number of workers nor on what the
process did before. Lightning saves ``ResumableLoader.state_dict()`` (epoch, batches
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


def sample_seed(seed: int, epoch: int, index: int, stream: int = 0) -> int:
    """The augmentation seed of sample ``index`` in ``epoch`` of a run with ``seed``: a well-mixed 32-bit function of
    the three (``stream`` 1: the draw of micro-batch ``index``, :func:`batch_draw`)."""
    entropy = [seed, epoch, index] + ([stream] if stream else [])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


_batch_draw: int | None = None  # set by SeededSamples while it reads a sample of a batch


def batch_draw() -> int | None:
    """The random 32-bit number every sample of the batch being read shares (for what a batch draws once,
    such as the scale of its images), or None outside :class:`SeededSamples` (a sample read on its own)."""
    return _batch_draw


def grouped_by_orientation(keys: torch.Tensor, portrait: torch.Tensor, group: int) -> torch.Tensor:
    """The rows of ``keys [N, 2]`` (``(index, seed index)``, in order) regrouped so that each run of ``group`` rows
    holds images of one orientation (``portrait [len(dataset)]`` bool, indexed by ``index``): rows go into one queue
    per orientation and a queue that fills to ``group`` is emitted whole (detectron2's aspect-ratio grouping); the
    rows of the queues left unfilled follow at the end. A batch of one orientation pads less."""
    queues: dict[bool, list[int]] = {False: [], True: []}
    order: list[int] = []
    for row, tall in enumerate(portrait[keys[:, 0]].tolist()):
        queue = queues[tall]
        queue.append(row)
        if len(queue) == group:
            order.extend(queue)
            queue.clear()
    return keys[order + queues[False] + queues[True]]


def portrait_images(dataset: Dataset) -> np.ndarray:
    """Whether each image of ``dataset`` is taller than wide, ``[len(dataset)]`` bool, from the image sizes of its
    annotation file (``heights`` and ``widths``, as :class:`~vision_tx.data.coco.CocoDetection` reads them), found
    through the datasets it wraps (``.dataset``)."""
    inner = dataset
    while not hasattr(inner, "heights") and hasattr(inner, "dataset"):
        inner = inner.dataset
    if not hasattr(inner, "heights"):
        raise TypeError(f"{type(dataset).__name__}: no image sizes (heights, widths) to group the batches by")
    return np.asarray(inner.heights) > np.asarray(inner.widths)


class SeededSamples(Dataset):
    """``dataset`` read with keys ``(index, seed, batch)``: ``dataset[index]`` with torch's generator seeded by
    ``seed`` and :func:`batch_draw` giving ``batch`` (keys ``(index, seed)``: no batch draw).

    The process's own generator state is put back afterwards, so reading data never changes the
    random numbers the model draws (dropout).
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, ...]) -> Any:
        global _batch_draw
        index, seed, *batch = key
        with torch.random.fork_rng(devices=[]):
            # Only the CPU generator: torch.manual_seed also queues a seed for each uninitialised GPU backend,
            # recording the call's stack each time (about 2 ms a sample).
            torch.default_generator.manual_seed(seed)
            _batch_draw = batch[0] if batch else None
            try:
                return self.dataset[index]
            finally:
                _batch_draw = None


class EpochSampler(DistributedSampler):
    """This process's share of a permutation drawn from ``seed + epoch``, as ``(index, sample_seed, batch draw)`` keys.

    Global batch ``t`` (``batch_size`` per process, ``world_size`` processes) is the permutation's
    slice ``[t * batch_size * world_size, (t + 1) * batch_size * world_size)`` and process ``r``
    takes its ``r``-th block of ``batch_size``: the same images, grouped the same way, as one
    process with ``accumulate_grad_batches=world_size``. The incomplete last global batch is
    dropped. ``skip`` (set by ``ResumableLoader``) drops the first keys of the next iteration.
    With ``repeats > 1`` (DeiT's repeated augmentation) each index of the permutation comes
    ``repeats`` times in a row, the epoch cut back to the dataset's length: a global batch holds
    ``repeats`` differently augmented copies of each of its images (copy ``c`` is seeded as index
    ``index + c * len(dataset)``).
    With ``portrait`` (bool per image, taller than wide) each process's batch holds images of one orientation
    (:func:`grouped_by_orientation` in runs of ``batch_size``, applied to the permutation before it is cut into
    global batches). Every key of a process's batch carries the same batch draw (:func:`batch_draw`), from
    ``(seed, epoch, m)`` with ``m`` the batch's number among one process's micro-batches (``t * world_size + r``):
    both keep the equivalence with gradient accumulation.
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
        portrait: Sequence[bool] | None = None,
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
        if portrait is not None and len(portrait) != len(dataset):
            raise ValueError(f"EpochSampler: {len(portrait)} orientations for a dataset of {len(dataset)} images")
        self.portrait = None if portrait is None else torch.as_tensor(portrait, dtype=torch.bool)
        self.num_samples = len(dataset) // (batch_size * world_size) * batch_size
        self.total_size = self.num_samples * world_size
        self.skip = 0

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        if self.shuffle:
            order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(len(self.dataset))
        copies = torch.arange(self.repeats).repeat(len(order))
        order = order.repeat_interleave(self.repeats)
        keyed = torch.stack([order, order + copies * len(self.dataset)], 1)[: len(self.dataset)]
        if self.portrait is not None:
            keyed = grouped_by_orientation(keyed, self.portrait, self.batch_size)
        mine = keyed[: self.total_size].view(-1, self.num_replicas, self.batch_size, 2)[:, self.rank]
        # numbered as one process's micro-batches would be: the draws of gradient accumulation's batches
        draws = [
            sample_seed(self.seed, self.epoch, batch * self.num_replicas + self.rank, stream=1)
            for batch in range(mine.shape[0])
        ]
        keys = [
            (index, sample_seed(self.seed, self.epoch, seed_index), draws[batch])
            for batch, rows in enumerate(mine.tolist())
            for index, seed_index in rows
        ]
        self.skip, skip = 0, self.skip
        return iter(keys[skip:])


class ResumableLoader(DataLoader):
    """A training DataLoader over ``dataset`` whose batches are fixed by (seed, epoch) and which resumes mid-epoch.

    ``seed`` defaults to the one given to ``seed_everything`` (``PL_GLOBAL_SEED``), else 0.
    ``state_dict()`` holds the epoch and the batches served in it; after ``load_state_dict`` the
    next iteration of that epoch starts after them (Lightning's fit loop calls both, through its
    check for a ``_Stateful`` loader). The length stays the whole epoch's, as Lightning expects.
    ``repeats`` is the repeated augmentation of :class:`EpochSampler`, ``portrait`` its grouping by orientation.
    Other keyword arguments go to ``DataLoader``.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        seed: int | None = None,
        repeats: int = 1,
        portrait: Sequence[bool] | None = None,
        **kwargs: Any,
    ) -> None:
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0)) if seed is None else seed
        # The loader's own generator seeds the workers, so creating an iterator draws nothing
        # from the process's generator either.
        super().__init__(
            SeededSamples(dataset),
            batch_size=batch_size,
            sampler=EpochSampler(dataset, batch_size, seed, repeats=repeats, portrait=portrait),
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
