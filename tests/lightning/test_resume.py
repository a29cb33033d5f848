"""A training process killed with SIGKILL mid-epoch and resumed with ``--ckpt_path last`` ends with the
same weights as a run never interrupted (CPU, fixed seed, deterministic algorithms)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

from tests.lightning.test_detection import SMALL
from tests.lightning.tools import ROOT, run_tool_in_process

# Two epochs of 4 batches; a checkpoint after every step; no validation.
SCHEDULE = [
    "--trainer.max_steps",
    "8",
    "--trainer.limit_train_batches",
    "4",
    "--trainer.limit_val_batches",
    "0",
    "--trainer.num_sanity_val_steps",
    "0",
    "--trainer.deterministic",
    "true",
    "--trainer.logger",
    "false",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
]
# A list given on the command line is merged item by item with the config's: every argument is set.
CHECKPOINT_EVERY_STEP = (
    "{class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: "
    "{monitor: null, mode: min, every_n_train_steps: 1, save_last: true, save_top_k: 0}}"
)
KILL_AT_STEP_5 = "{class_path: tests.lightning.test_resume.KillAtStep, init_args: {step: 5}}"

# Dropout and stochastic depth on, so that resuming must restore the random state too.
DETECTION = [
    *SMALL,
    "--model.backbone_kwargs",
    "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 2, 4, 8], drop_path_rate: 0.1}",
    "--model.detector_kwargs",
    "{num_queries: 5, hidden_dim: 32, num_heads: 2, num_encoder_layers: 1, num_decoder_layers: 1, "
    "dim_feedforward: 64, dropout: 0.1}",
    "--data.train_transform.init_args.scales",
    "[64, 80]",
    "--data.train_transform.init_args.max_size",
    "96",
    "--data.train_transform.init_args.crop_scales",
    "[64]",
    "--data.train_transform.init_args.crop_size",
    "[48, 64]",
    "--data.batch_size",
    "2",
]
# DINO's tiny form; training draws denoising noise, so resuming must restore the generators exactly.
DINO_KWARGS = (
    "{num_queries: 10, hidden_dim: 32, num_heads: 2, num_encoder_layers: 1, num_decoder_layers: 2, "
    "dim_feedforward: 64, num_denoising: 10"
)
DINO_SMALL = [
    *SMALL,
    "--config",
    "dino_swin_toy",
    "--model.backbone_kwargs",
    "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 2, 4, 8], drop_path_rate: 0.0}",
    "--model.detector_kwargs",
    DINO_KWARGS + "}",
]
SEGMENTATION = [
    "--config",
    "upernet_swin_t_ade20k",
    "--model.backbone_kwargs",
    "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 2, 4, 8], drop_path_rate: 0.3}",
    "--model.head_kwargs",
    "{channels: 16, aux_channels: 8}",
    "--model.warmup_iters",
    "2",
    "--data.scale",
    "[128, 64]",
    "--data.crop_size",
    "[64, 64]",
    "--data.batch_size",
    "2",
    "--data.num_workers",
    "0",
    "--trainer.accelerator",
    "cpu",
    "--trainer.devices",
    "1",
    "--trainer.strategy",
    "auto",
    "--trainer.sync_batchnorm",
    "false",
    "--trainer.val_check_interval",
    "null",
    "--trainer.check_val_every_n_epoch",
    "1",
]


class KillAtStep(pl.Callback):
    """Sends SIGKILL to its own process when training reaches ``step`` (after that step's checkpoint)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def train(args: list[str], run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """Runs ``tools/train.py`` in ``run_dir``, with callbacks from ``tests/`` importable."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "train.py"), *args, "--trainer.default_root_dir", str(run_dir), *extra],
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def final_state(run_dir: Path) -> dict:
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 8
    return checkpoint


def check_resume_matches_uninterrupted(args: list[str], tmp_path: Path) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir()
    killed.mkdir()
    callbacks = ("--trainer.callbacks", f"[{CHECKPOINT_EVERY_STEP}]")
    args = [*args, *SCHEDULE]
    # Only the killed run needs a process of its own; the others run in this one.
    run_tool_in_process("train.py", *args, "--trainer.default_root_dir", str(straight), *callbacks, cwd=straight)

    result = train(args, killed, "--trainer.callbacks", f"[{CHECKPOINT_EVERY_STEP}, {KILL_AT_STEP_5}]")
    assert result.returncode == -signal.SIGKILL, result.stderr[-5000:]
    interrupted = torch.load(killed / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert interrupted["global_step"] == 5 and interrupted["epoch"] == 1  # one batch into the second epoch
    assert interrupted["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": 1}]

    result = run_tool_in_process(
        "train.py", *args, "--trainer.default_root_dir", str(killed), *callbacks, "--ckpt_path", "last", cwd=killed
    )
    assert "not resumable" not in result.stderr  # Lightning's warning for loaders that restart the epoch
    expected, resumed = final_state(straight), final_state(killed)
    assert expected["state_dict"].keys() == resumed["state_dict"].keys()
    for name, value in expected["state_dict"].items():
        assert torch.equal(value, resumed["state_dict"][name]), name
    for expected_state, resumed_state in zip(
        expected["optimizer_states"][0]["state"].values(), resumed["optimizer_states"][0]["state"].values()
    ):
        assert all(torch.equal(expected_state[k], resumed_state[k]) for k in expected_state)


def test_detection_resumes_after_sigkill_with_the_same_weights(tmp_path: Path) -> None:
    check_resume_matches_uninterrupted([*DETECTION, "--data.toy_cache_dir", str(tmp_path / "toy")], tmp_path)


def test_dino_resumes_after_sigkill_with_the_same_weights(tmp_path: Path) -> None:
    check_resume_matches_uninterrupted(
        [
            *DINO_SMALL,
            *DETECTION[len(SMALL) + 4 :],
            "--model.detector_kwargs",
            DINO_KWARGS + ", dropout: 0.1}",
            "--data.toy_cache_dir",
            str(tmp_path / "toy"),
        ],
        tmp_path,
    )


def test_segmentation_resumes_after_sigkill_with_the_same_weights(tmp_path: Path) -> None:
    check_resume_matches_uninterrupted([*SEGMENTATION, "--data.toy_cache_dir", str(tmp_path / "toy")], tmp_path)
