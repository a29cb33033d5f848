"""DETR training and COCO validation through the real command line, on the toy dataset."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from tests.lightning.tools import run_tool, run_tool_in_process
from vision_tx.lightning.detection import DetectionModule

# A small DETR at toy resolution: what the tests train for a few steps.
SMALL = [
    "--config",
    "detr_swin_toy",
    "--model.detector_kwargs",
    "{num_queries: 5, hidden_dim: 32, num_heads: 2, num_encoder_layers: 1, num_decoder_layers: 1, dim_feedforward: 64}",
    "--data.num_workers",
    "0",
    "--data.batch_size",
    "4",
    "--data.val_transform.init_args.size",
    "96",
    "--data.val_transform.init_args.max_size",
    "128",
    "--trainer.accelerator",
    "cpu",
    "--trainer.logger",
    "false",
    "--trainer.enable_progress_bar",
    "false",
]


def validate_checkpoint(
    ckpt: Path, toy_cache: Path, out: Path, devices: int, config_args: Sequence[str] = SMALL
) -> tuple[dict, str]:
    """Runs ``tools/eval.py`` on ``devices`` processes in ``out`` (one: in this process); returns the
    ``metrics.json`` it writes and its console output."""
    # One image per batch: as in DETR, a padded batch changes the backbone's features near the
    # padding, so batches must hold the same images for two runs to agree to the last digit.
    result = (run_tool if devices > 1 else run_tool_in_process)(
        "eval.py",
        *config_args,
        "--data.batch_size",
        "1",
        "--ckpt",
        str(ckpt),
        "--data.toy_cache_dir",
        str(toy_cache),
        "--trainer.devices",
        str(devices),
        "--trainer.strategy",
        "ddp" if devices > 1 else "auto",
        "--trainer.logger",
        "true",
        "--trainer.default_root_dir",
        str(out),
        cwd=out,
    )
    return json.loads(next(out.rglob("metrics.json")).read_text()), result.stdout + result.stderr


def test_checkpoint_reloads_and_draws(detr_checkpoint: Path, detr_toy_cache: Path, tmp_path: Path) -> None:
    module = DetectionModule.load_from_checkpoint(detr_checkpoint, map_location="cpu")
    assert module.hparams.num_classes == 4 and module.model is not None
    image = next((detr_toy_cache).rglob("val2017/*.png"))
    out = tmp_path / "pred.png"
    result = run_tool_in_process(
        "infer.py",
        *SMALL,
        "--data.toy_cache_dir",
        str(detr_toy_cache),
        "--ckpt",
        str(detr_checkpoint),
        "--image",
        str(image),
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert out.is_file() and out.stat().st_size > 0 and "wrote" in result.stdout
    assert "LightningCLI's args parameter" not in result.stderr  # the tool's own arguments are no mistake
    with torch.no_grad():
        assert module(torch.zeros(1, 3, 64, 64))["pred_logits"].shape == (1, 5, 5)


# A small DINO at toy resolution: the same module, data, evaluation and tools, another detector.
SMALL_DINO = [
    "--config",
    "dino_swin_toy",
    "--model.detector_kwargs",
    "{num_queries: 6, hidden_dim: 64, num_heads: 2, num_encoder_layers: 1, num_decoder_layers: 2, "
    "dim_feedforward: 64, num_denoising: 6}",
    *SMALL[4:],
]


DETECTOR_ARGS = {"detr": SMALL, "dino": SMALL_DINO}


@pytest.mark.parametrize("detector", ["detr", "dino"])
def test_validation_gives_the_same_metrics_on_two_processes(
    detector: str,
    request: pytest.FixtureRequest,
    detr_toy_cache: Path,
    metrics_on_one_process: Callable[[str], dict],
    tmp_path: Path,
) -> None:
    checkpoint = request.getfixturevalue(f"{detector}_checkpoint")
    one = metrics_on_one_process(detector)
    two, _ = validate_checkpoint(checkpoint, detr_toy_cache, tmp_path, devices=2, config_args=DETECTOR_ARGS[detector])
    assert two == one
    if detector == "dino":  # it finds objects, so a sample scored twice or missed would move the metrics
        assert one["bbox"]["AP50"] > 0.05


def test_dino_checkpoint_reloads_and_draws(dino_checkpoint: Path, detr_toy_cache: Path, tmp_path: Path) -> None:
    module = DetectionModule.load_from_checkpoint(dino_checkpoint, map_location="cpu")
    assert module.hparams.detector == "dino_toy" and type(module.model).__name__ == "DINO"
    image = next(detr_toy_cache.rglob("val2017/*.png"))
    out = tmp_path / "pred.png"
    run_tool_in_process(
        "infer.py",
        *SMALL_DINO,
        "--data.toy_cache_dir",
        str(detr_toy_cache),
        "--ckpt",
        str(dino_checkpoint),
        "--image",
        str(image),
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert out.is_file() and out.stat().st_size > 0
    with torch.no_grad():
        detections = module.model.postprocess(module(torch.zeros(1, 3, 64, 64)), torch.tensor([[64, 64]]))
    assert detections[0]["boxes"].shape == (24, 4)  # every (query, class) pair: 6 queries x 4 classes


def test_step_schedule_drops_tenfold_once_after_lr_drop_steps() -> None:
    module = DetectionModule(lr=1.0, backbone_lr=1.0, lr_drop_steps=3, lr_drop_epochs=1)
    module.model = torch.nn.Linear(1, 1)
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    rates = []
    for _ in range(7):  # the rate each optimiser step uses, as Lightning steps the scheduler after it
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.1])  # one drop


@pytest.mark.parametrize("start, accumulate, step", [(0.125, 1, 2), (0.125, 2, 1), (0.5, 1, None)])
def test_scores_are_shared_once_the_run_has_trained_share_scores_from_epoch(
    start: float, accumulate: int, step: int | None, detr_toy_cache: Path, tmp_path: Path
) -> None:
    """``share_scores_from_epoch`` on both sides of a 4-step run (16 toy batches an epoch: 0.0625 epochs a step, 0.125
    with two batches accumulated): the switch comes at ``step`` (never for 0.5), and reaches the detector, the
    checkpoint (its step; the hyperparameters stay as configured) and the model rebuilt from that checkpoint, unless
    ``detector_kwargs`` names ``share_scores``."""
    result = run_tool_in_process(
        "train.py",
        *SMALL_DINO,
        "--data.toy_cache_dir",
        str(detr_toy_cache),
        "--model.share_scores_from_epoch",
        str(start),
        "--trainer.max_steps",
        "4",
        "--trainer.accumulate_grad_batches",
        str(accumulate),
        "--trainer.limit_val_batches",
        "1",
        "--trainer.check_val_every_n_epoch",
        "null",
        "--trainer.val_check_interval",
        str(4 * accumulate),
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.default_root_dir",
        str(tmp_path),
        cwd=tmp_path,
    )
    switches = [line for line in result.stderr.splitlines() if "class scores shared from step" in line]
    assert switches == (
        []
        if step is None
        else [
            f"DetectionModule: class scores shared from step {step} (0.1 epochs trained, "
            f"share_scores_from_epoch {start:g})"
        ]
    )
    shared = step is not None
    checkpoint = next(tmp_path.rglob("last.ckpt"))
    saved = torch.load(checkpoint, weights_only=False)
    assert "share_scores" not in saved["hyper_parameters"]["detector_kwargs"]
    assert saved["scores_shared_from_step"] == step
    assert DetectionModule.load_from_checkpoint(checkpoint, map_location="cpu").model.share_scores is shared
    overridden = DetectionModule.load_from_checkpoint(
        checkpoint,
        map_location="cpu",
        detector_kwargs={**saved["hyper_parameters"]["detector_kwargs"], "share_scores": False},
    )
    assert overridden.model.share_scores is False


def test_share_scores_from_epoch_needs_sigmoid_class_scores() -> None:
    module = DetectionModule(backbone="swin_toy", detector="detr_toy", num_classes=4, share_scores_from_epoch=20)
    with pytest.raises(ValueError, match="detr_toy has none"):
        module.configure_model()
    with pytest.raises(ValueError, match="at least 0"):
        DetectionModule(backbone="swin_toy", detector="dino_toy", share_scores_from_epoch=-1)
