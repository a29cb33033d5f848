"""Callbacks the command line adds to every task: the non-finite loss guard and the random state in checkpoints."""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn


class NonFiniteLossError(RuntimeError):
    """Training stopped on a NaN or infinite loss."""


class NonFiniteLossGuard(pl.Callback):
    """Catches a NaN or infinite training loss in the step it appears, before the optimiser uses it.

    ``policy="skip"``: the optimiser step is skipped (every gradient dropped, no weight changes) with
    a warning that counts the skipped steps; after ``max_consecutive_skips`` skipped steps in a row
    the run stops. ``policy="stop"``: the run stops at once. Stopping raises
    :class:`NonFiniteLossError` naming the step and the logged ``train/`` terms that are not finite,
    before the weights change, so the checkpoints already written keep the last good weights.
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
            logged = {name: float(value) for name, value in trainer.callback_metrics.items()
                      if name.startswith("train/") and value.numel() == 1}
            self._bad_terms = {name: value for name, value in logged.items() if not math.isfinite(value)}
            if "train/loss" not in self._bad_terms:
                self._bad_terms["loss"] = float(loss.detach().sum())

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer) -> None:
        bad_terms, self._bad_terms = self._bad_terms, None
        if not trainer.strategy.reduce_boolean_decision(bad_terms is not None, all=False):
            self.consecutive = 0
            return
        step = trainer.global_step
        terms = ", ".join(f"{name}={value}" for name, value in (bad_terms or {}).items()) or "in another process"
        if self.policy == "stop":
            raise NonFiniteLossError(f"step {step}: non-finite loss ({terms}); training stopped before the weights changed")
        self.skipped += 1
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive_skips:
            raise NonFiniteLossError(
                f"step {step}: non-finite loss ({terms}) for {self.consecutive} steps in a row "
                f"(max_consecutive_skips={self.max_consecutive_skips}); training stopped before the weights changed"
            )
        rank_zero_warn(f"step {step}: non-finite loss ({terms}); optimizer step skipped ({self.skipped} skipped so far)")
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
        own = {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
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
            rank_zero_warn(f"RandomStateCheckpoint: the checkpoint holds the random state of {len(states)} process(es), "
                           f"this run has {trainer.world_size}: process r resumes with the state of process r % {len(states)}")
        state = states[trainer.global_rank % len(states)]
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
        self._to_restore = None


class SharpnessAwareMinimization(pl.Callback):
    """Trains any task with :class:`vision_tx.optim.SAM` around the optimiser its module configures.

    Add it to a config's ``trainer.callbacks`` (or ``--trainer.callbacks+=vision_tx.lightning.callbacks.SharpnessAwareMinimization
    --trainer.callbacks.rho 0.05``). Lightning's closure runs the forward and backward passes, the
    non-finite loss guard and the gradient clipping; SAM calls it twice per step. Learning-rate
    schedules and checkpoints are the base optimiser's, so a run can resume with or without SAM.
    Needs automatic optimisation, ``accumulate_grad_batches=1`` (the second pass re-evaluates one
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
            raise ValueError(f"SharpnessAwareMinimization: accumulate_grad_batches must be 1, not {trainer.accumulate_grad_batches}")
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            raise ValueError("SharpnessAwareMinimization: fp16 mixed precision steps through a gradient scaler without "
                             "a closure; use --trainer.precision bf16-mixed or 32")
        trainer.strategy.optimizers = [
            optimizer if isinstance(optimizer, SAM) else SAM.wrapping(optimizer, self.rho, self.adaptive)
            for optimizer in trainer.strategy.optimizers
        ]
