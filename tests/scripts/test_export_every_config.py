"""scripts/export_every_config.py: the full-size export pass over every config (run by hand; here on the smallest)."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def script() -> dict[str, Any]:
    return runpy.run_path(str(SCRIPTS / "export_every_config.py"))


def test_each_task_gets_its_datasets_class_count_and_size() -> None:
    task_setting = script()["task_setting"]
    assert task_setting("swin_t_imagenet") == (1000, None, (224, 224))
    assert task_setting("upernet_swin_t_ade20k") == (150, None, (512, 512))
    assert task_setting("dino_swin_l") == (91, None, (512, 640))
    classes, is_thing, _ = task_setting("mask2former_swin_t_coco_panoptic")
    assert classes == 201 and is_thing[90] and not is_thing[91] and len(is_thing) == 200
    assert task_setting("rtdetr_convnext_toy")[0] == 4


def test_a_config_exports_and_a_failure_is_reported_with_exit_status_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken_toy.yaml"  # a config whose model cannot be built: reported, the others still run
    broken.write_text("model:\n  class_path: vision_tx.lightning.classification.ClassificationModule\n"
                      "  init_args:\n    backbone: no_such_backbone\n")
    out = tmp_path / "results.json"
    monkeypatch.setattr(sys, "argv", ["export_every_config.py", "--only", str(broken), "classification_toy", "--out", str(out)])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(SCRIPTS / "export_every_config.py"), run_name="__main__")
    assert exited.value.code == 1
    printed = capsys.readouterr().out
    assert f"FAIL {broken}" in printed and "no_such_backbone" in printed
    assert "ok   classification_toy" in printed and "exact, largest difference" in printed
    assert f"1 of 2 configs export and match eager; failed: {broken}" in printed
    failed, ok = json.loads(out.read_text())["results"]
    assert ok["ok"] and ok["strict"] and ok["agreement"] == 1.0 and ok["largest_difference"] < 1e-4
    assert ok["dims"] == {"batch": None, "height": 128, "width": 128}
    assert not failed["ok"] and "no_such_backbone" in failed["error"]


def test_an_unknown_config_name_is_refused_before_any_export(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["export_every_config.py", "--only", "classification_toy", "no_such_config"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(SCRIPTS / "export_every_config.py"), run_name="__main__")
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert "no config named 'no_such_config'" in captured.err and "ok " not in captured.out
