"""DETR panoptic training and validation through the real command line, on the toy panoptic set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torchvision.io import decode_png, read_file

from tests.lightning.test_detection import validate_checkpoint
from tests.lightning.tools import run_tool_in_process
from vision_tx.backbones import save_weights
from vision_tx.data.panoptic import CocoPanopticDataModule
from vision_tx.data.transforms import DetrValTransform
from vision_tx.lightning.cli import class_options
from vision_tx.lightning.detection import DetectionModule
from vision_tx.lightning.panoptic import PREDICTIONS, PanopticModule
from vision_tx.metrics.panoptic import SUMMARY_KEYS, evaluate_panoptic_files

# A small DETR panoptic model at a small toy resolution (the mask head needs a width of 128:
# GroupNorm(8) on width/16 channels). Threshold 0: the barely trained model's segments are kept,
# so the files and the PQ tables hold segments.
TINY_DETR = {
    "num_queries": 8,
    "hidden_dim": 128,
    "num_heads": 4,
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "dim_feedforward": 128,
}
SMALL = [
    "--config",
    "detr_panoptic_swin_toy",
    "--model.detector_kwargs",
    json.dumps(TINY_DETR),
    "--model.postprocess_kwargs",
    "{threshold: 0.0}",
    "--data.num_workers",
    "0",
    "--data.batch_size",
    "4",
    "--data.val_transform.init_args.size",
    "64",
    "--data.val_transform.init_args.max_size",
    "96",
    "--trainer.accelerator",
    "cpu",
    "--trainer.logger",
    "false",
    "--trainer.enable_progress_bar",
    "false",
]


@pytest.fixture(scope="module")
def toy_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("toy_panoptic")


@pytest.fixture(scope="module")
def run(tmp_path_factory, toy_cache) -> tuple[Path, str]:
    """The log folder and console output of 2 training steps and a validation of the 16 toy images."""
    run_dir = tmp_path_factory.mktemp("panoptic_run")
    result = run_tool_in_process(
        "train.py",
        *SMALL,
        "--data.toy_cache_dir",
        str(toy_cache),
        "--data.train_transform.init_args.scales",
        "[64]",
        "--data.train_transform.init_args.max_size",
        "96",
        "--data.train_transform.init_args.crop_scales",
        "[64]",
        "--data.train_transform.init_args.crop_size",
        "[48, 64]",
        "--trainer.max_steps",
        "2",
        "--trainer.val_check_interval",
        "2",
        "--trainer.check_val_every_n_epoch",
        "null",
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.logger",
        "true",
        cwd=run_dir,
    )
    return next(run_dir.rglob("metrics.json")).parent, result.stdout + result.stderr


def test_validation_writes_coco_panoptic_files_that_rescore_the_same(
    run: tuple[Path, str], toy_cache: Path, capsys
) -> None:
    log_dir, console = run
    metrics = json.loads((log_dir / "metrics.json").read_text())
    assert set(metrics["panoptic"]) == {*SUMMARY_KEYS, "per_category"} and "AP" in metrics["bbox"]
    assert list(log_dir.glob("predictions_step*.png")) and (log_dir / "bbox_results.json").is_file()
    written = json.loads((log_dir / f"{PREDICTIONS}.json").read_text())
    assert len(written["annotations"]) == 16 and sum(len(a["segments_info"]) for a in written["annotations"]) > 0
    assert sorted(p.name for p in (log_dir / PREDICTIONS).iterdir()) == sorted(
        a["file_name"] for a in written["annotations"]
    )

    annotations = toy_cache / "annotations"
    rescored = evaluate_panoptic_files(
        annotations / "panoptic_val2017.json",
        annotations / "panoptic_val2017",
        log_dir / f"{PREDICTIONS}.json",
        log_dir / PREDICTIONS,
    )
    assert rescored == {k: v for k, v in metrics["panoptic"].items() if k != "per_category"}
    table = capsys.readouterr().out.strip()  # per-category TP, FP, FN included
    assert "sky" in table and table in console


def test_validation_gives_the_same_pq_on_two_processes(
    run: tuple[Path, str], toy_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One thread in every process: Lightning gives each DDP process cpu_count / 2 threads, and other
    # thread counts sum in other orders, which flips the argmax of the barely trained model's nearly
    # equal mask logits at a few pixels.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ckpt = next(run[0].rglob("last.ckpt"))
    outputs, tables = {}, {}
    for devices in (1, 2):
        out = tmp_path / str(devices)
        out.mkdir()
        metrics, console = validate_checkpoint(ckpt, toy_cache, out, devices, config_args=SMALL)
        outputs[devices] = metrics, json.loads(next(out.rglob(f"{PREDICTIONS}.json")).read_text())
        tables[devices] = re.search(r"^category +\| +PQ .*?^Stuff .*?$", console, re.S | re.M).group(0)
    assert outputs[1] == outputs[2] and tables[1] == tables[2]
    assert len(outputs[2][1]["annotations"]) == 16
    # The barely trained model may match no segment (PQ 0), but every ground-truth segment of the
    # 16 images is counted once, as a TP or an FN: an image scored twice or missed would show.
    counts = [
        row.split("|")[2].split() for row in tables[2].splitlines()[2:] if row.count("|") == 2 and "N =" not in row
    ]
    ground_truth = json.loads((toy_cache / "annotations" / "panoptic_val2017.json").read_text())["annotations"]
    assert sum(int(tp) + int(fn) for tp, _, fn in counts) == sum(
        not s.get("iscrowd", 0) for a in ground_truth for s in a["segments_info"]
    )


def test_infer_draws_the_segments(run: tuple[Path, str], toy_cache: Path, tmp_path: Path) -> None:
    ckpt = next(run[0].rglob("last.ckpt"))
    image = next(toy_cache.rglob("val2017/*.png"))
    out = tmp_path / "pred.png"
    result = run_tool_in_process(
        "infer.py",
        *SMALL,
        "--data.toy_cache_dir",
        str(toy_cache),
        "--ckpt",
        str(ckpt),
        "--image",
        str(image),
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert "wrote" in result.stdout
    assert decode_png(read_file(str(out))).shape == decode_png(read_file(str(image))).shape


def test_export_tool_writes_the_trained_panoptic_model_with_the_datamodules_things(
    run: tuple[Path, str], toy_cache: Path, tmp_path: Path
) -> None:
    """tools/export.py reads things and stuff from the config's datamodule; onnxruntime gives the eager segments."""
    from tests.test_export import assert_outputs_close, run_onnx
    from vision_tx.export import deployable, example_images
    from vision_tx.lightning.inference import load_trained

    ckpt, out = next(run[0].rglob("last.ckpt")), tmp_path / "panoptic.onnx"
    config_args = [*SMALL, "--data.toy_cache_dir", str(toy_cache)]
    result = run_tool_in_process(
        "export.py",
        *config_args,
        "--ckpt",
        str(ckpt),
        "--out",
        str(out),
        "--size",
        "64",
        "64",
        "--fixed-size",
        cwd=tmp_path,
    )
    assert "outputs segment_ids, segment_labels, segment_scores" in result.stdout
    module, datamodule = load_trained(config_args, ckpt)
    model = deployable(module, "detr_panoptic_swin_toy", datamodule.is_thing)
    images = example_images((64, 64), 2, seed=4)
    with torch.no_grad():
        expected = model(images)
    assert (expected[1] >= 0).any()  # segments, not an all-void map
    got = run_onnx(out, images)
    # After 2 steps the queries' masks are nearly alike and float rounding flips a few near-tied pixels (measured:
    # 0.07%); the exact parity is tests/test_export.py's. The segments and their scores are the same.
    assert (got[0] == expected[0]).float().mean() > 0.995
    assert_outputs_close(got[1:], expected[1:], model.output_names[1:])


