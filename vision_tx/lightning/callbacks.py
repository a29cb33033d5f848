"""Callbacks the command line adds to every task: the non-finite loss guard, the random state in
checkpoints, and what a logger shows of training (scalars) and of each validation (pictures, tables)."""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.data import extract_batch_size

from vision_tx.lightning.task import TaskModule
from vision_tx.visualize import grid


class NonFiniteLossError(RuntimeError):
    """Training stopped on a NaN or infinite loss."""


class NonFiniteLossGuard(pl.Callback):
    """Catches a NaN or infinite training loss in the step it appears, before the optimiser uses it.

    ``policy="skip"``: the optimiser step is skipped (every gradient dropped, no weight changes) with
    a warning that counts the skipped steps; after ``max_consecutive_skips`` skipped steps in a row
    the run stops. ``policy="stop"``: the run stops at once. Stopping raises
    :class:`NonFiniteLossError` naming the step and the ``train/`` terms that are not finite (a ``TaskModule``'s
    ``training_losses`` of that step, else the logged ones), before the weights change, so the checkpoints already
    written keep the last good weights.
    Under DDP the processes agree: a step is skipped everywhere when any process's loss is bad.
    """

    def __init__(self, policy: Literal["skip", "stop"] = "skip", max_consecutive_skips: int = 10) -> None:
        if policy not in ("skip", "stop"):
            raise ValueError(f"NonFiniteLossGuard: policy must be 'skip' or 'stop', not {policy!r}")
        self.policy = policy
        self.max_consecutive_skips = max_consecutive_skips
        self.skipped = 0
        self.consecutive = 0
        self._bad_terms: dict[str, float] | None = None

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self._bad_terms is None and not torch.isfinite(loss.detach()).all():
            terms = getattr(pl_module, "training_losses", None)  # a TaskModule's terms of this very step
            if terms is None:
                terms = {name: value for name, value in trainer.callback_metrics.items() if name.startswith("train/")}
            logged = {name: float(value) for name, value in terms.items() if value.numel() == 1}
            self._bad_terms = {name: value for name, value in logged.items() if not math.isfinite(value)}
            if "train/loss" not in self._bad_terms:
                self._bad_terms["loss"] = float(loss.detach().sum())

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        bad_terms, self._bad_terms = self._bad_terms, None
        if not trainer.strategy.reduce_boolean_decision(bad_terms is not None, all=False):
            self.consecutive = 0
            return
        step = trainer.global_step
        terms = ", ".join(f"{name}={value}" for name, value in (bad_terms or {}).items()) or "in another process"
        if self.policy == "stop":
            raise NonFiniteLossError(
                f"step {step}: non-finite loss ({terms}); training stopped before the weights changed"
            )
        self.skipped += 1
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive_skips:
            raise NonFiniteLossError(
                f"step {step}: non-finite loss ({terms}) for {self.consecutive} steps in a row "
                f"(max_consecutive_skips={self.max_consecutive_skips}); training stopped before the weights changed"
            )
        rank_zero_warn(
            f"step {step}: non-finite loss ({terms}); optimizer step skipped ({self.skipped} skipped so far)"
        )
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.grad = None


class RandomStateCheckpoint(pl.Callback):
    """Keeps torch's random generators (CPU and CUDA) in checkpoints and restores them when training resumes,
    so that dropout draws the same numbers as in a run never interrupted.

    Every process's generators are kept (gathered into the checkpoint that the first one writes) and
    each process gets its own back: processes seeded alike drift apart as soon as they draw different
    amounts, e.g. dropout over batches padded to different sizes. A checkpoint written by another
    number of processes restores process ``r`` to the state of process ``r`` modulo that number, with
    a warning.
    """

    def __init__(self) -> None:
        self._to_restore: dict[str, Any] | None = None
        self._world_size = 1

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._world_size = trainer.world_size

    def state_dict(self) -> dict[str, Any]:
        # Lightning builds the checkpoint on every process (only the first writes it), so the gather
        # below is entered by all of them.
        own = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        if self._world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            states: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(states, own)
            return {"per_process": states}
        return {"per_process": [own]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._to_restore = state_dict

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._to_restore is None:
            return
        # Checkpoints of earlier releases hold one state, the first process's.
        states = self._to_restore.get("per_process") or [self._to_restore]
        if len(states) != trainer.world_size:
            rank_zero_warn(
                f"RandomStateCheckpoint: the checkpoint holds the random state of {len(states)} process(es), "
                f"this run has {trainer.world_size}: process r resumes with the state of process r % {len(states)}"
            )
        state = states[trainer.global_rank % len(states)]
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
        self._to_restore = None


class LatestCheckpoint(ModelCheckpoint):
    """Writes ``last.ckpt`` in the run's checkpoint folder: the latest weights, after every validation and
    when training ends (a run without validation, or one stopped between two, included).

    The configs keep their best weights with a monitored ModelCheckpoint, whose own ``save_last`` would not
    do: Lightning (2.6) writes it only in a step where that callback saves a new best, so ``last.ckpt`` would
    hold the best weights and ``--ckpt_path last`` would resume from them instead of the latest.
    """

    def __init__(self, dirpath: str | None = None) -> None:
        super().__init__(dirpath=dirpath, filename="last", monitor=None, save_top_k=1, enable_version_counter=False)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._should_skip_saving_checkpoint(trainer):  # skipped when this step is saved already
            self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))


