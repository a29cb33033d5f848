"""Runs shared by several test modules, made once per session: a DETR and a DINO checkpoint trained
on the toy set, and their metrics validated on one process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lightning.test_detection import DETECTOR_ARGS, validate_checkpoint
from tests.lightning.tools import run_tool_in_process

# Training steps of each detector's session checkpoint: DETR's few steps check the plumbing; DINO
# trains until it finds objects, so that equal metrics on 1 and 2 processes compare non-zero AP.
CHECKPOINT_STEPS = {"detr": 3, "dino": 32}


@pytest.fixture(scope="session")
def detr_toy_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("toy")


def train_checkpoint(detector: str, run_dir: Path, toy_cache: Path) -> Path:
    """Trains ``detector``'s small toy config for ``CHECKPOINT_STEPS[detector]`` steps, validating (2 batches)
    at the end, in ``run_dir``; checks what the validation writes and returns ``last.ckpt``."""
    steps = str(CHECKPOINT_STEPS[detector])
    run_tool_in_process(
        "train.py",
        *DETECTOR_ARGS[detector],
        "--data.toy_cache_dir",
        str(toy_cache),
        "--trainer.max_steps",
        steps,
        "--trainer.limit_val_batches",
        "2",
        "--trainer.check_val_every_n_epoch",
        "null",
        "--trainer.val_check_interval",
        steps,
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.logger",
        "true",
        cwd=run_dir,
    )
    metrics = json.loads(next(run_dir.rglob("metrics.json")).read_text())
    assert set(metrics["bbox"]) == {
        "AP",
        "AP50",
        "AP75",
        "APs",
        "APm",
        "APl",
        "AR1",
        "AR10",
        "AR100",
        "ARs",
        "ARm",
        "ARl",
        "per_category",
        "best_f1",
        "best_f1_threshold",
        "confusion_matrix",
        "curves",
    }  # with the validation report
    assert list(run_dir.rglob("predictions_step*.png")) and list(run_dir.rglob("bbox_results.json"))
    assert {p.name for p in run_dir.rglob("*.png")} >= {"confusion_matrix.png", "pr_curve.png", "f1_curve.png"}
    return next(run_dir.rglob("last.ckpt"))


@pytest.fixture(scope="session")
def detr_checkpoint(tmp_path_factory, detr_toy_cache: Path) -> Path:
    """A DETR checkpoint after a few training steps (and one validation) on the toy set."""
    return train_checkpoint("detr", tmp_path_factory.mktemp("detr_run"), detr_toy_cache)


@pytest.fixture(scope="session")
def dino_checkpoint(tmp_path_factory, detr_toy_cache: Path) -> Path:
    """A DINO checkpoint trained on the toy set until it finds objects (and validated once)."""
    return train_checkpoint("dino", tmp_path_factory.mktemp("dino_run"), detr_toy_cache)


@pytest.fixture(scope="session")
def metrics_on_one_process(
    tmp_path_factory, request: pytest.FixtureRequest, detr_toy_cache: Path
) -> Callable[[str], dict]:
    """``metrics_on_one_process(detector)``: the ``metrics.json`` of ``tools/eval.py`` validating the
    detector's session checkpoint (``detr_checkpoint``, ``dino_checkpoint``) on one process, once per session."""
    computed: dict[str, dict] = {}

    def metrics(detector: str) -> dict:
        if detector not in computed:
            checkpoint = request.getfixturevalue(f"{detector}_checkpoint")
            out = tmp_path_factory.mktemp(f"{detector}_eval")
            computed[detector], _ = validate_checkpoint(
                checkpoint, detr_toy_cache, out, devices=1, config_args=DETECTOR_ARGS[detector]
            )
        return computed[detector]

    return metrics
