"""TrainingBudget counts training time without the validations, stops at its budget, and stretches a
config's step plan (planned_steps, PlannedStepLR drops) to the budget's minutes."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from jsonargparse import Namespace
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from vision_tx.lightning.budget import PlannedStepLR, TrainingBudget, planned_step
from vision_tx.lightning.cli import VisionTxCLI

STEP_SECONDS, VALIDATION_SECONDS = 0.02, 0.3
PLANNED_STEPS, DROP_STEP = 10, 8


class Sleepy(pl.LightningModule):
    """A linear classifier whose steps take ``STEP_SECONDS`` and validations ``VALIDATION_SECONDS``,
    with DETR's step plan (the rate divided by 10 at ``DROP_STEP``) or ``schedule`` in its place;
    it records the learning rate of every step."""

    def __init__(self, schedule: str = "steps") -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.schedule = schedule
        self.validations = 0
        self.rates: list[float] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(STEP_SECONDS)
        self.rates.append(self.optimizers().param_groups[0]["lr"])
        return torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1])

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        time.sleep(VALIDATION_SECONDS)
        self.validations += not self.trainer.sanity_checking

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        if self.schedule == "steps":
            return {
                "optimizer": optimizer,
                "lr_scheduler": {
                    "scheduler": PlannedStepLR(optimizer, [DROP_STEP], gamma=0.1, trainer=self.trainer),
                    "interval": "step",
                },
            }
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 5)}


def fit(budget: TrainingBudget, model: Sleepy, max_steps: int = -1, val_check_interval: int = 20) -> float:
    """Fits ``model`` on random data under ``budget`` (no step limit unless ``max_steps``, as tools/train.py builds a
    budget run's trainer); returns the whole run's wall-clock seconds."""
    data = TensorDataset(torch.randn(4000, 4), torch.randint(0, 2, (4000,)))
    trainer = pl.Trainer(
        max_steps=max_steps,
        max_epochs=-1,
        val_check_interval=val_check_interval,
        check_val_every_n_epoch=None,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[budget],
        max_time={"seconds": 30},
    )  # a run the budget fails to stop still ends
    start = time.perf_counter()
    trainer.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
    return time.perf_counter() - start


def test_without_minutes_it_counts_and_the_run_is_the_configs() -> None:
    budget, model = TrainingBudget(), Sleepy()
    total = fit(budget, model, max_steps=30, val_check_interval=10)
    summary = budget.summary()
    assert summary["steps"] == 30 and model.validations == 3
    assert 30 * STEP_SECONDS <= summary["train_seconds"] <= total - model.validations * VALIDATION_SECONDS
    assert summary["images_seen"] == 4 * 30 and summary["torch_threads"] == [torch.get_num_threads()]
    assert summary["validated_step"] == 30
    assert model.rates[DROP_STEP - 1] == pytest.approx(0.1) and model.rates[DROP_STEP] == pytest.approx(0.01)


def test_minutes_stretch_the_step_plan_and_stop_the_run_with_a_validation() -> None:
    # long enough for 3x the planned steps on a loaded CI machine (a step costs 0.02 s and Lightning's overhead)
    seconds = 3.0
    budget, model = TrainingBudget(minutes=seconds / 60, planned_steps=PLANNED_STEPS), Sleepy()
    total = fit(budget, model)
    summary = budget.summary()
    steps = summary["steps"]
    assert steps > 3 * PLANNED_STEPS  # the step limit is lifted: the time decides
    assert seconds <= summary["train_seconds"] <= min(seconds + 1.0, total - model.validations * VALIDATION_SECONDS)
    assert summary["validated_step"] == steps  # a last validation of the final weights
    # The drop planned at 80% of the steps comes at 80% of the time: near 80% of the steps taken.
    dropped = next(i for i, rate in enumerate(model.rates) if rate < 0.05)
    assert model.rates[:dropped] == [pytest.approx(0.1)] * dropped and model.rates[dropped:] == [
        pytest.approx(0.01)
    ] * (steps - dropped)
    assert 0.6 * steps <= dropped <= 0.95 * steps  # steps slowed by other load shift it; half the fraction (0.4) fails


def planned_trainer(budget: TrainingBudget, max_steps: int = -1) -> SimpleNamespace:
    """The trainer fields the budget and its schedule read, with a PlannedStepLR stepped every step."""
    trainer = SimpleNamespace(callbacks=[budget], max_steps=max_steps, sanity_checking=False, global_step=0)
    optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1.0)
    trainer.lr_scheduler_configs = [
        SimpleNamespace(scheduler=PlannedStepLR(optimizer, [DROP_STEP], trainer=trainer), interval="step")
    ]
    return trainer


def test_the_time_spent_is_kept_in_checkpoints_and_a_resumed_schedule_starts_where_it_was() -> None:
    """42 s of a 60 s budget over 10 planned steps: step 7 of the plan, short of the drop at 8; 54 s: step 9, past
    it."""
    budget = TrainingBudget(minutes=1.0, planned_steps=PLANNED_STEPS)
    budget.load_state_dict({"spent": 42.0})
    resumed = TrainingBudget(minutes=1.0, planned_steps=PLANNED_STEPS)
    resumed.load_state_dict(budget.state_dict())
    assert resumed.elapsed() == 42.0
    trainer = planned_trainer(resumed)
    resumed.on_train_start(trainer, None)
    assert planned_step(trainer, 3) == pytest.approx(7.0)
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    scheduler.step()
    assert scheduler.get_last_lr() == [pytest.approx(1.0)]
    later = TrainingBudget(minutes=1.0, planned_steps=PLANNED_STEPS)
    later.load_state_dict({"spent": 54.0})
    trainer = planned_trainer(later)
    later.on_train_start(trainer, None)
    trainer.lr_scheduler_configs[0].scheduler.step()
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr() == [pytest.approx(0.1)]


def test_without_a_budget_the_plan_is_the_optimiser_steps() -> None:
    """No budget (or one that only counts): the milestones are read at the scheduler's own step, as MultiStepLR's."""
    for budget in (TrainingBudget(), TrainingBudget(minutes=1.0)):  # the second has no plan: its time is not read
        budget.spent = 59.0
        trainer = planned_trainer(budget)
        assert planned_step(trainer, 3) == 3
    assert planned_step(None, 5) == 5


def test_tools_train_moves_the_step_limit_into_the_budgets_plan() -> None:
    """--budget.minutes: the trainer gets no step or epoch limit, the budget the config's max_steps; without minutes
    (or with a plan given) the config stays as written."""

    def lifted(budget: dict, trainer: dict) -> Namespace:
        cli = SimpleNamespace(
            subcommand="fit", config=Namespace(fit=Namespace(budget=Namespace(**budget), trainer=Namespace(**trainer)))
        )
        VisionTxCLI.before_instantiate_classes(cli)
        return cli.config.fit

    config = lifted({"minutes": 1.0, "planned_steps": None}, {"max_steps": 300, "max_epochs": None})
    assert (config.budget.planned_steps, config.trainer.max_steps, config.trainer.max_epochs) == (300, -1, -1)
    config = lifted({"minutes": 1.0, "planned_steps": 50}, {"max_steps": 300, "max_epochs": 7})
    assert (config.budget.planned_steps, config.trainer.max_steps, config.trainer.max_epochs) == (50, -1, 7)
    config = lifted({"minutes": None, "planned_steps": None}, {"max_steps": 300, "max_epochs": None})
    assert (config.budget.planned_steps, config.trainer.max_steps, config.trainer.max_epochs) == (None, 300, None)


def test_a_kept_step_limit_ends_the_run_first_with_a_warning() -> None:
    """A trainer built with its step limit and a minute's budget: the plan is its max_steps, stretched to the minute,
    so the 10 steps (well under a minute) end the run before the drop planned at 80% of the time."""
    budget, model = TrainingBudget(minutes=1.0), Sleepy()
    with pytest.warns(UserWarning, match="keeps its step limit"):
        fit(budget, model, max_steps=PLANNED_STEPS)
    assert budget.summary()["steps"] == PLANNED_STEPS and budget.planned_steps == PLANNED_STEPS
    assert model.rates == [pytest.approx(0.1)] * PLANNED_STEPS


def test_another_schedule_runs_as_written_and_stops_at_the_budget() -> None:
    budget, model = TrainingBudget(minutes=0.5 / 60), Sleepy(schedule="cosine")
    with pytest.warns(UserWarning, match="only a step plan"):
        fit(budget, model, max_steps=1000, val_check_interval=1000)
    assert 0.5 <= budget.summary()["train_seconds"] <= 1.5 and budget.summary()["steps"] < 1000


def test_minutes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="minutes must be positive"):
        TrainingBudget(minutes=0)
    with pytest.raises(ValueError, match="planned_steps must be positive"):
        TrainingBudget(planned_steps=0)


def random_batches(batch_size: int) -> DataLoader:
    """40 random samples of Sleepy's shape, in batches of ``batch_size``."""
    return DataLoader(TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,))), batch_size=batch_size)


