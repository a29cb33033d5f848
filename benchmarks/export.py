"""Deployment on the CPU: the main job's model (``rtdetr_convnext_toy``: the small-data ConvNeXt under RT-DETR, its
per-class NMS included) exported to ONNX and run in onnxruntime, against the same model in eager PyTorch
(``vision_tx.export.deployable``: the network and its post-processing) and against YOLOv8n exported to ONNX by
Ultralytics (``YOLO("yolov8n.yaml")``, no weights downloaded; its NMS embedded, ``nms=True``), in onnxruntime.
Batch 1, the same image size (128x128, the config's validation size), the same threads (torch's; onnxruntime's
intra-op threads set to it, one inter-op thread); latency: the median of 50 runs (10 with ``--quick``).
Ultralytics is AGPL-3.0 and no dependency of vision_tx: it is imported here only, and the row is left out
with a line saying so when it is not installed."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path

import torch
import yaml

from benchmarks.timing import Row, compare
from vision_tx.export import deployable, example_images, export
from vision_tx.lightning.cli import resolve_config

CONFIG = "rtdetr_convnext_toy"
SIZE = (128, 128)
NUM_CLASSES = 4  # the toy set's three shapes (category ids 1-3)


def main_job_module(config: str = CONFIG) -> torch.nn.Module:
    """The task module ``configs/<config>.yaml`` builds (random weights: the speed does not depend on them)."""
    section = yaml.safe_load(resolve_config(config).read_text())["model"]
    module_name, _, class_name = section["class_path"].rpartition(".")
    module = getattr(importlib.import_module(module_name), class_name)(**{**section["init_args"], "num_classes": NUM_CLASSES})
    module.configure_model()
    return module.eval()


def session(path: Path, threads: int):
    """An onnxruntime CPU session of ``path`` on ``threads`` intra-op threads."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def yolov8n_onnx(folder: Path) -> Path | None:
    """YOLOv8n (from its YAML) exported by Ultralytics to ONNX at ``SIZE`` with its NMS, or None without Ultralytics."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from compare_detection import offline_ultralytics

    try:
        offline_ultralytics(folder / "ultralytics_config")
    except SystemExit as err:
        print(f"YOLOv8n row left out: {err}")
        return None
    from ultralytics import YOLO

    here = Path.cwd()
    os.chdir(folder)  # a model built from its YAML exports next to the working directory's "yolov8n.yaml"
    try:
        return Path(YOLO("yolov8n.yaml").export(format="onnx", imgsz=list(SIZE), nms=True, simplify=False, dynamic=False, batch=1)).resolve()
    finally:
        os.chdir(here)


def run(device: str, quick: bool) -> list[Row]:
    if device != "cpu":
        print(f"export: onnxruntime's CPU provider only (asked for {device}): skipped")
        return []
    threads = torch.get_num_threads()
    iters, warmup = (10, 2) if quick else (50, 5)
    images = example_images(SIZE, batch=1, seed=1)
    model = deployable(main_job_module(), CONFIG)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        ours = session(export(model, folder / f"{CONFIG}.onnx", "onnx", example_images(SIZE), dynamic_size=False)["path"], threads)
        feed = {"images": images.numpy()}

        def eager() -> None:
            with torch.inference_mode():
                model(images)

        rows = [compare(f"{CONFIG} (with NMS), batch 1, {SIZE[0]}x{SIZE[1]}: onnxruntime vs eager", lambda: ours.run(None, feed),
                        eager, "eager torch", unit_items=1, warmup=warmup, iters=iters)]
        yolo_path = yolov8n_onnx(folder)
        if yolo_path is not None:
            yolo = session(yolo_path, threads)
            yolo_feed = {yolo.get_inputs()[0].name: images.numpy()}
            rows.append(compare(f"{CONFIG} vs YOLOv8n (NMS inside), both ONNX in onnxruntime", lambda: ours.run(None, feed),
                                lambda: yolo.run(None, yolo_feed), "YOLOv8n ORT", unit_items=1, warmup=warmup, iters=iters))
    return rows
