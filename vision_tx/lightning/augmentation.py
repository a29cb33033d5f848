"""The long-run augmentation schedule a datamodule declares (:mod:`vision_tx.data.schedule`), applied as training goes:
YOLO's strong augmentations for the runs long enough to need them, and its last stretch without them."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DistributedSampler

from vision_tx.data.schedule import LongRun
from vision_tx.lightning.budget import TrainingBudget, budget_of

# what the messages call each augmentation a schedule may name
NAMES = {
    "mosaic": "mosaics",
    "mixup": "mixup",
    "copy_paste": "copy-paste",
    "affine": "affine",
    "channel_permutation": "channel permutation",
    "vertical_flip": "vertical flip",
    "quarter_turn": "quarter turn",
}


class LongRunAugmentation(pl.Callback):
    """Applies the datamodule's ``augmentation_schedule`` (a :class:`~vision_tx.data.schedule.LongRun` per
    augmentation, written in the config beside the probability it governs): each scheduled augmentation stays off
    until the run is known to last at least its ``from_epochs`` epochs, then runs at its configured probability; one
    that ``close_at_drop`` stops from the epoch after any optimiser group's ``lr`` first falls below its
    ``initial_lr``. Augmentations the schedule does not name are left as configured, and those it names at
    probability 0 (a command line's ``--data.mixup_probability 0``) have nothing to switch.

    It reads and sets the probabilities through the datamodule's ``augmentation_probabilities()`` and
    ``set_augmentation_probabilities()`` only; a datamodule with no ``augmentation_schedule`` (or an empty one) is
    left alone. ``tools/train.py`` always adds it. The run's length is known from the start for a run of
    ``trainer.max_steps`` (optimiser steps times ``accumulate_grad_batches`` over the batches of an epoch) or
    ``max_epochs``; for a ``--budget.minutes`` run, from the first epoch start at which the budget, at the pace of
    the epochs so far, makes that many. Each switch is logged. On 160-290 training images the strong
    augmentations cost AP at 40-70 epochs and add 0.01-0.10 at 110-170 (docs/LEARNING.md, "What each lever gave").

    Changes reach loader workers at their next sample (the probabilities are in shared memory). Epoch 0's are set
    in ``setup``, before Lightning starts the training iterator (and with it the workers' first batches); the
    epochs of the decisions and of the next batch are kept in checkpoints, so a resumed run repeats them from its
    first batch (Lightning draws it before the epoch start, and calls none mid-epoch).
    """

    def __init__(self) -> None:
        self.schedule: dict[str, LongRun] = {}
        self.configured: dict[str, float] = {}  # the scheduled augmentations' probabilities as the config sets them
        self.on_epochs: dict[float, int | None] = {}  # per run length: the epoch from which its augmentations run
        self.drop_epoch: int | None = None  # the epoch in which the learning rate first dropped
        self._told_off: set[float] = set()
        self._next_epoch: int | None = None  # the epoch of the next batch, once a batch is done
        self._datamodule: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "on_epochs": {f"{length:g}": epoch for length, epoch in self.on_epochs.items()},
            "drop_epoch": self.drop_epoch,
            "next_epoch": self._next_epoch,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        restored = {float(length): epoch for length, epoch in state_dict["on_epochs"].items()}
        self.on_epochs = {length: restored.get(length) for length in self.on_epochs}
        self.drop_epoch = state_dict["drop_epoch"]
        # Lightning draws the resumed run's first batches before any epoch start (mid-epoch, it calls none): set them
        # now
        if state_dict.get("next_epoch") is not None:
            self._apply(state_dict["next_epoch"])

    def names(self, length: float) -> str:
        """The augmentations that turn on from runs of ``length`` epochs, as the messages name them."""
        return " and ".join(NAMES[name] for name, entry in self.schedule.items() if entry.from_epochs == length)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Reads the datamodule's schedule and sets the augmentations for epoch 0 before any loader worker draws a
        sample (Lightning starts the training iterator before ``on_train_start``). A run of ``max_steps`` or
        ``max_epochs`` is decided here; a budget run's length is known only at a later epoch's start."""
        if stage != "fit":
            return
        self._datamodule = datamodule = trainer.datamodule
        schedule = getattr(datamodule, "augmentation_schedule", None) or {}
        if not schedule:
            return
        probabilities = datamodule.augmentation_probabilities()
        # an augmentation configured at 0 has nothing to switch, and the messages leave it out
        self.schedule = {name: entry for name, entry in schedule.items() if probabilities[name] > 0}
        self.configured = {name: probabilities[name] for name in self.schedule}
        self.on_epochs = {length: None for length in sorted({entry.from_epochs for entry in self.schedule.values()})}
        if budget_of(trainer) is None:
            for length in self.on_epochs:
                self._decide(trainer, length, epoch=0)
        self._apply(0)

    @staticmethod
    def batches_per_epoch(trainer: pl.Trainer) -> int:
        """Training batches a process makes in an epoch, from the datamodule's loader before Lightning iterates it:
        a plain sampler is split over the processes by Lightning, a ``DistributedSampler`` is the process's own."""
        loader = trainer.datamodule.train_dataloader()
        batches = len(loader)
        if not isinstance(getattr(loader, "sampler", None), DistributedSampler):
            batches = math.ceil(batches / trainer.world_size)
        limit = trainer.limit_train_batches
        return max(min(batches, limit) if isinstance(limit, int) else int(batches * limit), 1)

    def planned_epochs(self, trainer: pl.Trainer) -> float:
        """The run's length in epochs as far as it is known now, in ``setup`` or at an epoch's start (0 while
        unknown)."""
        budget: TrainingBudget | None = budget_of(trainer)
        if budget is not None:
            seconds = budget.elapsed()
            return (
                trainer.current_epoch * 60 * budget.minutes / seconds if trainer.current_epoch and seconds > 0 else 0.0
            )
        if trainer.max_steps > 0:
            return trainer.max_steps * trainer.accumulate_grad_batches / self.batches_per_epoch(trainer)
        return math.inf if trainer.max_epochs in (None, -1) else float(trainer.max_epochs)

    def _decide(self, trainer: pl.Trainer, length: float, epoch: int) -> None:
        """Turns the augmentations of runs of ``length`` epochs on from ``epoch`` once the run is known to make that."""
        planned = self.planned_epochs(trainer)
        if trainer.strategy.reduce_boolean_decision(planned >= length, all=False):
            self.on_epochs[length] = epoch
            rank_zero_info(
                f"LongRunAugmentation: {self.names(length)} on from epoch {epoch} (the run makes about "
                f"{planned:.0f} epochs, the schedule's from_epochs {length:g})"
            )
        elif length not in self._told_off:
            self._told_off.add(length)
            known = f"about {planned:.0f}" if planned else "not yet known"
            names = self.names(length).replace(" and ", " or ")
            rank_zero_info(
                f"LongRunAugmentation: no {names} while the run's length is under the schedule's "
                f"from_epochs {length:g} ({known})"
            )

    def _apply(self, epoch: int) -> None:
        """Sets every scheduled probability for ``epoch``: as configured while on and not closed, else 0."""
        if not self.schedule:  # a datamodule with nothing scheduled (or none of the interface) is left alone
            return
        closed = self.drop_epoch is not None and epoch > self.drop_epoch
        current = self._datamodule.augmentation_probabilities()
        wanted: dict[str, float] = {}
        for name, entry in self.schedule.items():
            closes = entry.close_at_drop and closed
            on_epoch = self.on_epochs[entry.from_epochs]
            on = on_epoch is not None and epoch >= on_epoch and not closes
            wanted[name] = self.configured[name] if on else 0.0
            if closes and current[name] != 0.0:
                rank_zero_info(
                    f"LongRunAugmentation: {NAMES[name]} off from epoch {epoch} "
                    f"(the learning rate dropped in epoch {self.drop_epoch})"
                )
        if wanted:
            self._datamodule.set_augmentation_probabilities(wanted)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.schedule:
            return
        if self.drop_epoch is None and budget_of(trainer) is not None:
            for length, on_epoch in self.on_epochs.items():
                if on_epoch is None:
                    self._decide(trainer, length, trainer.current_epoch)
        self._apply(trainer.current_epoch)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.schedule:
            return
        if self.drop_epoch is None and any(
            group["lr"] < group.get("initial_lr", group["lr"])
            for optimizer in trainer.optimizers
            for group in optimizer.param_groups
        ):
            self.drop_epoch = trainer.current_epoch
        self._next_epoch = trainer.current_epoch + (batch_idx + 1 >= trainer.num_training_batches)
