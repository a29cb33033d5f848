"""LongRunAugmentation applies the datamodule's augmentation_schedule: each scheduled augmentation held off in runs
shorter than its from_epochs, on in long ones, those that close_at_drop closed after the learning-rate drop, every
change seen by persistent loader workers, the first batches too (a worker starts drawing before ``on_train_start``);
several run lengths side by side, each decided on its own; a resumed run drawn as the run it continues from its first
batch. It reads and sets the probabilities through the datamodule's public interface only."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchvision.transforms import v2

from vision_tx.data.schedule import LongRun
from vision_tx.data.shared_probability import SharedProbability
from vision_tx.data.transforms import SwitchableRandomApply
from vision_tx.lightning.augmentation import LongRunAugmentation
from vision_tx.lightning.budget import TrainingBudget

MOSAIC, MIXUP, AFFINE, PERMUTATION, VERTICAL_FLIP, QUARTER_TURN, COPY_PASTE = 0.5, 0.375, 1.0, 0.25, 0.75, 0.625, 0.875
BATCHES_PER_EPOCH, DROP_STEP = 2, 7  # the rate drops after the first batch of epoch 3


class Probe(Dataset):
    """Each sample is the (mosaic, mixup, affine, channel permutation, vertical flip, quarter turn, copy-paste)
    probabilities as the process that reads it sees them."""

    probability = SharedProbability()
    mixup_probability = SharedProbability()
    copy_paste_probability = SharedProbability()

    def __init__(self, transform: SimpleNamespace) -> None:
        self.probability = MOSAIC
        self.mixup_probability = MIXUP
        self.copy_paste_probability = COPY_PASTE
        self.transform = transform
        self.drawn = multiprocessing.Event()  # set once a sample is drawn, in whichever process

    def __len__(self) -> int:
        return 4 * BATCHES_PER_EPOCH

    def __getitem__(self, index: int) -> torch.Tensor:
        sample = torch.tensor(
            [
                self.probability,
                self.mixup_probability,
                self.transform.affine.p,
                self.transform.channel_permutation.p,
                self.transform.vertical_flip.p,
                self.transform.quarter_turn.p,
                self.copy_paste_probability,
            ]
        )
        self.drawn.set()
        return sample


class ProbeData(pl.LightningDataModule):
    """The schedule's datamodule interface over the probe: ``augmentation_schedule``, ``augmentation_probabilities()``
    and ``set_augmentation_probabilities()``."""

    DATASET = {"mosaic": "probability", "mixup": "mixup_probability", "copy_paste": "copy_paste_probability"}

    def __init__(self, workers: int, schedule: dict[str, LongRun] | None = None) -> None:
        super().__init__()
        self.workers = workers
        self.augmentation_schedule = schedule or {}
        self.train_transform = SimpleNamespace(
            affine=SwitchableRandomApply([v2.Identity()], p=AFFINE),
            channel_permutation=SwitchableRandomApply([v2.Identity()], p=PERMUTATION),
            vertical_flip=SwitchableRandomApply([v2.Identity()], p=VERTICAL_FLIP),
            quarter_turn=SwitchableRandomApply([v2.Identity()], p=QUARTER_TURN),
        )
        self.train_dataset = Probe(self.train_transform)

    def augmentation_probabilities(self) -> dict[str, float]:
        transform = self.train_transform
        return {
            **{name: getattr(self.train_dataset, attribute) for name, attribute in self.DATASET.items()},
            "affine": transform.affine.p,
            "channel_permutation": transform.channel_permutation.p,
            "vertical_flip": transform.vertical_flip.p,
            "quarter_turn": transform.quarter_turn.p,
        }

    def set_augmentation_probabilities(self, probabilities: dict[str, float]) -> None:
        for name, probability in probabilities.items():
            if name in self.DATASET:
                setattr(self.train_dataset, self.DATASET[name], probability)
            else:
                getattr(self.train_transform, name).p = probability

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_dataset, batch_size=4, num_workers=self.workers, persistent_workers=self.workers > 0
        )


class Recorder(pl.LightningModule):
    """Records (epoch, mosaic, mixup, affine, permutation, vertical flip, quarter turn and copy-paste probabilities) of
    every batch; the rate
    drops by 10 at ``DROP_STEP``. With ``first_draw``, training starts only once a loader worker has drawn a sample: the
    race a fast worker wins, made certain."""

    def __init__(self, first_draw: Any = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(7, 1)
        self.seen: list[tuple[float, ...]] = []
        self.first_draw = first_draw

    def on_train_start(self) -> None:
        if self.first_draw is not None:
            assert self.first_draw.wait(timeout=60), "the loader worker drew nothing before training started"

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, *(float(p) for p in batch[0])))
        return self.layer(batch).square().mean()

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [DROP_STEP], gamma=0.1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


# The schedules of the old defaults (the mosaics, closed at the drop, and the affine) and of the recipe
def mosaics_and_affine(length: float) -> dict[str, LongRun]:
    return {"mosaic": LongRun(length, close_at_drop=True), "affine": LongRun(length)}


def recipe(length: float) -> dict[str, LongRun]:
    return {
        "mixup": LongRun(length, True),
        "copy_paste": LongRun(length, True),
        "channel_permutation": LongRun(length),
        "vertical_flip": LongRun(length),
    }


def fit(
    schedule: dict[str, LongRun],
    max_steps: int,
    workers: int = 0,
    save_to: Path | None = None,
    resume_from: Path | None = None,
    callback: LongRunAugmentation | None = None,
    accumulate: int = 1,
) -> list[tuple[float, ...]]:
    """Trains ``max_steps`` on the probe data of ``schedule``; ``save_to`` keeps a checkpoint after every step
    (``step=N.ckpt``), ``resume_from`` resumes one."""
    data = ProbeData(workers, schedule)
    model = Recorder(data.train_dataset.drawn if workers else None)
    callbacks = [callback if callback is not None else LongRunAugmentation()]
    if save_to is not None:
        callbacks = [*callbacks, pl.callbacks.ModelCheckpoint(save_to, "{step}", every_n_train_steps=1, save_top_k=-1)]
    trainer = pl.Trainer(
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=save_to is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        accumulate_grad_batches=accumulate,
    )
    trainer.fit(model, datamodule=data, ckpt_path=resume_from)
    return model.seen


def planned_trainer(data: ProbeData, max_steps: int = 12, **fields: Any) -> SimpleNamespace:
    """The trainer fields ``setup`` reads, for a ``max_steps`` run of one process on ``data``."""
    return SimpleNamespace(
        **{
            "datamodule": data,
            "callbacks": [],
            "max_steps": max_steps,
            "accumulate_grad_batches": 1,
            "world_size": 1,
            "limit_train_batches": 1.0,
            "max_epochs": -1,
            "strategy": SimpleNamespace(reduce_boolean_decision=lambda decision, all: decision),
            **fields,
        }
    )


def test_a_long_run_augments_until_the_drop_then_closes_the_mosaics_in_persistent_workers() -> None:
    callback = LongRunAugmentation()  # 12 steps of 2 per epoch: 6 epochs, long enough
    seen = fit(mosaics_and_affine(6), max_steps=12, workers=1, callback=callback)
    assert callback.on_epochs == {6.0: 0} and callback.drop_epoch == (DROP_STEP - 1) // BATCHES_PER_EPOCH
    expected = [
        (
            epoch,
            MOSAIC if epoch <= callback.drop_epoch else 0.0,
            MIXUP,
            AFFINE,
            PERMUTATION,
            VERTICAL_FLIP,
            QUARTER_TURN,
            COPY_PASTE,
        )
        for epoch in range(6)
        for _ in range(2)
    ]
    assert seen == expected


def test_mixup_and_copy_paste_run_with_the_permutation_and_close_at_the_drop_as_the_mosaics() -> None:
    """The recipe's 40-epoch schedule: mixup, copy-paste, the permutation and the flip; only mixup and copy-paste
    stop after the drop."""
    callback = LongRunAugmentation()
    seen = fit(recipe(6), max_steps=12, workers=1, callback=callback)
    open_ = [epoch <= callback.drop_epoch for epoch in range(6)]
    assert seen == [
        (
            epoch,
            MOSAIC,
            MIXUP if open_[epoch] else 0.0,
            AFFINE,
            PERMUTATION,
            VERTICAL_FLIP,
            QUARTER_TURN,
            COPY_PASTE if open_[epoch] else 0.0,
        )
        for epoch in range(6)
        for _ in range(2)
    ]
    assert callback.names(6) == "mixup and copy-paste and channel permutation and vertical flip"
    data = ProbeData(0, recipe(6))
    data.train_dataset.mixup_probability = 0.0  # scheduled but configured at 0: not switched, and not in the messages
    unconfigured = LongRunAugmentation()
    unconfigured.setup(planned_trainer(data), None, "fit")
    assert unconfigured.names(6) == "copy-paste and channel permutation and vertical flip"
    short = fit({"mixup": LongRun(6.5, True)}, max_steps=12)
    assert short == [
        (epoch, MOSAIC, 0.0, AFFINE, PERMUTATION, VERTICAL_FLIP, QUARTER_TURN, COPY_PASTE)
        for epoch in range(6)
        for _ in range(2)
    ]


def test_a_short_run_is_not_augmented() -> None:
    callback = LongRunAugmentation()  # the same 6 epochs, now short of the threshold
    assert fit(mosaics_and_affine(6.5), max_steps=12, callback=callback) == [
        (epoch, 0.0, MIXUP, 0.0, PERMUTATION, VERTICAL_FLIP, QUARTER_TURN, COPY_PASTE)
        for epoch in range(6)
        for _ in range(2)
    ]
    assert callback.on_epochs == {6.5: None}


@pytest.mark.parametrize(("length", "on"), [(6.0, True), (6.5, False)])
def test_a_step_run_counts_its_accumulated_batches_as_epochs(length: float, on: bool) -> None:
    """6 optimiser steps of 2 accumulated batches each, at 2 batches an epoch: 6 epochs, not 3."""
    callback = LongRunAugmentation()
    trainer = planned_trainer(ProbeData(0, mosaics_and_affine(length)), max_steps=6, accumulate_grad_batches=2)
    assert callback.planned_epochs(trainer) == pytest.approx(6.0)
    callback.setup(trainer, None, "fit")
    assert (callback.on_epochs[length] == 0) is on
    seen = fit(mosaics_and_affine(length), max_steps=6, accumulate=2)  # and so in a real run, all 12 batches
    assert len(seen) == 12 and {batch[3] for batch in seen} == {AFFINE if on else 0.0}


@pytest.mark.parametrize(("length", "on"), [(20.0, True), (20.5, False)])
def test_a_budget_run_is_long_when_its_pace_makes_from_epochs(length: float, on: bool) -> None:
    budget = TrainingBudget(minutes=1.0)
    budget.elapsed = lambda: 6.0  # two epochs in 6 s: 20 epochs in the minute
    trainer = SimpleNamespace(
        callbacks=[budget],
        current_epoch=2,
        max_steps=-1,
        datamodule=ProbeData(0, mosaics_and_affine(length)),
        strategy=SimpleNamespace(reduce_boolean_decision=lambda decision, all: decision),
    )
    callback = LongRunAugmentation()
    callback.setup(trainer, None, "fit")
    assert callback.on_epochs == {length: None}  # a budget run is not decided before its epochs have a pace
    assert callback.planned_epochs(trainer) == pytest.approx(20.0)
    callback.on_train_epoch_start(trainer, None)
    assert (callback.on_epochs[length] == 2) is on
    assert trainer.datamodule.augmentation_probabilities()["affine"] == (AFFINE if on else 0.0)
    trainer.current_epoch = 0  # nothing is known before the first epoch ends
    assert LongRunAugmentation().planned_epochs(trainer) == 0.0


@pytest.mark.parametrize(
    "step", [7, 8, 9]
)  # in the epoch of the drop (3): mid-epoch and at its end; mid-epoch in the next
def test_a_resumed_run_draws_its_first_batches_as_the_run_it_continues(tmp_path: Path, step: int) -> None:
    """The resumed run's first batches are drawn before any epoch start (mid-epoch, Lightning calls none): the
    checkpoint's next epoch is set before the worker draws, so the mosaics stay closed after the drop and a short run
    stays held off."""
    long_run = LongRunAugmentation()
    fit(mosaics_and_affine(6), max_steps=12, save_to=tmp_path / "long", callback=long_run)
    fit(mosaics_and_affine(6.5), max_steps=12, save_to=tmp_path / "short")
    resumed = fit(mosaics_and_affine(6), max_steps=12, workers=1, resume_from=tmp_path / "long" / f"step={step}.ckpt")
    assert resumed and resumed[0][0] == step // BATCHES_PER_EPOCH  # the epoch of the next batch
    assert resumed == [
        (
            epoch,
            MOSAIC if epoch <= long_run.drop_epoch else 0.0,
            MIXUP,
            AFFINE,
            PERMUTATION,
            VERTICAL_FLIP,
            QUARTER_TURN,
            COPY_PASTE,
        )
        for epoch, *_ in resumed
    ]
    resumed_short = fit(
        mosaics_and_affine(6.5), max_steps=12, workers=1, resume_from=tmp_path / "short" / f"step={step}.ckpt"
    )
    assert resumed_short and all(
        seen[1:] == (0.0, MIXUP, 0.0, PERMUTATION, VERTICAL_FLIP, QUARTER_TURN, COPY_PASTE) for seen in resumed_short
    )


@pytest.mark.parametrize(
    ("world_size", "limit", "distributed", "batches"),
    [(1, 1.0, False, 5), (2, 1.0, False, 3), (2, 1.0, True, 5), (1, 4, False, 4), (1, 0.5, False, 2)],
)
def test_batches_per_epoch_read_before_lightning_iterates(
    world_size: int, limit: float, distributed: bool, batches: int
) -> None:
    """A plain sampler is split over the processes (5 batches: 3 each on 2), a DistributedSampler is already the
    process's
    share; ``limit_train_batches`` caps by count or fraction."""
    dataset = list(range(10))
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0) if distributed else None
    data = SimpleNamespace(train_dataloader=lambda: DataLoader(dataset, batch_size=2, sampler=sampler))
    trainer = planned_trainer(data, world_size=world_size, limit_train_batches=limit)
    assert LongRunAugmentation.batches_per_epoch(trainer) == batches


def test_a_datamodule_without_a_schedule_is_left_as_configured() -> None:
    """No ``augmentation_schedule`` (a classification datamodule) or an empty one: nothing is read or set."""
    assert fit({}, max_steps=12) == [
        (epoch, MOSAIC, MIXUP, AFFINE, PERMUTATION, VERTICAL_FLIP, QUARTER_TURN, COPY_PASTE)
        for epoch in range(6)
        for _ in range(2)
    ]
    callback = LongRunAugmentation()
    callback.setup(planned_trainer(SimpleNamespace(train_dataset=[])), None, "fit")
    assert callback.schedule == {} and callback.on_epochs == {}


def test_several_run_lengths_switch_their_own_augmentations() -> None:
    """The mosaics and affine from 100 epochs, the channel permutation, the vertical flip and the quarter turn from 5.
    A 6-epoch run has the latter three throughout (the mosaics never close: they never opened) and the rest held off;
    each length's decision is kept in the checkpoint state."""
    callback = LongRunAugmentation()
    schedule = {
        **mosaics_and_affine(100),
        "channel_permutation": LongRun(5),
        "vertical_flip": LongRun(5),
        "quarter_turn": LongRun(5),
    }
    assert fit(schedule, max_steps=12, workers=1, callback=callback) == [
        (epoch, 0.0, MIXUP, 0.0, PERMUTATION, VERTICAL_FLIP, QUARTER_TURN, COPY_PASTE)
        for epoch in range(6)
        for _ in range(2)
    ]
    assert callback.on_epochs == {5.0: 0, 100.0: None}
    assert callback.state_dict()["on_epochs"] == {"5": 0, "100": None}
    assert fit({"channel_permutation": LongRun(6.5)}, max_steps=12)[0] == (
        0,
        MOSAIC,
        MIXUP,
        AFFINE,
        0.0,
        VERTICAL_FLIP,
        QUARTER_TURN,
        COPY_PASTE,
    )
    assert fit({"vertical_flip": LongRun(6.5)}, max_steps=12)[0] == (
        0,
        MOSAIC,
        MIXUP,
        AFFINE,
        PERMUTATION,
        0.0,
        QUARTER_TURN,
        COPY_PASTE,
    )
    assert fit({"quarter_turn": LongRun(6.5)}, max_steps=12)[0] == (
        0,
        MOSAIC,
        MIXUP,
        AFFINE,
        PERMUTATION,
        VERTICAL_FLIP,
        0.0,
        COPY_PASTE,
    )
    assert fit({"copy_paste": LongRun(6.5)}, max_steps=12)[0] == (
        0,
        MOSAIC,
        MIXUP,
        AFFINE,
        PERMUTATION,
        VERTICAL_FLIP,
        QUARTER_TURN,
        0.0,
    )


def test_each_switch_is_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    """On, held off and closed: one line each, naming the augmentations and the schedule's numbers."""
    lines: list[str] = []
    monkeypatch.setattr("vision_tx.lightning.augmentation.rank_zero_info", lines.append)
    fit({**recipe(6), "affine": LongRun(6.5)}, max_steps=12)
    assert lines == [
        "LongRunAugmentation: mixup and copy-paste and channel permutation and vertical flip on from epoch 0 "
        "(the run makes about 6 epochs, the schedule's from_epochs 6)",
        "LongRunAugmentation: no affine while the run's length is under the schedule's from_epochs 6.5 (about 6)",
        "LongRunAugmentation: mixup off from epoch 4 (the learning rate dropped in epoch 3)",
        "LongRunAugmentation: copy-paste off from epoch 4 (the learning rate dropped in epoch 3)",
    ]