def test_the_summary_goes_to_the_runs_metrics_json(tmp_path: Path) -> None:
    budget = TrainingBudget()
    trainer = pl.Trainer(
        max_steps=3,
        logger=CSVLogger(tmp_path),
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[budget],
    )
    trainer.fit(Sleepy(), random_batches(4))
    written = json.loads((Path(trainer.log_dir) / "metrics.json").read_text())["training"]
    assert written == budget.summary() and written["images_seen"] == 12 and written["steps"] == 3


def _fit_on_two_processes(root: Path) -> None:
    trainer = pl.Trainer(
        max_steps=3,
        accelerator="cpu",
        devices=2,
        strategy="ddp_fork",
        logger=CSVLogger(root),
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[TrainingBudget()],
    )
    trainer.fit(Sleepy(), random_batches(2))


def test_under_ddp_the_images_and_cpu_seconds_of_every_process_are_summed(tmp_path: Path) -> None:
    """Two processes of batch 2 for 3 steps see 12 images; the first process alone saw 6. (In a process of
    its own, as ``ddp_fork`` cannot fork one whose autograd engine has started its threads.)"""
    run = multiprocessing.get_context("spawn").Process(target=_fit_on_two_processes, args=(tmp_path,))
    run.start()
    run.join(timeout=600)
    assert run.exitcode == 0
    written = json.loads(next(tmp_path.rglob("metrics.json")).read_text())["training"]
    assert written["steps"] == 3 and written["images_seen"] == 2 * 3 * 2
    assert written["images_per_second"] == pytest.approx(12 / written["train_seconds"])
    assert written["cpu_seconds"] > 0


def test_wall_clock_and_cpu_seconds_add_up_over_several_training_stretches(monkeypatch) -> None:
    """Three stretches of training split by two validations: each clock sums the stretches, never only the last one,
    and neither counts the validations. Stretches of unequal length, so that any one of them alone differs."""
    clock = {"wall": 100.0, "cpu": 10.0}
    monkeypatch.setattr(time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(time, "process_time", lambda: clock["cpu"])
    trainer = type("Trainer", (), {"sanity_checking": False, "global_step": 0})()
    budget = TrainingBudget()
    budget.on_train_start(trainer, None)
    for wall, cpu in ((5.0, 7.0), (2.0, 3.0), (4.0, 1.0)):
        clock["wall"] += wall
        clock["cpu"] += cpu
        budget.on_validation_start(trainer, None)
        clock["wall"] += 50.0  # the validation
        clock["cpu"] += 60.0
        budget.on_validation_end(trainer, None)
    budget.on_validation_start(trainer, None)  # a pause with no training since the last one adds nothing
    assert budget.elapsed() == pytest.approx(11.0) and budget.spent == pytest.approx(11.0)
    assert budget.cpu == pytest.approx(11.0)
