"""Training for a wall-clock budget: the config's step schedule stretched to a number of minutes, as
Ultralytics' ``time=`` fits its schedule to a time."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.optim.lr_scheduler import MultiStepLR

from vision_tx.io import merge_metrics_json


class TrainingBudget(pl.Callback):
    """Counts a run's training time (wall-clock and process CPU seconds from the start of training,
    validations left out), images and optimiser steps; with ``minutes`` it fits the run to that time.

    With ``minutes``, training stops (with a last validation) once that much training time is spent.
    A config's ``trainer.max_steps`` and its step-based learning-rate drops (a ``MultiStepLR`` stepped
    every optimiser step, as the detection configs' ``lr_drop_steps``) are read as a plan and stretched
    to the budget: a drop planned at step ``m`` of ``max_steps`` happens once the fraction ``m /
    max_steps`` of the budget is spent, and the step limit is lifted, so that the run takes as many
    steps as this machine makes in the time. Any other schedule is left as it is (with a warning) and
    the run then ends at its own limit if that comes first. Ranks agree under DDP (any rank's clock
    decides). The time spent is kept in checkpoints: a resumed run goes on with the rest of its budget.
    Without ``minutes`` it only counts (:meth:`summary`), and the run is the config's as written.
    At the end of training the counts of every process are summed, and the summary goes to the
    ``training`` section of the run's ``metrics.json`` (when the run has a logger).
    """

    def __init__(self, minutes: float | None = None) -> None:
        if minutes is not None and minutes <= 0:
            raise ValueError(f"TrainingBudget: minutes must be positive, got {minutes}")
        self.minutes = minutes
        self.spent = self.cpu = 0.0  # training seconds before the current stretch
        self.images = 0
        self.drops = 0  # learning-rate drops made so far
        self.planned_steps: int | None = None
        self.milestones: list[int] = []
        self.gamma = 1.0
        self.steps: int | None = None
        self.validated_step: int | None = None
        self.threads: set[int] = set()
        self._started: tuple[float, float] | None = None
        self._training = False

    def state_dict(self) -> dict[str, Any]:
        # The plan too: a resumed run's scheduler comes back with its milestones already cleared below.
        return {"spent": self.elapsed(), "drops": self.drops, "milestones": self.milestones, "gamma": self.gamma}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.spent, self.drops = state_dict["spent"], state_dict["drops"]
        self.milestones, self.gamma = state_dict.get("milestones", []), state_dict.get("gamma", 1.0)

    def elapsed(self) -> float:
        """Training wall-clock so far, seconds."""
        return self.spent + (time.perf_counter() - self._started[0] if self._started else 0.0)

    def _pause(self) -> None:
        if self._started is not None:
            self.spent = self.elapsed()
            self.cpu += time.process_time() - self._started[1]
            self._started = None

    def _resume(self) -> None:
        self._started = (time.perf_counter(), time.process_time())

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.minutes is not None:
            self._take_over_schedule(trainer)
        self._training = True
        self._resume()

    def _take_over_schedule(self, trainer: pl.Trainer) -> None:
        """Reads the step plan (``max_steps``, the ``MultiStepLR`` milestones) and lifts the step limit."""
        schedulers = [(c.scheduler, c.interval) for c in trainer.lr_scheduler_configs]
        if trainer.max_steps <= 0 or any(not isinstance(s, MultiStepLR) or i != "step" for s, i in schedulers):
            kinds = ", ".join(f"{type(s).__name__} every {i}" for s, i in schedulers) or "none"
            rank_zero_warn(f"TrainingBudget: only a step plan (trainer.max_steps, a MultiStepLR stepped every step) is "
                           f"stretched to the budget; this run's (max_steps {trainer.max_steps}, schedule: {kinds}) runs as "
                           f"written and stops at the budget if it has not ended before")
            return
        self.planned_steps = trainer.max_steps
        for scheduler, _ in schedulers:
            if scheduler.milestones:  # a fresh run (a resumed one restored its plan in load_state_dict)
                self.milestones, self.gamma = sorted(scheduler.milestones.elements()), scheduler.gamma
            scheduler.milestones = Counter()  # the budget drops the rate instead
        trainer.fit_loop.epoch_loop.max_steps = -1  # the budget ends the run

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._training and not trainer.sanity_checking:
            self.validated_step = trainer.global_step
            self._resume()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.images += len(batch["images"]) if isinstance(batch, dict) else len(batch[0])
        self.threads.add(torch.get_num_threads())
        if self.minutes is None:
            return
        fraction = self.elapsed() / (60 * self.minutes)
        due = sum(fraction * self.planned_steps >= m for m in self.milestones) if self.planned_steps else 0
        if trainer.strategy.reduce_boolean_decision(due > self.drops, all=False):
            self.drops += 1
            for optimizer in trainer.optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = group["initial_lr"] * self.gamma**self.drops
        if trainer.strategy.reduce_boolean_decision(fraction >= 1.0, all=False):
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pause()
        self._training = False
        self.steps = trainer.global_step
        # Under DDP each process counted its own images and CPU seconds: the run's are their sums.
        images, cpu = trainer.strategy.reduce(torch.tensor([self.images, self.cpu], dtype=torch.float64), reduce_op="sum").tolist()
        self.images, self.cpu = int(images), cpu
        log_dir = trainer.log_dir  # a broadcast under DDP: every process asks
        if trainer.is_global_zero and log_dir is not None and trainer.loggers:
            merge_metrics_json("training", self.summary(), Path(log_dir) / "metrics.json")

    def summary(self) -> dict[str, Any]:
        """Training seconds, CPU seconds, images, images per second, steps, the last validated step, threads."""
        return {"train_seconds": self.spent, "cpu_seconds": self.cpu, "images_seen": self.images,
                "images_per_second": self.images / max(self.spent, 1e-9), "steps": self.steps,
                "validated_step": self.validated_step, "torch_threads": sorted(self.threads)}
