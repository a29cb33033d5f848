"""The command-line entry points: config names, evaluation of saved result files, and the messages
for bad configs and bad checkpoints (which stop the run before training starts)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace
from lightning.pytorch import LightningDataModule, LightningModule

from tests.lightning.tools import ROOT, run_tool_in_process
from vision_tx.data.toy import make_toy_coco
from vision_tx.lightning.cli import (
    VisionTxCLI,
    available_configs,
    command_line,
    eval_main,
    latest_last_checkpoint,
    model_option_names,
    resolve_config,
    resolve_config_args,
    run_cli,
    worker_message,
)

# The toy DETR, shrunk: runs that stop on a bad input never get to train it.
TINY = [
    "--config",
    "detr_swin_toy",
    "--model.detector_kwargs",
    "{num_queries: 5, hidden_dim: 32, num_heads: 2, num_encoder_layers: 1, num_decoder_layers: 1, dim_feedforward: 64}",
    "--data.num_workers",
    "0",
    "--trainer.accelerator",
    "cpu",
    "--trainer.logger",
    "false",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--trainer.max_steps",
    "1",
    "--trainer.num_sanity_val_steps",
    "0",
    "--trainer.limit_val_batches",
    "0",
]


def test_config_names_resolve_to_the_yaml_files() -> None:
    assert {"detr_swin_t", "detr_swin_s", "detr_swin_b", "detr_nat_tiny", "detr_r50", "upernet_swin_t_ade20k"} <= set(
        available_configs()
    )
    assert resolve_config("detr_swin_t") == ROOT / "vision_tx" / "configs" / "detr_swin_t.yaml"


def test_unknown_config_lists_the_known_ones() -> None:
    with pytest.raises(SystemExit, match=r"no config named 'detr_swin_x'.*detr_swin_t"):
        resolve_config("detr_swin_x")


@pytest.mark.parametrize(
    "iou_type, expected",
    [
        ("bbox", "AP    0.5045806987249628\n  AP50  0.6969727247299577"),
        ("segm", "AP    0.3195452758576433\n  AP50  0.5622883972521636"),
    ],
)
def test_eval_tool_prints_pycocotools_numbers(shared_data: Path, tmp_path: Path, iou_type: str, expected: str) -> None:
    folder = shared_data / "coco_eval_parity"
    results = folder / f"instances_val2014_fake{iou_type}100_results.json"
    out = run_tool_in_process(
        "eval.py",
        "--gt",
        str(folder / "instances_val2014_100.json"),
        "--results",
        str(results),
        "--iou-type",
        iou_type,
        cwd=tmp_path,
    ).stdout
    assert "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]" in out
    assert expected in out
    assert f"{iou_type} AP per category: the 10 lowest AP of 80 categories (all in metrics.json)" in out
    assert "per_category" not in out
    written = json.loads((tmp_path / "metrics.json").read_text())  # --out defaults to the working directory
    assert list(written) == [iou_type] and len(written[iou_type].pop("per_category")) == 80
    assert f"AP    {written[iou_type]['AP']!r}\n  AP50  {written[iou_type]['AP50']!r}" == expected


def test_eval_tool_writes_panoptic_metrics(shared_data: Path, tmp_path: Path) -> None:
    folder = shared_data / "panoptic_sample"
    files = [str(folder / "panoptic_examples.json"), str(folder / "panoptic_examples")]
    run_tool_in_process(
        "eval.py",
        "--gt-panoptic",
        files[0],
        "--gt-folder",
        files[1],
        "--pred-panoptic",
        files[0],
        "--pred-folder",
        files[1],
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
    )
    written = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert list(written) == ["panoptic"] and written["panoptic"].pop("per_category")
    assert written["panoptic"] == {
        key: 1.0 for key in ("PQ", "SQ", "RQ", "PQ_th", "SQ_th", "RQ_th", "PQ_st", "SQ_st", "RQ_st")
    }


@pytest.fixture(scope="module")
def tiny_coco(tmp_path_factory) -> Path:
    return make_toy_coco(tmp_path_factory.mktemp("coco") / "root", num_train=2, num_val=2, min_side=32, max_side=48)


def _tiny_args(root: Path, out: Path, *extra: str) -> list[str]:
    return [*TINY, "--data.root", str(root), "--trainer.default_root_dir", str(out), *extra]


def test_unknown_option_lists_the_valid_ones(tiny_coco: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        run_cli("fit", _tiny_args(tiny_coco, tmp_path, "--model.lrr", "1e-4"))
    err = capsys.readouterr().err
    assert (
        "error: DetectionModule has no option 'lrr' (did you mean 'lr'?). "
        "Valid options: backbone, detector, num_classes" in err
    )
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text("data:\n  init_args:\n    batch_sise: 2\n")
    with pytest.raises(SystemExit):
        run_cli("fit", [*_tiny_args(tiny_coco, tmp_path), "--config", str(misspelt)])
    err = capsys.readouterr().err
    assert "CocoDetectionDataModule has no option 'batch_sise' (did you mean 'batch_size'?). Valid options: root" in err


def test_wrong_type_names_the_key_and_the_value(tiny_coco: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        run_cli("fit", _tiny_args(tiny_coco, tmp_path, "--model.lr", "fast"))
    err = capsys.readouterr().err
    assert 'Parser key "lr":' in err and "Expected a <class 'float'>. Got value: fast" in err


def test_unknown_backbone_lists_the_names(tiny_coco: Path, tmp_path: Path) -> None:
    with pytest.raises(
        SystemExit,
        match=r"error: unknown backbone 'swin_x' \(did you mean 'swin_t'\?\); known names: .*nat_base, .*swin_t",
    ):
        run_cli("fit", _tiny_args(tiny_coco, tmp_path, "--model.backbone", "swin_x"))


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def _bad_checkpoint(path: Path, kind: str) -> Path:
    lightning = {"pytorch-lightning_version": "2.6.0", "epoch": 0}
    if kind == "truncated":
        torch.save({"state_dict": {"w": torch.zeros(1000)}, **lightning}, path)
        path.write_bytes(path.read_bytes()[:2000])
    elif kind == "untrusted":
        torch.save({"state_dict": {}, "payload": _Payload(), **lightning}, path)
    elif kind == "plain weights":
        torch.save({"model": {"w": torch.zeros(1)}}, path)
    elif kind == "another model":  # DETR for COCO's 91 classes, not the toy's 3 (+ no-object)
        torch.save({"state_dict": {"model.class_embed.weight": torch.zeros(92, 32)}, **lightning}, path)
    return path


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("missing", "no such checkpoint file"),
        ("truncated", "not a readable PyTorch checkpoint, corrupt or truncated"),
        ("untrusted", "refused: the file holds Python objects other than tensors"),
        ("plain weights", "not a training checkpoint written by tools/train.py"),
        (
            "another model",
            r"shapes differ from this DetectionModule, .*model\.class_embed\.weight "
            r"\(checkpoint \(92, 32\), model \(5, 32\)\)",
        ),
    ],
)
def test_train_refuses_a_bad_checkpoint_before_training(
    tiny_coco: Path, tmp_path: Path, capsys, kind: str, problem: str
) -> None:
    ckpt = _bad_checkpoint(tmp_path / "bad.ckpt", kind)
    with pytest.raises(SystemExit, match=rf"^error: {ckpt}: {problem}"):
        run_cli("fit", _tiny_args(tiny_coco, tmp_path, "--ckpt_path", str(ckpt)))
    assert "this must never run" not in capsys.readouterr().out
    assert [p.name for p in tmp_path.rglob("*.ckpt")] == ([] if kind == "missing" else ["bad.ckpt"])  # nothing saved


def test_eval_refuses_a_bad_checkpoint(tiny_coco: Path, tmp_path: Path) -> None:
    ckpt = _bad_checkpoint(tmp_path / "bad.ckpt", "truncated")
    with pytest.raises(SystemExit, match=rf"^error: {ckpt}: not a readable PyTorch checkpoint, corrupt or truncated"):
        eval_main([*_tiny_args(tiny_coco, tmp_path), "--ckpt", str(ckpt)])


def test_eval_of_a_checkpoint_writes_metrics_to_out(tiny_coco: Path, tmp_path: Path, capsys) -> None:
    run_cli("fit", _tiny_args(tiny_coco, tmp_path / "run", "--data.batch_size", "1"))
    ckpt = next((tmp_path / "run").rglob("last.ckpt"))
    eval_main(
        [
            *_tiny_args(tiny_coco, tmp_path / "eval", "--trainer.limit_val_batches", "1"),
            "--ckpt",
            str(ckpt),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert f"metrics: {tmp_path / 'out' / 'metrics.json'}" in capsys.readouterr().out
    written = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert written == json.loads(next((tmp_path / "eval").rglob("metrics.json")).read_text())
    assert list(written) == ["bbox"] and written["bbox"]["per_category"] and 0 <= written["bbox"]["AP"] <= 1
    for picture in ("confusion_matrix", "pr_curve", "f1_curve"):  # the report's pictures beside the numbers
        assert (tmp_path / "out" / f"{picture}.png").read_bytes() == next(
            (tmp_path / "eval").rglob(f"{picture}.png")
        ).read_bytes()


def test_model_options_on_the_command_line_win_over_the_checkpoints(tiny_coco: Path, tmp_path: Path, caplog) -> None:
    """LightningCLI passes a checkpoint's hyperparameters over the command line (Lightning #20801); the options
    the command line gives are put back over them, a dict merged into the checkpoint's so that the rest of the
    trained model is as trained (else its weights would not load)."""
    run_cli("fit", _tiny_args(tiny_coco, tmp_path / "run", "--data.batch_size", "1", "--model.lr", "1e-4"))
    ckpt = str(next((tmp_path / "run").rglob("last.ckpt")))
    validate = _tiny_args(tiny_coco, tmp_path / "eval", "--trainer.limit_val_batches", "1")
    as_trained = run_cli("validate", [*validate, "--ckpt_path", ckpt]).model.hparams
    assert as_trained.lr == 1e-4  # the config's 2e-4 gives way to the checkpoint
    changed = run_cli(
        "validate", [*validate, "--model.lr=3e-4", "--model.detector_kwargs", "{dropout: 0.25}", "--ckpt_path", ckpt]
    )
    assert changed.model.hparams.lr == 3e-4
    assert changed.model.hparams.detector_kwargs == {**as_trained.detector_kwargs, "dropout": 0.25}
    assert as_trained.detector_kwargs.get("dropout") != 0.25
    assert "lr: 0.0003 (checkpoint: 0.0001)" in caplog.text


def test_model_options_are_read_in_every_form_the_parser_takes() -> None:
    args = ["--model.lr", "1e-3", "--model.init_args.detector_kwargs={a: 1}", "--data.root", "x", "--model.lr=2e-3"]
    assert model_option_names(args) == ["lr", "detector_kwargs"]


def test_model_options_are_read_from_the_command_line_lightning_parses(
    tiny_coco: Path, tmp_path: Path, monkeypatch
) -> None:
    # A user's own script: VisionTxCLI without args parses sys.argv, and the options recorded are those.
    monkeypatch.setattr(
        sys, "argv", ["train.py", *resolve_config_args(_tiny_args(tiny_coco, tmp_path, "--model.lr", "3e-4"))]
    )
    cli = VisionTxCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        run=False,
        save_config_callback=None,
    )
    assert "lr" in cli.command_line_model_options and cli.model.hparams.lr == 3e-4
    assert command_line(("--model.lr", "1")) == ["--model.lr", "1"]
    assert command_line({"model": {"init_args": {"lr": 1.0}}}) == [] and command_line(Namespace(lr=1.0)) == []


def test_bad_data_root_stops_with_the_expected_layout(tmp_path: Path) -> None:
    with pytest.raises(
        SystemExit,
        match=rf"(?s)^error: {tmp_path}: not a COCO detection root, .*Expected the layout\n"
        rf"  {tmp_path}/val2017/\*\.jpg\n  {tmp_path}/annotations/instances_val2017\.json",
    ):
        run_cli("fit", _tiny_args(tmp_path, tmp_path))


def test_an_error_from_a_loader_worker_is_its_own_message() -> None:
    from torch._utils import ExceptionWrapper

    from vision_tx.data.invalid import InvalidDataError

    try:
        raise InvalidDataError("train2017/1.jpg: truncated image (image id 1, annotations/instances_train2017.json)")
    except InvalidDataError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(InvalidDataError) as caught:
        wrapped.reraise()
    assert "Traceback" in str(caught.value)
    assert (
        worker_message(caught.value)
        == "train2017/1.jpg: truncated image (image id 1, annotations/instances_train2017.json)"
    )
    assert worker_message(InvalidDataError("plain")) == "plain"


def test_ckpt_path_last_finds_the_newest_last_checkpoint_of_any_version(tmp_path: Path) -> None:
    # Each run logs into a new version folder: "last" must look in the earlier ones.
    assert latest_last_checkpoint(tmp_path) == "last" and latest_last_checkpoint(None) == "last"
    older, newer = (tmp_path / "lightning_logs" / f"version_{i}" / "checkpoints" / "last.ckpt" for i in (1, 0))
    for age, path in ((100, older), (10, newer)):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"")
        os.utime(path, (path.stat().st_atime, path.stat().st_mtime - age))
    assert latest_last_checkpoint(tmp_path) == str(newer)
