"""The main job's deployment export (vision_tx/export.py with vision_tx/deploy.py): fixed shape, BatchNorms folded,
deformable attention as GridSample, and in onnxruntime the detections of the eager, unfused model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from tests.conftest import require_reference
from tests.test_export import assert_detections_close, build_task, detector_kwargs, run_onnx
from vision_tx.export import deployable, example_images, export

CONFIG = "rtdetr_convnext_toy"


def test_the_main_jobs_fixed_shape_export_is_fused_and_gives_the_eager_detections(tmp_path: Path) -> None:
    """Batch 1 at 128x160, the deployed form (the benchmark's): no BatchNormalization left but the backbone's three
    output norms, one convolution per RepVGG block, ConvNeXt's MLPs as convolutions, a GridSample per level and
    decoder layer, no Loop; its
    detections are the eager model's (not fused); the model handed to ``export`` is left unfused."""
    module = build_task(CONFIG, class_scale=1.0, detector_kwargs={**detector_kwargs(CONFIG), "num_detections": 100})
    model = deployable(module, CONFIG)
    norms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    info = export(
        model, tmp_path / "main.onnx", "onnx", example_images((128, 160), 1), dynamic_size=False, dynamic_batch=False
    )
    assert info["dims"] == {"batch": 1, "height": 128, "width": 160}
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == norms > 30
    operators = Counter(node.op_type for node in require_reference("onnx").load(str(info["path"])).graph.node)
    convolutions = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    assert operators["BatchNormalization"] == 3 and operators["GridSample"] == 9 and operators["Loop"] == 0
    # 12 RepVGG blocks, two convolutions each, merged into one; 5 ConvNeXt blocks, their MLPs as two 1x1 convolutions
    assert operators["Conv"] == convolutions - 12 + 2 * 5
    images = example_images((128, 160), 1, seed=7)
    with torch.no_grad():
        assert_detections_close(run_onnx(info["path"], images), model(images))
