"""The command-line entry points: config names, and evaluation of saved result files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vision_tx.lightning.cli import available_configs, resolve_config

ROOT = Path(__file__).resolve().parents[2]


def test_config_names_resolve_to_the_yaml_files() -> None:
    assert {"detr_swin_t", "detr_swin_s", "detr_swin_b", "detr_nat_tiny", "detr_r50", "upernet_swin_t_ade20k"} <= set(available_configs())
    assert resolve_config("detr_swin_t") == ROOT / "configs" / "detr_swin_t.yaml"


def test_unknown_config_lists_the_known_ones() -> None:
    with pytest.raises(SystemExit, match=r"no config named 'detr_swin_x'.*detr_swin_t"):
        resolve_config("detr_swin_x")


@pytest.mark.parametrize("iou_type, expected", [
    ("bbox", "AP    0.5045806987249628\n  AP50  0.6969727247299577"),
    ("segm", "AP    0.3195452758576433\n  AP50  0.5622883972521636"),
])
def test_eval_tool_prints_pycocotools_numbers(shared_data: Path, iou_type: str, expected: str) -> None:
    folder = shared_data / "coco_eval_parity"
    results = folder / f"instances_val2014_fake{iou_type}100_results.json"
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "eval.py"), "--gt", str(folder / "instances_val2014_100.json"),
         "--results", str(results), "--iou-type", iou_type],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    assert "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]" in out
    assert expected in out
