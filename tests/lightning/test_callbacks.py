"""The non-finite loss guard (skip or stop, last good checkpoint kept), the random state in checkpoints, and
the command line adding both to every task."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import TensorDataset

from vision_tx.data.sampling import ResumableLoader
from vision_tx.lightning.callbacks import NonFiniteLossError, NonFiniteLossGuard, RandomStateCheckpoint
from vision_tx.lightning.checkpoint_io import AtomicCheckpointIO
from vision_tx.lightning.cli import VisionTxCLI, resolve_config_args
from vision_tx.lightning.task import TaskModule


class Regression(pl.LightningModule):
    """A linear regression whose loss terms turn NaN (``loss_fit``) or infinite (``loss_reg``) at the given steps."""

    def __init__(self, nan_steps: tuple[int, ...] = (), inf_steps: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.dropout = nn.Dropout(0.5)
        self.nan_steps, self.inf_steps = nan_steps, inf_steps
        self.weights_before_step: dict[int, torch.Tensor] = {}

    def training_step(self, batch: list[torch.Tensor], batch_index: int) -> torch.Tensor:
        self.weights_before_step[self.global_step] = self.layer.weight.detach().clone()
        inputs, targets = batch
        loss_fit = (self.layer(self.dropout(inputs)) - targets).pow(2).mean()
        loss_reg = self.layer.weight.pow(2).sum() * 1e-3
        if self.global_step in self.nan_steps:
            loss_fit = loss_fit * float("nan")
        if self.global_step in self.inf_steps:
            loss_reg = loss_reg * float("inf")
        self.log_dict({"train/loss_fit": loss_fit, "train/loss_reg": loss_reg})
        return loss_fit + loss_reg

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TaskRegression(TaskModule):
    """A linear regression logging as the task modules do (``log_training_losses``: the ``train/`` terms reach
    ``self.log`` only on the loggers' steps), its ``loss_reg`` infinite at ``inf_steps``."""

    def __init__(self, inf_steps: tuple[int, ...]) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.inf_steps = inf_steps

    def training_step(self, batch: list[torch.Tensor], batch_index: int) -> torch.Tensor:
        inputs, targets = batch
        scale = float("inf") if self.global_step in self.inf_steps else 1e-3
        losses = {"loss_fit": (self.layer(inputs) - targets).pow(2).mean(), "loss_reg": self.layer.weight.pow(2).sum()}
        losses["loss_reg"] = losses["loss_reg"] * scale
        losses["loss"] = losses["loss_fit"] + losses["loss_reg"]
        self.log_training_losses(losses, len(inputs))
        return losses["loss"]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(
    module: pl.LightningModule, root: Path, callbacks: list[pl.Callback], max_steps: int = 6, **fit_kwargs
) -> pl.Trainer:
    """Trains ``module`` on 8 fixed batches, writing ``root/last.ckpt`` after every step."""
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=generator), torch.randn(32, 1, generator=generator))
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=[*callbacks, ModelCheckpoint(root, every_n_train_steps=1, save_last=True)],
    )
    trainer.fit(module, ResumableLoader(data, batch_size=4), **fit_kwargs)
    return trainer


def test_skip_drops_the_bad_step_and_warns_with_a_count(tmp_path: Path) -> None:
    module = Regression(nan_steps=(2,), inf_steps=(4,))
    guard = NonFiniteLossGuard(policy="skip")
    with pytest.warns(UserWarning) as warnings:
        trainer = fit(module, tmp_path, [guard])
    messages = [str(w.message) for w in warnings if "non-finite" in str(w.message)]
    assert messages == [
        "step 2: non-finite loss (train/loss_fit=nan, loss=nan); optimizer step skipped (1 skipped so far)",
        "step 4: non-finite loss (train/loss_reg=inf, loss=inf); optimizer step skipped (2 skipped so far)",
    ]
    assert trainer.global_step == 6 and guard.skipped == 2
    # A skipped step leaves the weights as they were; the others change them.
    weights = module.weights_before_step
    assert torch.equal(weights[2], weights[3]) and torch.equal(weights[4], weights[5])
    assert not torch.equal(weights[1], weights[2])
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_skip_stops_after_too_many_bad_steps_in_a_row(tmp_path: Path) -> None:
    module = Regression(nan_steps=(1, 2, 3))
    with pytest.raises(
        NonFiniteLossError,
        match=r"^step 3: non-finite loss \(train/loss_fit=nan, loss=nan\) "
        r"for 3 steps in a row \(max_consecutive_skips=3\)",
    ):
        fit(module, tmp_path, [NonFiniteLossGuard(policy="skip", max_consecutive_skips=3)])


def test_stop_names_the_step_and_terms_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    module = Regression(inf_steps=(3,))
    with pytest.raises(NonFiniteLossError) as error:
        fit(module, tmp_path, [NonFiniteLossGuard(policy="stop")])
    assert str(error.value) == (
        "step 3: non-finite loss (train/loss_reg=inf, loss=inf); training stopped before the weights changed"
    )
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert last["global_step"] == 3  # written after the last good step, never after the bad one
    torch.testing.assert_close(last["state_dict"]["layer.weight"], module.weights_before_step[3], rtol=0, atol=0)
    assert torch.equal(module.layer.weight, module.weights_before_step[3])  # the bad step changed nothing


