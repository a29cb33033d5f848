"""Runs shared by several test modules, made once per session: a DETR checkpoint trained a few steps
on the toy set, and its metrics validated on one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.lightning.test_detection import SMALL, validate_checkpoint
from tests.lightning.tools import run_tool_in_process


@pytest.fixture(scope="session")
def detr_toy_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("toy")


@pytest.fixture(scope="session")
def detr_checkpoint(tmp_path_factory, detr_toy_cache: Path) -> Path:
    """A checkpoint after a few training steps (and one validation) on the toy set."""
    run_dir = tmp_path_factory.mktemp("detr_run")
    run_tool_in_process(
        "train.py", *SMALL, "--data.toy_cache_dir", str(detr_toy_cache),
        "--trainer.max_steps", "3", "--trainer.limit_val_batches", "2",
        "--trainer.check_val_every_n_epoch", "1", "--trainer.val_check_interval", "3", "--trainer.num_sanity_val_steps", "0",
        "--trainer.default_root_dir", str(run_dir), "--trainer.logger", "true",
        cwd=run_dir,
    )
    metrics = json.loads(next(run_dir.rglob("metrics.json")).read_text())
    assert set(metrics["bbox"]) == {"AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl", "per_category"}
    assert list(run_dir.rglob("predictions_step*.png")) and list(run_dir.rglob("bbox_results.json"))
    return next(run_dir.rglob("last.ckpt"))


@pytest.fixture(scope="session")
def detr_metrics_on_one_process(tmp_path_factory, detr_checkpoint: Path, detr_toy_cache: Path) -> dict:
    """The ``metrics.json`` of ``tools/eval.py`` validating :func:`detr_checkpoint` on one process."""
    metrics, _ = validate_checkpoint(detr_checkpoint, detr_toy_cache, tmp_path_factory.mktemp("detr_eval"), devices=1)
    return metrics
