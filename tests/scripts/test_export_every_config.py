"""scripts/export_every_config.py: the full-size export pass over every config (run by hand; here on the smallest)."""

from __future__ import annotations

import importlib.util
import json
import runpy
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def script() -> dict[str, Any]:
    return runpy.run_path(str(SCRIPTS / "export_every_config.py"))


def script_module() -> ModuleType:
    """The script as a module, so that a test can replace what its functions call."""
    spec = importlib.util.spec_from_file_location("export_every_config", SCRIPTS / "export_every_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_task_gets_its_datasets_class_count_and_size() -> None:
    task_setting = script()["task_setting"]
    assert task_setting("swin_t_imagenet") == (1000, None, (224, 224))
    assert task_setting("upernet_swin_t_ade20k") == (150, None, (512, 512))
    assert task_setting("dino_swin_l") == (91, None, (384, 512))
    classes, is_thing, _ = task_setting("mask2former_swin_t_coco_panoptic")
    assert classes == 201 and is_thing[90] and not is_thing[91] and len(is_thing) == 200
    assert task_setting("rtdetr_convnext_toy")[0] == 4


def test_a_config_exports_and_a_failure_is_reported_with_exit_status_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken_toy.yaml"  # a config whose model cannot be built: reported, the others still run
    broken.write_text(
        "model:\n  class_path: vision_tx.lightning.classification.ClassificationModule\n"
        "  init_args:\n    backbone: no_such_backbone\n"
    )
    out = tmp_path / "results.json"
    monkeypatch.setattr(
        sys, "argv", ["export_every_config.py", "--only", str(broken), "classification_toy", "--out", str(out)]
    )
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


def test_an_unknown_config_name_is_refused_before_any_export(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["export_every_config.py", "--only", "classification_toy", "no_such_config"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(SCRIPTS / "export_every_config.py"), run_name="__main__")
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert "no config named 'no_such_config'" in captured.err and "ok " not in captured.out


def test_agreement_counts_detections_found_anywhere_and_equal_pixels() -> None:
    """Two eager detections, onnxruntime's in the other order with one box moved by 1e-3: half found; a segment map
    with one pixel of 200 changed: 99.5% agree."""
    import torch

    from vision_tx.export import DetectionExport, PanopticExport

    names = script()
    detector = DetectionExport.__new__(DetectionExport)  # only its class and output names are read
    detector.output_names = ("boxes", "scores", "labels")
    boxes = torch.tensor([[[10.0, 20.0, 30.0, 40.0], [500.0, 300.0, 600.0, 400.0]]])
    scores, labels = torch.tensor([[0.9, 0.5]]), torch.tensor([[1, 2]])
    moved = boxes.flip(1).clone()
    moved[0, 0, 0] += 1e-3  # the second eager box, now first
    assert (
        names["outputs_agreement"](detector, [boxes.flip(1), scores.flip(1), labels.flip(1)], (boxes, scores, labels))
        == 1.0
    )
    assert names["outputs_agreement"](detector, [moved, scores.flip(1), labels.flip(1)], (boxes, scores, labels)) == 0.5
    within_rtol = boxes.clone()
    within_rtol[0, 1, 0] += 4e-4  # 500 px: within 1e-4 + 1e-6 * 500
    assert names["outputs_agreement"](detector, [within_rtol, scores, labels], (boxes, scores, labels)) == 1.0

    panoptic = PanopticExport.__new__(PanopticExport)
    segments = torch.zeros(1, 10, 20, dtype=torch.long)
    changed = segments.clone()
    changed[0, 3, 4] = 1
    segment_labels, segment_scores = torch.tensor([[1, -1]]), torch.tensor([[0.8, 0.0]])
    got = [changed, segment_labels, segment_scores]
    assert names["outputs_agreement"](panoptic, got, (segments, segment_labels, segment_scores)) == pytest.approx(0.995)


def test_a_config_whose_onnx_outputs_disagree_fails_unless_its_network_outputs_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime's top labels shifted by one: 0% agree; the network's own outputs (logits) still agree, so the config
    passes as post-processed at near-ties. Its logits shifted too: it fails, with both figures."""
    module = script_module()
    run_onnx = module.run_onnx

    def shifted(logits_too: bool) -> Any:
        def run(path: Path, images: Any) -> list[Any]:
            outputs = run_onnx(path, images)
            if len(outputs) == 1:  # the network alone: its logits
                return [outputs[0] + 1] if logits_too else outputs
            probabilities, top_labels, top_scores = outputs
            return [probabilities, top_labels + 1, top_scores]

        return run

    monkeypatch.setattr(module, "run_onnx", shifted(logits_too=False))
    result = module.check_config("classification_toy", tmp_path)
    assert result["ok"] and not result["strict"] and result["agreement"] == 0.0 and result["network_difference"] < 1e-4
    assert module.outcome(result).startswith(
        "network outputs (output) within"
    ) and "(agrees on 0.00%)" in module.outcome(result)
    monkeypatch.setattr(module, "run_onnx", shifted(logits_too=True))
    with pytest.raises(
        AssertionError,
        match=r"agrees with eager on 0.00% of the outputs \(at least 99% needed\), and the "
        r"network's own outputs \(output\) differ by 1.0e\+00",
    ):
        module.check_config("classification_toy", tmp_path)


def test_panoptic_agreement_pairs_segments_whatever_their_numbers() -> None:
    """Segments 1 (label 5) and 2 (label 7) numbered the other way round by onnxruntime: all pixels agree; the same
    numbers with the labels swapped: only the unlabelled pixels agree."""
    import torch

    from vision_tx.export import PanopticExport

    panoptic = PanopticExport.__new__(PanopticExport)
    ids = torch.zeros(1, 4, 5, dtype=torch.long)
    ids[0, :2] = 1
    ids[0, 2:, :3] = 2  # 10 pixels of segment 1, 6 of segment 2, 4 without a segment
    labels, scores = torch.tensor([[5, 7, -1]]), torch.tensor([[0.9, 0.8, 0.0]])
    renumbered = torch.where(ids == 1, 2, torch.where(ids == 2, 1, ids))
    agreement = script()["outputs_agreement"]
    assert agreement(panoptic, [renumbered, torch.tensor([[7, 5, -1]]), scores], (ids, labels, scores)) == 1.0
    assert agreement(panoptic, [ids, torch.tensor([[7, 5, -1]]), scores], (ids, labels, scores)) == pytest.approx(
        4 / 20
    )