def test_a_task_module_names_the_terms_of_a_step_the_loggers_skip(tmp_path: Path) -> None:
    # fit() keeps Lightning's log_every_n_steps (50): step 3's terms are never logged, the guard reads them from the
    # module.
    with pytest.raises(NonFiniteLossError) as error:
        fit(TaskRegression(inf_steps=(3,)), tmp_path, [NonFiniteLossGuard(policy="stop")])
    assert str(error.value) == (
        "step 3: non-finite loss (train/loss_reg=inf, train/loss=inf); training stopped before the weights changed"
    )


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="policy must be 'skip' or 'stop', not 'ignore'"):
        NonFiniteLossGuard(policy="ignore")


@pytest.mark.parametrize("keep_random_state", [True, False])
def test_random_state_is_restored_on_resume(tmp_path: Path, keep_random_state: bool) -> None:
    """Dropout after resuming draws what it would have drawn in a run never interrupted (and does not without the
    callback)."""

    def callbacks() -> list[pl.Callback]:
        return [RandomStateCheckpoint()] if keep_random_state else []

    torch.manual_seed(1)
    straight = Regression()
    fit(straight, tmp_path / "straight", callbacks())
    torch.manual_seed(1)
    fit(Regression(), tmp_path / "first", callbacks(), max_steps=3)
    torch.manual_seed(1)  # a new process, seeded as at the start
    resumed = Regression()
    fit(resumed, tmp_path / "resumed", callbacks(), ckpt_path=tmp_path / "first" / "last.ckpt")
    assert torch.equal(resumed.layer.weight, straight.layer.weight) == keep_random_state


class RankDependentDraws(Regression):
    """Process ``r`` draws ``3r`` more random numbers per step than process 0, so that their generators drift apart."""

    def training_step(self, batch: list[torch.Tensor], batch_index: int) -> torch.Tensor:
        torch.rand(3 * self.global_rank)
        return super().training_step(batch, batch_index)


def _fit_on_two_processes(root: Path, max_steps: int = 6, **fit_kwargs) -> dict[str, torch.Tensor]:
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=2,
        strategy="ddp_fork",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=[RandomStateCheckpoint(), ModelCheckpoint(root, every_n_train_steps=1, save_last=True)],
    )
    torch.manual_seed(1)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=generator), torch.randn(32, 1, generator=generator))
    trainer.fit(RankDependentDraws(), ResumableLoader(data, batch_size=2), **fit_kwargs)
    return torch.load(root / "last.ckpt", weights_only=True)


def _straight_first_and_resumed(root: Path) -> None:
    """The three two-process runs of the test below. They run in a process of their own: ``ddp_fork``
    cannot fork a process whose autograd engine has started its threads, which tracing a backward pass
    for torch.compile (earlier tests in the same pytest process) does."""
    _fit_on_two_processes(root / "straight")
    _fit_on_two_processes(root / "first", max_steps=3)
    _fit_on_two_processes(root / "resumed", ckpt_path=root / "first" / "last.ckpt")


def test_each_process_resumes_with_its_own_random_state(tmp_path: Path) -> None:
    """Under DDP, a resumed run ends with the weights of one never interrupted, though the processes' dropout
    streams differ (restoring every process to the first one's state would change the second's masks)."""
    runs = multiprocessing.get_context("spawn").Process(target=_straight_first_and_resumed, args=(tmp_path,))
    runs.start()
    runs.join(timeout=600)
    assert runs.exitcode == 0
    straight, first, resumed = (
        torch.load(tmp_path / run / "last.ckpt", weights_only=True) for run in ("straight", "first", "resumed")
    )
    assert len(first["callbacks"]["RandomStateCheckpoint"]["per_process"]) == 2
    assert resumed["global_step"] == straight["global_step"] == 6
    for name, value in straight["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], value, rtol=0, atol=0, msg=name)


def test_every_task_gets_them_from_the_command_line(tmp_path: Path) -> None:
    """``tools/train.py`` adds the guard (configurable), the random state and the atomic checkpoint writer."""
    for config in ("detr_swin_toy", "upernet_swin_t_ade20k"):
        args = [
            "--config",
            config,
            "--loss_guard.policy",
            "stop",
            "--trainer.logger",
            "false",
            "--trainer.devices",
            "1",
            "--trainer.strategy",
            "auto",
            "--trainer.default_root_dir",
            str(tmp_path),
        ]
        cli = VisionTxCLI(
            pl.LightningModule,
            pl.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            run=False,
            args=resolve_config_args(args),
        )
        guards = [c for c in cli.trainer.callbacks if isinstance(c, NonFiniteLossGuard)]
        assert len(guards) == 1 and guards[0].policy == "stop"
        assert any(isinstance(c, RandomStateCheckpoint) for c in cli.trainer.callbacks)
        assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
