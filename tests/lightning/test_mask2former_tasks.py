"""Mask2Former in the three segmentation tasks, through the real command line on the toy sets: a two-step
fit and a validation each (mIoU; PQ and its PNGs; mask AP and its results file), then the checkpoint
evaluated by tools/eval.py and drawn by tools/infer.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.lightning.tools import run_tool_in_process

CONFIGS = Path(__file__).resolve().parents[2] / "vision_tx" / "configs"
TINY = [
    "--trainer.accelerator",
    "cpu",
    "--trainer.enable_progress_bar",
    "false",
    "--data.num_workers",
    "0",
    "--trainer.max_steps",
    "2",
    "--trainer.val_check_interval",
    "2",
    "--trainer.check_val_every_n_epoch",
    "null",
    "--trainer.num_sanity_val_steps",
    "0",
    "--trainer.limit_val_batches",
    "2",
]
SMALL_MODEL = {
    "num_queries": 6,
    "hidden_dim": 32,
    "mask_dim": 32,
    "num_heads": 2,
    "num_decoder_layers": 3,
    "dim_feedforward": 32,
    "num_encoder_layers": 1,
    "encoder_dim_feedforward": 32,
    "num_groups": 8,
}
SMALL_BACKBONE = [
    "--model.backbone_kwargs",
    json.dumps({"embed_dim": 16, "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1]}),
]
TASKS = {
    "semantic": (
        [
            "--config",
            str(CONFIGS / "mask2former_swin_toy_ade20k.yaml"),
            "--model.head_kwargs",
            json.dumps(SMALL_MODEL),
            "--data.crop_size",
            "[64, 64]",
            "--data.scale",
            "[128, 64]",
        ],
        "segm_sem",
        "mIoU",
    ),
    "panoptic": (
        [
            "--config",
            str(CONFIGS / "mask2former_swin_toy_coco_panoptic.yaml"),
            "--model.detector_kwargs",
            json.dumps(SMALL_MODEL),
            "--data.val_transform.init_args.size",
            "64",
            "--data.val_transform.init_args.max_size",
            "96",
        ],
        "panoptic",
        "PQ",
    ),
    "instance": (
        [
            "--config",
            str(CONFIGS / "mask2former_swin_toy_coco_instance.yaml"),
            "--model.detector_kwargs",
            json.dumps(SMALL_MODEL),
            "--data.val_transform.init_args.size",
            "64",
            "--data.val_transform.init_args.max_size",
            "96",
        ],
        "segm",
        "AP50",
    ),
}


@pytest.mark.parametrize("task", sorted(TASKS))
def test_fit_validate_eval_and_infer(task: str, tmp_path: Path) -> None:
    config, section, metric = TASKS[task]
    small = [
        *config,
        *SMALL_BACKBONE,
        "--model.criterion_kwargs",
        "{num_points: 256}",
        "--data.toy_cache_dir",
        str(tmp_path / "toy"),
    ]
    train = (
        []
        if task == "semantic"
        else [
            "--data.train_transform.init_args.scales",
            "[64]",
            "--data.train_transform.init_args.max_size",
            "96",
            "--data.train_transform.init_args.crop_scales",
            "[64]",
            "--data.train_transform.init_args.crop_size",
            "[48, 64]",
        ]
    )
    run_tool_in_process(
        "train.py", *small, *train, *TINY, "--trainer.default_root_dir", str(tmp_path / "run"), cwd=tmp_path
    )
    log_dir = next((tmp_path / "run").rglob("metrics.json")).parent
    metrics = json.loads((log_dir / "metrics.json").read_text())
    assert 0 <= metrics[section][metric] <= 1
    if task == "panoptic":
        assert (log_dir / "panoptic_predictions.json").is_file() and any((log_dir / "panoptic_predictions").iterdir())
    if task == "instance":
        results = json.loads((log_dir / "segm_results.json").read_text())
        assert results and all("counts" in r["segmentation"] for r in results)
    checkpoint = next((tmp_path / "run").rglob("*.ckpt"))
    run_tool_in_process(
        "eval.py",
        *small,
        "--ckpt",
        str(checkpoint),
        "--trainer.limit_val_batches",
        "1",
        "--data.num_workers",
        "0",
        "--trainer.accelerator",
        "cpu",
        cwd=tmp_path,
    )
    image = next((tmp_path / "toy").rglob("*.jpg"), None) or next((tmp_path / "toy").rglob("*.png"))
    run_tool_in_process(
        "infer.py",
        *small,
        "--ckpt",
        str(checkpoint),
        "--image",
        str(image),
        "--out",
        str(tmp_path / "drawn.png"),
        cwd=tmp_path,
    )
    assert (tmp_path / "drawn.png").stat().st_size > 0
