"""The import graph: the plain packages load without Lightning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vision_tx"


def test_data_metrics_backbones_and_models_import_without_lightning() -> None:
    """In a fresh interpreter. ``lightning_utilities`` (torchmetrics' helper package, which ``MeanIoU``
    brings) is not Lightning and may load."""
    code = (
        "import sys, vision_tx.data, vision_tx.metrics, vision_tx.backbones, vision_tx.models\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')]\n"
        "assert not loaded, loaded[:5]\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
