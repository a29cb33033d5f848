"""Deployment on the CPU: the main job's model (``rtdetr_convnext_toy``: the small-data ConvNeXt under RT-DETR, its
per-class NMS included) exported to ONNX and run in onnxruntime, against the same model in eager PyTorch
(``vision_tx.export.deployable``: the network and its post-processing) and against YOLOv8n exported to ONNX by
Ultralytics (``YOLO("yolov8n.yaml")``, no weights downloaded; its NMS embedded, ``nms=True``), in onnxruntime.
At the sizes detectors are deployed at, 320x320 and 640x640, batch 1, both exports fixed at that shape (ours through
``vision_tx.export.export``'s defaults: BatchNorms folded, ``vision_tx.deploy``), the same threads (torch's;
onnxruntime's intra-op threads set to it, one inter-op thread, graph optimisation ``ORT_ENABLE_ALL``); latency: the
median of 50 interleaved runs (10 with ``--quick``). Ultralytics is AGPL-3.0 and no dependency of vision_tx: it is
imported here only, and its rows are left out with a line saying so when it is not installed."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.timing import Row, compare
from vision_tx.config_loader import load_config
from vision_tx.export import deployable, example_images, export
from vision_tx.lightning.cli import resolve_config

CONFIG = "rtdetr_convnext_toy"
SIZES = ((320, 320), (640, 640))
NUM_CLASSES = 4  # the toy set's three shapes (category ids 1-3)


def main_job_module(config: str = CONFIG) -> torch.nn.Module:
    """The task module ``configs/<config>.yaml`` builds (random weights: the speed does not depend on them)."""
    section = load_config(resolve_config(config))["model"]
    module_name, _, class_name = section["class_path"].rpartition(".")
    module = getattr(importlib.import_module(module_name), class_name)(
        **{**section["init_args"], "num_classes": NUM_CLASSES}
    )
    module.configure_model()
    return module.eval()


def session(path: Path, threads: int):
    """An onnxruntime CPU session of ``path`` on ``threads`` intra-op threads, every graph optimisation on."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: not the constant folder's warnings about CastLike nodes it leaves
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ultralytics_version(folder: Path) -> str | None:
    """Ultralytics' version, imported offline (settings in ``folder``), or None (and a line saying so) without it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from compare_detection import offline_ultralytics

    try:
        offline_ultralytics(folder / "ultralytics_config")
    except SystemExit as err:
        print(f"YOLOv8n rows left out: {err}")
        return None
    import ultralytics

    return ultralytics.__version__


def yolov8n_onnx(folder: Path, size: tuple[int, int]) -> Path:
    """YOLOv8n (from its YAML) exported by Ultralytics to ONNX at ``size``, batch 1, with its NMS."""
    from ultralytics import YOLO

    here = Path.cwd()
    os.chdir(folder)  # a model built from its YAML exports next to the working directory's "yolov8n.yaml"
    try:
        path = Path(
            YOLO("yolov8n.yaml").export(
                format="onnx", imgsz=list(size), nms=True, simplify=False, dynamic=False, batch=1
            )
        )
        return path.rename(folder / f"yolov8n_{size[0]}x{size[1]}.onnx")
    finally:
        os.chdir(here)


def run(device: str, quick: bool) -> list[Row]:
    if device != "cpu":
        print(f"export: onnxruntime's CPU provider only (asked for {device}): skipped")
        return []
    import onnxruntime

    threads = torch.get_num_threads()
    iters, warmup = (10, 2) if quick else (50, 5)
    model = deployable(main_job_module(), CONFIG)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        yolo_version = ultralytics_version(folder)
        print(
            f"onnxruntime {onnxruntime.__version__} (CPU provider, ORT_ENABLE_ALL, {threads} intra-op threads, "
            f"1 inter-op), torch {torch.__version__}, ultralytics {yolo_version or 'not installed'}"
        )
        for size in SIZES:
            shape = f"batch 1, {size[0]}x{size[1]}"
            images = example_images(size, batch=1, seed=1)
            path = export(
                model,
                folder / f"{CONFIG}_{size[0]}x{size[1]}.onnx",
                "onnx",
                example_images(size, batch=1),
                dynamic_size=False,
                dynamic_batch=False,
            )["path"]
            ours, feed = session(path, threads), {"images": images.numpy()}

            def eager() -> None:
                with torch.inference_mode():
                    model(images)

            rows.append(
                compare(
                    f"{CONFIG} (with NMS), {shape}: onnxruntime vs eager",
                    lambda: ours.run(None, feed),
                    eager,
                    "eager torch",
                    unit_items=1,
                    warmup=warmup,
                    iters=iters,
                )
            )
            if yolo_version is not None:
                yolo = session(yolov8n_onnx(folder, size), threads)
                yolo_feed = {yolo.get_inputs()[0].name: images.numpy()}
                rows.append(
                    compare(
                        f"{CONFIG} vs YOLOv8n (NMS inside), both ONNX in onnxruntime, {shape}",
                        lambda: ours.run(None, feed),
                        lambda: yolo.run(None, yolo_feed),
                        "YOLOv8n ORT",
                        unit_items=1,
                        warmup=warmup,
                        iters=iters,
                    )
                )
    return rows