class SharpnessAwareMinimization(pl.Callback):
    """Trains any task with :class:`vision_tx.optim.SAM` around the optimiser its module configures.

    Add it to a config's ``trainer.callbacks`` (or
    ``--trainer.callbacks+=vision_tx.lightning.callbacks.SharpnessAwareMinimization --trainer.callbacks.rho 0.05``).
    Lightning's closure runs the forward and backward passes, the non-finite loss guard and the gradient clipping; SAM
    calls it twice per step. Learning-rate schedules and checkpoints are the base optimiser's, so a run can resume with
    or without SAM. Needs automatic optimisation, ``accumulate_grad_batches=1`` (the second pass re-evaluates one
    batch) and a precision without a gradient scaler (32 or bf16-mixed).
    """

    def __init__(self, rho: float = 0.05, adaptive: bool = False) -> None:
        self.rho = rho
        self.adaptive = adaptive

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from vision_tx.optim import SAM

        if not pl_module.automatic_optimization:
            raise ValueError("SharpnessAwareMinimization needs automatic optimisation")
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                f"SharpnessAwareMinimization: accumulate_grad_batches must be 1, not {trainer.accumulate_grad_batches}"
            )
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            raise ValueError(
                "SharpnessAwareMinimization: fp16 mixed precision steps through a gradient scaler without "
                "a closure; use --trainer.precision bf16-mixed or 32"
            )
        trainer.strategy.optimizers = [
            optimizer if isinstance(optimizer, SAM) else SAM.wrapping(optimizer, self.rho, self.adaptive)
            for optimizer in trainer.strategy.optimizers
        ]


def peak_memory_gib(device: torch.device) -> float:
    """The peak memory of ``device`` in GiB: CUDA's peak allocated memory, else the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


class TrainingMonitor(LearningRateMonitor):
    """Lightning's ``LearningRateMonitor`` (the learning rate of every parameter group, ``lr-AdamW/pg1``
    ..., at every logging step by default) plus, at every logging step:

    - ``train/grad_norm``: the total 2-norm of the gradients before clipping (all-reduced under DDP);
    - ``train/images_per_second``: images of all processes per second over the last
      ``log_every_n_steps`` training batches (validation left out);
    - ``train/peak_memory_gib``: the peak memory of the device (on CPU, of the process).

    In a run without a logger it does nothing (where ``LearningRateMonitor`` raises).
    """

    def __init__(self, logging_interval: Literal["step", "epoch"] | None = "step", **kwargs: Any) -> None:
        super().__init__(logging_interval=logging_interval, **kwargs)
        self._batch_starts: deque[tuple[float, int]] = deque()

    def on_train_start(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.loggers:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_epoch_start(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        self._batch_starts.clear()
        if trainer.loggers:
            super().on_train_epoch_start(trainer, *args, **kwargs)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.loggers:
            return
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        images = len(batch["images"]) if isinstance(batch, dict) and "images" in batch else extract_batch_size(batch)
        self._batch_starts.append((time.perf_counter(), images))
        while len(self._batch_starts) > max(trainer.log_every_n_steps, 1) + 1:
            self._batch_starts.popleft()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._batch_starts.clear()  # the time spent validating is no training time

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # Lightning clips after this hook: the gradients are the unclipped (and unscaled) ones.
        if not trainer.loggers or not trainer._logger_connector.should_update_logs:
            return
        gradients = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        stats = {"train/peak_memory_gib": peak_memory_gib(pl_module.device)}
        if gradients:
            stats["train/grad_norm"] = float(torch.nn.utils.get_total_norm(gradients))
        if len(self._batch_starts) > 1:  # the batches started before this one, over the time they took
            *done, (now, _) = self._batch_starts
            stats["train/images_per_second"] = trainer.world_size * sum(n for _, n in done) / (now - done[0][0])
        pl_module.log_dict(stats, on_step=True, on_epoch=False)


class ValidationReport(pl.Callback):
    """Shows each validation in TensorBoard, beside the scalars the module logs: the pictures of the
    task module's (``TaskModule``'s) ``preview`` (its predictions drawn on the same validation images every time) as
    ``val/predictions``, its ``preview_truth`` (the ground truth drawn on them) as ``val/ground_truth``
    once, and its ``per_category_tables`` (``{tag: Markdown table}``) in the text tab. Other loggers
    get the scalars only."""

    def __init__(self, pictures_per_row: int = 4) -> None:
        self.pictures_per_row = pictures_per_row
        self._truth_shown = False

    def on_validation_end(self, trainer: pl.Trainer, pl_module: TaskModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        writers = [logger.experiment for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
        preview, truth = pl_module.preview, pl_module.preview_truth
        step = trainer.global_step
        for writer in writers:
            if preview:
                writer.add_image("val/predictions", grid(preview, self.pictures_per_row), step)
            if truth and not self._truth_shown:
                writer.add_image("val/ground_truth", grid(truth, self.pictures_per_row), step)
            for tag, table in pl_module.per_category_tables.items():
                writer.add_text(tag, table, step)
            writer.flush()
        self._truth_shown |= bool(writers and truth)
