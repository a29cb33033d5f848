"""tools/export.py from a config and a checkpoint: the session's trained DETR, exported to ONNX at a fixed size, gives
in onnxruntime what the reloaded eager model and its post-processing give."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.lightning.test_detection import SMALL as DETR_SMALL
from tests.lightning.tools import run_tool_in_process
from tests.test_export import assert_outputs_close, run_onnx
from vision_tx.export import deployable, example_images
from vision_tx.lightning.detection import DetectionModule


def test_export_tool_writes_the_trained_detector(detr_checkpoint: Path, detr_toy_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "detr.onnx"
    result = run_tool_in_process(
        "export.py",
        *DETR_SMALL,
        "--data.toy_cache_dir",
        str(detr_toy_cache),
        "--ckpt",
        str(detr_checkpoint),
        "--out",
        str(out),
        "--size",
        "96",
        "128",
        "--fixed-size",
        cwd=tmp_path,
    )
    assert f"wrote {out} (onnx)" in result.stdout and "(batch dynamic, height 96, width 128)" in result.stdout
    model = deployable(DetectionModule.load_from_checkpoint(detr_checkpoint, map_location="cpu"), "detr_swin_toy")
    images = example_images((96, 128), 2, seed=3)
    with torch.no_grad():
        expected = model(images)
    assert_outputs_close(run_onnx(out, images), expected, model.output_names)
