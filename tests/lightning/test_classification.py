"""Classification through the tools: training on a toy set writes top-1/top-5, the confusion picture and
predictions; eval.py validates and infer.py draws the top classes of a checkpoint; SAM trains through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torchvision.io import read_image

from tests.lightning.tools import run_tool_in_process
from vision_tx.data.toy_classification import make_toy_classification

SMALL = [
    "--config", "classification_toy",
    "--model.backbone_kwargs", "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 2, 4, 8], window_size: 4}",
    "--data.image_size", "32", "--data.batch_size", "8", "--data.num_workers", "0",
    "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.enable_progress_bar", "false",
    "--trainer.num_sanity_val_steps", "0",
]


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory) -> Path:
    return make_toy_classification(tmp_path_factory.mktemp("toy") / "cls", num_train_per_class=4, num_val_per_class=2, side=32)


def test_train_eval_infer(tmp_path: Path, toy_root: Path) -> None:
    run_tool_in_process("train.py", *SMALL, "--data.root", str(toy_root), "--trainer.max_steps", "3", "--trainer.max_epochs", "1",
             "--trainer.default_root_dir", str(tmp_path), cwd=tmp_path)
    metrics = json.loads(next(tmp_path.rglob("metrics.json")).read_text())["classification"]
    assert set(metrics) == {"top1", "top5", "images"} and metrics["images"] == 12
    assert 0 <= metrics["top1"] <= metrics["top5"] <= 1
    assert list(tmp_path.rglob("confusion_step*.png")) and list(tmp_path.rglob("predictions_step*.png"))
    ckpt = next(tmp_path.rglob("last.ckpt"))
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert checkpoint["hyper_parameters"]["class_names"][0] == "blue_circle"

    result = run_tool_in_process("eval.py", *SMALL, "--data.root", str(toy_root), "--ckpt", str(ckpt), cwd=tmp_path)
    assert "val/top1" in result.stdout
    image = next((toy_root / "val").rglob("*.png"))
    run_tool_in_process("infer.py", *SMALL, "--ckpt", str(ckpt), "--image", str(image), "--out", str(tmp_path / "pred.png"), cwd=tmp_path)
    picture = read_image(str(tmp_path / "pred.png"))
    assert picture.shape[1] > 32  # the image with five lines of classes under it


def test_sam_trains_through_the_cli(tmp_path: Path, toy_root: Path) -> None:
    run_tool_in_process("train.py", *SMALL, "--data.root", str(toy_root), "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
             "--trainer.gradient_clip_val", "1.0", "--trainer.logger", "false",
             "--trainer.callbacks+=vision_tx.lightning.callbacks.SharpnessAwareMinimization", "--trainer.callbacks.rho", "0.1",
             "--trainer.default_root_dir", str(tmp_path), cwd=tmp_path)
    assert torch.load(next(tmp_path.rglob("last.ckpt")), map_location="cpu", weights_only=False)["global_step"] == 2