def test_second_stage_trains_the_mask_head_on_a_frozen_detector(toy_cache: Path, tmp_path: Path) -> None:
    """DETR's two stages: a detection model's weights load into the panoptic model, which then
    trains its mask head only."""
    resize = DetrValTransform(64, max_size=96)
    data = CocoPanopticDataModule(
        toy_cache_dir=str(toy_cache), train_transform=resize, val_transform=resize, batch_size=2, num_workers=0
    )
    detection = DetectionModule(backbone="swin_toy", num_classes=data.num_classes, detector_kwargs=TINY_DETR)
    detection.configure_model()
    save_weights(detection.model, tmp_path / "detection.pth")
    module = PanopticModule(
        backbone="swin_toy",
        detector_kwargs=TINY_DETR,
        weights=str(tmp_path / "detection.pth"),
        panoptic_kwargs={"freeze_detr": True},
        lr=1e-3,
    )
    trainer = pl.Trainer(
        max_steps=1,
        limit_val_batches=0,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, datamodule=data)
    for name, value in detection.model.state_dict().items():
        assert torch.equal(module.model.detr.state_dict()[name], value), name
    # The optimiser holds the mask head's parameters (stepped once: they have AdamW state) and nothing of DETR.
    optimizer = trainer.optimizers[0]
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    head = [*module.model.bbox_attention.parameters(), *module.model.mask_head.parameters()]
    assert optimized == {id(p) for p in head} and all(p in optimizer.state for p in head)


def test_cli_lists_the_options_panoptic_module_passes_on() -> None:
    """A misspelt option's message lists PanopticModule's own options and DetectionModule's, which it takes through
    ``**kwargs``."""
    options = class_options("vision_tx.lightning.panoptic.PanopticModule")
    assert options[:2] == ["panoptic_kwargs", "postprocess_kwargs"] and {"lr", "detector_kwargs", "weights"} <= set(
        options
    )


def test_detectors_by_class_whatever_their_size() -> None:
    """The panoptic task takes every size of a detector that segments (its wrapper by the detector's class)."""
    assert PanopticModule(detector="detr_toy").backbone_prefix == "detr.backbone."
    assert PanopticModule(detector="mask2former_toy").backbone_prefix == "backbone."
    with pytest.raises(
        ValueError, match=r"'dino_toy' does not segment; known: detr, detr_toy, mask2former, mask2former_toy$"
    ):
        PanopticModule(detector="dino_toy")
    with pytest.raises(ValueError, match="'mask2former_toy' segments by itself"):
        PanopticModule(detector="mask2former_toy", panoptic_kwargs={"freeze_detr": True})
