"""YOLO's strong augmentations for the runs long enough to need them, and its last stretch without mosaics."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DistributedSampler

from vision_tx.lightning.budget import TrainingBudget


# name: (what messages call it, the datamodule attributes leading to its holder, the holder's probability
# attribute, the setting that turns it on)
AUGMENTATIONS = {
    "mosaic": ("mosaics", ("train_dataset",), "probability", "--data.mosaic_probability"),
    "mixup": ("mixup", ("train_dataset",), "mixup_probability", "--data.mixup_probability"),
    "copy_paste": ("copy-paste", ("train_dataset",), "copy_paste_probability", "--data.copy_paste_probability"),
    "affine": ("affine", ("train_transform", "affine"), "p", "the train transform's affine_probability"),
    "channel_permutation": ("channel permutation", ("train_transform", "channel_permutation"), "p",
                            "the train transform's channel_permutation_probability"),
    "vertical_flip": ("vertical flip", ("train_transform", "vertical_flip"), "p", "the train transform's vertical_flip_probability"),
    "quarter_turn": ("quarter turn", ("train_transform", "quarter_turn"), "p", "the train transform's quarter_turn_probability"),
}
CLOSED_AT_DROP = ("mosaic", "mixup", "copy_paste")  # YOLO's last stretch: the images as they are, for the boxes to settle


class LongRunAugmentation(pl.Callback):
    """Holds the training mosaics and the random affine (or the other ``augmentations`` named) off in
    short runs; in long ones they run until the learning rate drops, then the mosaics, mixup and copy-paste stop
    (YOLO's ``close_mosaic``).

    The augmentations are those the config sets, of those named in ``augmentations``
    (:data:`AUGMENTATIONS`): the mosaics of ``--data.mosaic_probability``
    (:class:`vision_tx.data.mosaic.MosaicDetection`), its mixup of ``--data.mixup_probability`` and copy-paste of
    ``--data.copy_paste_probability``, the affine of ``DetrTrainTransform``'s
    ``affine_probability``, its ``channel_permutation_probability``, ``vertical_flip_probability`` and
    ``quarter_turn_probability``.
    Several instances, each with its own names and threshold, may run side by side. They stay off until the run is known to last
    at least ``min_epochs`` epochs: from the start for a run of ``trainer.max_steps`` (or ``max_epochs``); for a
    ``--budget.minutes`` run, from the first epoch start at which the budget, at the pace of the epochs
    so far, makes that many. On 160-290 training images they cost AP at 40-70 epochs and add 0.01-0.10
    at 110-170, where the images would otherwise be learnt by heart (docs/LEARNING.md, "What each lever gave").
    The mosaics, mixup and copy-paste stop from the epoch after any optimiser group's ``lr`` first falls below its
    ``initial_lr``. ``min_epochs=0`` keeps the configured augmentations from the start and only closes
    the mosaics, mixup and copy-paste. Changes reach loader workers at their next sample (the probabilities are in shared
    memory). Epoch 0's are set in ``setup``, before Lightning starts the training iterator (and with it the workers'
    first batches); the epochs of both changes and the epoch of the next batch are kept in checkpoints, so a resumed
    run repeats them from its first batch (Lightning draws it before the epoch start, and calls none mid-epoch).
    """

    def __init__(self, min_epochs: float = 100.0, augmentations: Sequence[str] = ("mosaic", "affine")) -> None:
        if min_epochs < 0:
            raise ValueError(f"LongRunAugmentation: min_epochs must be at least 0, got {min_epochs}")
        unknown = [name for name in augmentations if name not in AUGMENTATIONS]
        if unknown or not augmentations:
            raise ValueError(f"LongRunAugmentation: augmentations must name some of {list(AUGMENTATIONS)}, got {list(augmentations)}")
        self.min_epochs = min_epochs
        self.augmentations = tuple(augmentations)
        self.names = " and ".join(AUGMENTATIONS[name][0] for name in self.augmentations)
        self.on_epoch: int | None = None  # the epoch from which the augmentations run
        self.drop_epoch: int | None = None  # the epoch in which the learning rate first dropped
        self._switches: list[tuple[str, Any, str, float]] = []  # (name, holder, attribute, configured probability)
        self._told_off = False
        self._next_epoch: int | None = None  # the epoch of the next batch, once a batch is done

    @property
    def state_key(self) -> str:
        """One checkpoint entry per instance: a resumed run gives each its own decisions back."""
        return self._generate_state_key(min_epochs=self.min_epochs, augmentations=self.augmentations)

    def state_dict(self) -> dict[str, Any]:
        return {"on_epoch": self.on_epoch, "drop_epoch": self.drop_epoch, "next_epoch": self._next_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.on_epoch, self.drop_epoch = state_dict["on_epoch"], state_dict["drop_epoch"]
        # Lightning draws the resumed run's first batches before any epoch start (mid-epoch, it calls none): set them now
        if state_dict.get("next_epoch") is not None:
            self._apply(state_dict["next_epoch"])

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Finds the configured augmentations and sets them for epoch 0 before any loader worker draws a sample
        (Lightning starts the training iterator before ``on_train_start``). A run of ``max_steps`` or
        ``max_epochs`` is decided here; a budget run's length is known only at a later epoch's start."""
        if stage != "fit":
            return
        self._switches = []
        for name in self.augmentations:
            _, path, attribute, _ = AUGMENTATIONS[name]
            holder = functools.reduce(lambda parent, child: getattr(parent, child, None), path, trainer.datamodule)
            if getattr(holder, attribute, 0) > 0:
                self._switches.append((name, holder, attribute, getattr(holder, attribute)))
        if not self._switches:
            nothing = " and no ".join(AUGMENTATIONS[name][0] for name in self.augmentations)
            settings = " or ".join(AUGMENTATIONS[name][3] for name in self.augmentations)
            raise TypeError(f"LongRunAugmentation: the training data has no {nothing} to switch; set {settings} above 0, "
                            "or leave this callback out")
        self.names = " and ".join(AUGMENTATIONS[name][0] for name, *_ in self._switches)  # the messages name only these
        if self._budget(trainer) is None:
            self._decide(trainer, epoch=0)
        self._apply(0)

    @staticmethod
    def _budget(trainer: pl.Trainer) -> TrainingBudget | None:
        return next((c for c in trainer.callbacks if isinstance(c, TrainingBudget) and c.minutes), None)

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
        """The run's length in epochs as far as it is known now, in ``setup`` or at an epoch's start (0 while unknown)."""
        budget = self._budget(trainer)
        if budget is not None:
            seconds = budget.elapsed()
            return trainer.current_epoch * 60 * budget.minutes / seconds if trainer.current_epoch and seconds > 0 else 0.0
        if trainer.max_steps > 0:
            return trainer.max_steps * trainer.accumulate_grad_batches / self.batches_per_epoch(trainer)
        return math.inf if trainer.max_epochs in (None, -1) else float(trainer.max_epochs)

    def _decide(self, trainer: pl.Trainer, epoch: int) -> None:
        """Turns the augmentations on from ``epoch`` once the run is known to make ``min_epochs``."""
        planned = self.planned_epochs(trainer)
        if trainer.strategy.reduce_boolean_decision(planned >= self.min_epochs, all=False):
            self.on_epoch = epoch
            rank_zero_info(f"LongRunAugmentation: {self.names} on from epoch {epoch} (the run makes about "
                           f"{planned:.0f} epochs, at least {self.min_epochs:g})")
        elif not self._told_off:
            self._told_off = True
            known = f"about {planned:.0f}" if planned else "not yet known"
            rank_zero_info(f"LongRunAugmentation: no {self.names.replace(' and ', ' or ')} while the run's length is under {self.min_epochs:g} "
                           f"epochs ({known})")

    def _apply(self, epoch: int) -> None:
        """Sets every switched probability for ``epoch``: as configured while on and not closed, else 0."""
        closed = self.drop_epoch is not None and epoch > self.drop_epoch
        for name, holder, attribute, configured in self._switches:
            closes = name in CLOSED_AT_DROP and closed
            on = self.on_epoch is not None and epoch >= self.on_epoch and not closes
            wanted = configured if on else 0.0
            if getattr(holder, attribute) != wanted:
                setattr(holder, attribute, wanted)
                if closes:
                    rank_zero_info(f"LongRunAugmentation: {AUGMENTATIONS[name][0]} off from epoch {epoch} "
                                   f"(the learning rate dropped in epoch {self.drop_epoch})")

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.on_epoch is None and self.drop_epoch is None and self._budget(trainer) is not None:
            self._decide(trainer, trainer.current_epoch)
        self._apply(trainer.current_epoch)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.drop_epoch is None and any(
            group["lr"] < group.get("initial_lr", group["lr"]) for optimizer in trainer.optimizers for group in optimizer.param_groups
        ):
            self.drop_epoch = trainer.current_epoch
        self._next_epoch = trainer.current_epoch + (batch_idx + 1 >= trainer.num_training_batches)
