"""What a run shows in TensorBoard, read back from its event file with tensorboard's EventAccumulator:
the loss terms, learning rates, gradient norm, speed and memory at every logging step; the
validation metrics, the predictions drawn and the per-category table at every validation; the
ground truth once (classification draws its top classes and has neither). Each toy config trains 4
steps, logging every 2 and validating every 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.lightning.test_classification import SMALL as CLASSIFICATION
from tests.lightning.test_detection import SMALL as DETECTION
from tests.lightning.test_panoptic import SMALL as PANOPTIC
from tests.lightning.test_resume import SEGMENTATION
from tests.lightning.tools import run_tool_in_process

# Each task: its arguments, its loss terms, its validation metrics, its per-category table (drawn with the ground
# truth).
TASKS = {
    "detection": (
        [
            *DETECTION,
            "--model.detector_kwargs",
            "{num_queries: 5, hidden_dim: 32, num_heads: 2, num_encoder_layers: 1, num_decoder_layers: 2, "
            "dim_feedforward: 64}",
        ],
        ["loss", "loss_ce", "loss_bbox", "loss_giou", "loss_aux", "loss_ce_0"],
        ["AP", "AP50", "AP75", "APs", "APm", "APl"],
        "val/bbox_AP_per_category",
    ),
    "panoptic": (
        [
            *PANOPTIC,
            "--model.detector_kwargs",
            "{num_queries: 8, hidden_dim: 128, num_heads: 4, num_encoder_layers: 1, num_decoder_layers: 2, "
            "dim_feedforward: 128}",
        ],
        ["loss", "loss_ce", "loss_bbox", "loss_giou", "loss_mask", "loss_dice", "loss_aux"],
        ["PQ", "SQ", "RQ", "PQ_th", "SQ_th", "RQ_th", "PQ_st", "SQ_st", "RQ_st", "AP"],
        "val/PQ_per_category",
    ),
    "segmentation": (SEGMENTATION, ["loss", "loss_ce", "loss_aux"], ["mIoU", "mAcc", "aAcc"], "val/IoU_per_class"),
    "classification": (CLASSIFICATION, ["loss", "class"], ["top1", "top5"], None),
}
STEPS = [
    "--trainer.max_steps",
    "4",
    "--trainer.log_every_n_steps",
    "2",
    "--trainer.val_check_interval",
    "2",
    "--trainer.check_val_every_n_epoch",
    "null",
    "--trainer.limit_val_batches",
    "1",
    "--trainer.num_sanity_val_steps",
    "1",
]


def events(run_dir: Path) -> EventAccumulator:
    (event_file,) = run_dir.glob("runs/*/lightning_logs/version_0/events.out.tfevents.*")
    accumulator = EventAccumulator(str(event_file), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


@pytest.mark.parametrize("task", list(TASKS))
def test_run_shows_its_curves_pictures_and_tables(task: str, tmp_path: Path) -> None:
    args, losses, metrics, table = TASKS[task]
    # The config's default logger and folder: the events land in ./runs/<config>/.
    run_tool_in_process(
        "train.py",
        *args,
        "--data.toy_cache_dir",
        str(tmp_path / "toy"),
        *STEPS,
        "--trainer.logger",
        "true",
        cwd=tmp_path,
    )
    accumulator = events(tmp_path)
    scalars = accumulator.Tags()["scalars"]

    def steps(tag: str) -> list[int]:
        return [event.step for event in accumulator.Scalars(tag)]

    # One value per logging step (batches 1 and 3)...
    learning_rates = [tag for tag in scalars if tag.startswith("lr-AdamW")]
    assert learning_rates
    for tag in [
        *(f"train/{name}" for name in losses),
        *learning_rates,
        "train/grad_norm",
        "train/images_per_second",
        "train/peak_memory_gib",
    ]:
        assert steps(tag) == [1, 3], tag
    assert all(
        event.value > 0
        for tag in ("train/grad_norm", "train/images_per_second", "train/peak_memory_gib")
        for event in accumulator.Scalars(tag)
    )
    # ...and per validation (after steps 2 and 4; the sanity check logs nothing).
    for name in metrics:
        assert len(steps(f"val/{name}")) == 2, name
    assert [event.step for event in accumulator.Images("val/predictions")] == [2, 4]
    if table is None:
        assert not {"val/ground_truth"} & set(accumulator.Tags()["images"]) and not accumulator.Tags()["tensors"]
        return
    assert [event.step for event in accumulator.Images("val/ground_truth")] == [2]
    texts = accumulator.Tensors(f"{table}/text_summary")
    assert [event.step for event in texts] == [2, 4]
    assert texts[-1].tensor_proto.string_val[0].decode().startswith("| category |")


def test_any_lightning_logger_replaces_tensorboard(tmp_path: Path) -> None:
    args = [
        *DETECTION,
        "--data.toy_cache_dir",
        str(tmp_path / "toy"),
        "--trainer.max_steps",
        "2",
        "--trainer.log_every_n_steps",
        "1",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.num_sanity_val_steps",
        "0",
    ]
    run_tool_in_process(
        "train.py", *args, "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", "csv", cwd=tmp_path
    )
    header = next((tmp_path / "csv").rglob("metrics.csv")).read_text().splitlines()[0].split(",")
    assert {"train/loss_ce", "lr-AdamW", "train/grad_norm", "train/images_per_second"} <= set(header)
    assert not list(tmp_path.rglob("events.out.tfevents.*"))
