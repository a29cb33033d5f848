"""Training for a wall-clock budget: the config's step schedule stretched to a number of minutes, as
Ultralytics' ``time=`` fits its schedule to a time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.optim.lr_scheduler import LambdaLR

from vision_tx.io import merge_metrics_json


class TrainingBudget(pl.Callback):
    """Counts a run's training time (wall-clock and process CPU seconds from the start of training,
    validations left out), images and optimiser steps; with ``minutes`` it fits the run to that time.

    With ``minutes``, training stops (``trainer.should_stop``, then a last validation) once that much training time
    is spent. ``planned_steps`` (``tools/train.py`` moves the config's ``trainer.max_steps`` there and lifts the step
    limit) is the plan the time stretches: a :class:`PlannedStepLR` (the detection configs' ``lr_drop_steps``) reads
    the step of the plan the run has reached as the share of the budget spent times ``planned_steps``
    (:func:`planned_step`), so that a drop planned at step ``m`` comes once ``m / planned_steps`` of the budget is
    spent, and the run takes as many steps as this machine makes in the time. A trainer that keeps a step limit
    ends at it if that comes first; any other schedule runs as written (both with a warning). Ranks agree under DDP
    (the furthest rank's clock decides). The time spent is kept in checkpoints: a resumed run goes on with the rest
    of its budget. Without ``minutes`` it only counts (:meth:`summary`), and the run is the config's as written.
    At the end of training the counts of every process are summed, and the summary goes to the
    ``training`` section of the run's ``metrics.json`` (when the run has a logger).
    """

    def __init__(self, minutes: float | None = None, planned_steps: int | None = None) -> None:
        if minutes is not None and minutes <= 0:
            raise ValueError(f"TrainingBudget: minutes must be positive, got {minutes}")
        if planned_steps is not None and planned_steps <= 0:
            raise ValueError(f"TrainingBudget: planned_steps must be positive, got {planned_steps}")
        self.minutes = minutes
        self.planned_steps = planned_steps
        self.spent = self.cpu = 0.0  # training seconds before the current stretch
        self.images = 0
        self.reached = 0.0  # the share of the budget spent, as the ranks agreed at the last batch end
        self.steps: int | None = None
        self.validated_step: int | None = None
        self.threads: set[int] = set()
        self._started: tuple[float, float] | None = None
        self._training = False

    def state_dict(self) -> dict[str, Any]:
        return {"spent": self.elapsed()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.spent = state_dict["spent"]

    def elapsed(self) -> float:
        """Training wall-clock so far, seconds."""
        return self.spent + (time.perf_counter() - self._started[0] if self._started else 0.0)

    def planned_step(self) -> float | None:
        """The step of the plan the run has reached (the share of the budget spent times ``planned_steps``), or None
        without minutes or a plan."""
        if self.minutes is None or self.planned_steps is None:
            return None
        return self.reached * self.planned_steps

    def _pause(self) -> None:
        if self._started is not None:
            self.spent = self.elapsed()
            self.cpu += time.process_time() - self._started[1]
            self._started = None

    def _resume(self) -> None:
        self._started = (time.perf_counter(), time.process_time())

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.minutes is not None:
            self._check_plan(trainer)
            self.reached = self.spent / (60 * self.minutes)  # a resumed run's schedule starts where it was
        self._training = True
        self._resume()

    def _check_plan(self, trainer: pl.Trainer) -> None:
        """Takes a step limit for the plan when none is given, and warns of what the budget does not stretch."""
        if self.planned_steps is None and trainer.max_steps > 0:
            self.planned_steps = trainer.max_steps
        if trainer.max_steps > 0:
            rank_zero_warn(
                f"TrainingBudget: the trainer keeps its step limit ({trainer.max_steps}): the run ends "
                "there if the budget has not run out before (tools/train.py lifts it into planned_steps)"
            )
        schedulers = [(c.scheduler, c.interval) for c in trainer.lr_scheduler_configs]
        if self.planned_steps is None or any(not isinstance(s, PlannedStepLR) or i != "step" for s, i in schedulers):
            kinds = ", ".join(f"{type(s).__name__} every {i}" for s, i in schedulers) or "none"
            rank_zero_warn(
                f"TrainingBudget: only a step plan (planned_steps, a PlannedStepLR stepped every step) is "
                f"stretched to the budget; this run's (planned steps {self.planned_steps}, schedule: "
                f"{kinds}) runs as written and stops at the budget if it has not ended before"
            )

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._training and not trainer.sanity_checking:
            self.validated_step = trainer.global_step
            self._resume()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.images += len(batch["images"]) if isinstance(batch, dict) else len(batch[0])
        self.threads.add(torch.get_num_threads())
        if self.minutes is None:
            return
        fraction = torch.tensor(self.elapsed() / (60 * self.minutes), dtype=torch.float64)
        self.reached = float(trainer.strategy.reduce(fraction, reduce_op="max"))  # the ranks' furthest clock
        if self.reached >= 1.0:
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()
        self._training = False
        self.steps = trainer.global_step
        # Under DDP each process counted its own images and CPU seconds: the run's are their sums.
        images, cpu = trainer.strategy.reduce(
            torch.tensor([self.images, self.cpu], dtype=torch.float64), reduce_op="sum"
        ).tolist()
        self.images, self.cpu = int(images), cpu
        log_dir = trainer.log_dir  # a broadcast under DDP: every process asks
        if trainer.is_global_zero and log_dir is not None and trainer.loggers:
            merge_metrics_json("training", self.summary(), Path(log_dir) / "metrics.json")

    def summary(self) -> dict[str, Any]:
        """Training seconds, CPU seconds, images, images per second, steps, the last validated step, threads."""
        return {
            "train_seconds": self.spent,
            "cpu_seconds": self.cpu,
            "images_seen": self.images,
            "images_per_second": self.images / max(self.spent, 1e-9),
            "steps": self.steps,
            "validated_step": self.validated_step,
            "torch_threads": sorted(self.threads),
        }


def budget_of(trainer: pl.Trainer) -> TrainingBudget | None:
    """The :class:`TrainingBudget` of ``minutes`` among the callbacks of ``trainer``, or None when the run is not
    budgeted in time."""
    return next((c for c in trainer.callbacks if isinstance(c, TrainingBudget) and c.minutes), None)


def planned_step(trainer: pl.Trainer | None, step: int) -> float:
    """The step of the config's plan a run at optimiser step ``step`` has reached: ``step`` itself, or, when
    ``trainer`` has a :class:`TrainingBudget` of minutes and planned steps, its share of the budget spent times the
    planned steps (``trainer`` None: ``step``)."""
    budget = budget_of(trainer) if trainer is not None else None
    reached = budget.planned_step() if budget is not None else None
    return step if reached is None else reached


class PlannedStepLR(LambdaLR):
    """``MultiStepLR``'s rate (times ``gamma`` for each of ``milestones`` reached), the milestones read against the
    run's plan (:func:`planned_step` of ``trainer``): at optimiser steps, or stretched over a time budget. Stepped
    every optimiser step; its checkpoint state is ``LambdaLR``'s (the plan itself is the config's)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        milestones: list[int],
        gamma: float = 0.1,
        trainer: pl.Trainer | None = None,
    ) -> None:
        self.milestones, self.gamma = sorted(milestones), gamma

        def factor(step: int) -> float:
            reached = planned_step(trainer, step)
            return gamma ** sum(reached >= milestone for milestone in self.milestones)

        super().__init__(optimizer, factor)
