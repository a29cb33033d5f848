"""One short RT-DETR training (``rtdetr_convnext_toy``), shared by the module's tests: its validation writes the
detection report (the three pictures, the numbers in ``metrics.json``, the pictures in TensorBoard), and its checkpoint
exported to ONNX (``vision_tx.export.export_checkpoint``, what tools/export.py runs) and scored by
``tools/eval.py --onnx`` in onnxruntime gives the AP of the checkpoint's own validation (``tools/eval.py --ckpt``). The
training set is 8 small toy images, validated on themselves: a few steps find the shapes, so that equal AP compares real
detections."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import require_reference
from tests.lightning.tools import run_tool_in_process
from vision_tx.data.toy import make_toy_coco
from vision_tx.export import export_checkpoint
from vision_tx.lightning.onnx_eval import main as onnx_eval_main
from vision_tx.metrics.detection_report import PICTURES

STEPS = 40  # 20 epochs of the 8 images, batch 4: AP50 0.875 on a 2-core Xeon (0.156 at step 30)
SMALL = [
    "--config",
    "rtdetr_convnext_toy",
    "--data.num_workers",
    "0",
    "--data.batch_size",
    "4",
    "--data.train_transform.init_args.scales",
    "[128]",
    "--data.train_transform.init_args.max_size",
    "160",
    "--data.val_transform.init_args.size",
    "128",
    "--data.val_transform.init_args.max_size",
    "160",
    "--trainer.accelerator",
    "cpu",
    "--trainer.enable_progress_bar",
    "false",
]
REPORT_KEYS = {"best_f1", "best_f1_threshold", "confusion_matrix", "curves"}
COCO_KEYS = {"AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl", "per_category"}


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``SMALL`` on a toy set of 8 images (96-128 px) whose validation split is a copy of its training split."""
    root = tmp_path_factory.mktemp("shapes") / "data"
    make_toy_coco(root, num_train=8, num_val=1, min_side=96, max_side=128)
    shutil.rmtree(root / "val2017")
    shutil.copytree(root / "train2017", root / "val2017")
    shutil.copy(root / "annotations" / "instances_train2017.json", root / "annotations" / "instances_val2017.json")
    return [*SMALL, "--data.root", str(root)]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory, config: list[str]) -> Path:
    """The log folder of ``STEPS`` training steps, validated once at the end, logged to TensorBoard."""
    run_dir = tmp_path_factory.mktemp("rtdetr_run")
    run_tool_in_process(
        "train.py",
        *config,
        "--trainer.max_steps",
        str(STEPS),
        "--trainer.check_val_every_n_epoch",
        "null",
        "--trainer.val_check_interval",
        str(STEPS),
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.logger",
        "true",
        cwd=run_dir,
    )
    return next(run_dir.rglob("metrics.json")).parent


def test_validation_writes_the_report(trained_run: Path, config: list[str]) -> None:
    for name in PICTURES:
        assert (trained_run / f"{name}.png").stat().st_size > 0, name
    bbox = json.loads((trained_run / "metrics.json").read_text())["bbox"]
    assert set(bbox) == COCO_KEYS | REPORT_KEYS
    matrix = bbox["confusion_matrix"]
    assert matrix["classes"] == ["circle", "square", "triangle", "background"]
    assert len(matrix["counts"]) == 4 and all(len(row) == 4 for row in matrix["counts"])
    # Every ground-truth object of the validation images is in one cell of the true classes' rows.
    objects = len(json.loads((Path(config[-1]) / "annotations" / "instances_val2017.json").read_text())["annotations"])
    assert sum(map(sum, matrix["counts"][:3])) == objects and matrix["counts"][3][3] == 0
    per_category = bbox["curves"]["per_category"]
    assert [row["name"] for row in per_category] == ["circle", "square", "triangle"]
    assert all(len(row[key]) == 101 for row in per_category for key in ("precision", "recall", "f1", "pr_precision"))
    assert 0 <= bbox["best_f1_threshold"] <= 1 and 0 < bbox["best_f1"] <= 1
    (event_file,) = trained_run.glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(event_file), size_guidance={"images": 0})
    accumulator.Reload()
    for name in PICTURES:
        assert [event.step for event in accumulator.Images(f"val/{name}")] == [STEPS], name


def test_exported_model_scores_as_the_checkpoint(trained_run: Path, config: list[str], tmp_path: Path) -> None:
    for library in ("onnx", "onnxscript", "onnxruntime"):  # torch.onnx's exporter needs the first two
        require_reference(library)
    checkpoint = trained_run / "checkpoints" / "last.ckpt"
    data = ["--data.batch_size", "1"]  # one image a batch: no padding, as the export reads
    checkpoint_out, onnx_out = tmp_path / "checkpoint", tmp_path / "onnx"
    checkpoint_out.mkdir()
    run_tool_in_process(
        "eval.py",
        *config,
        *data,
        "--ckpt",
        str(checkpoint),
        "--trainer.logger",
        "false",
        "--trainer.default_root_dir",
        str(checkpoint_out),
        "--out",
        str(checkpoint_out),
        cwd=checkpoint_out,
    )
    expected = json.loads((checkpoint_out / "metrics.json").read_text())["bbox"]
    assert expected["AP50"] > 0.1  # it detects the shapes

    onnx_path = tmp_path / "rtdetr.onnx"
    export_checkpoint(config, checkpoint, onnx_path)
    onnx_out.mkdir()
    result = run_tool_in_process(
        "eval.py", "--onnx", str(onnx_path), *config, *data, "--threads", "1", "--out", str(onnx_out), cwd=onnx_out
    )
    assert "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]" in result.stdout
    assert "best F1" in result.stdout and f"metrics: {onnx_out / 'metrics.json'}" in result.stdout
    got = json.loads((onnx_out / "metrics.json").read_text())["bbox"]
    assert set(got) == COCO_KEYS | REPORT_KEYS
    for name in ("AP", "AP50", "AP75"):
        assert got[name] == pytest.approx(expected[name], abs=0.002), (name, got[name], expected[name])
    assert got["confusion_matrix"] == expected["confusion_matrix"]
    assert all((onnx_out / f"{name}.png").is_file() for name in PICTURES) and (onnx_out / "bbox_results.json").is_file()


def test_bad_onnx_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"^error: .*missing\.onnx: no such ONNX file$"):
        onnx_eval_main(["--onnx", str(tmp_path / "missing.onnx"), "--config", "rtdetr_convnext_toy"])
    require_reference("onnxruntime")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(SystemExit, match=r"^error: .*junk\.onnx: onnxruntime cannot load it: "):
        onnx_eval_main(["--onnx", str(tmp_path / "junk.onnx"), "--config", "rtdetr_convnext_toy"])
