"""Every config in vision_tx/configs/ trains 2 steps and validates on its toy set on a CPU, as written but for the
sizes set on the command line (a small backbone, the detector's or head's toy size, small images); all in this one
process."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from vision_tx.config_loader import load_config
from vision_tx.lightning.cli import run_cli
from vision_tx.models import DETECTORS, DINO, RTDETR, SEGMENTATION_HEADS, Mask2Former, UperNetSegmentor

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(ROOT.glob("vision_tx/configs/*.yaml"))

# Backbone kwargs that shrink each family (the variant's other settings, window sizes included, stay).
SMALL_BACKBONES = {
    "swin": "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 1, 1, 1]}",
    "nat": "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 1, 1, 1]}",
    "convnext": "{depths: [1, 1, 1, 1], dims: [16, 32, 64, 128]}",
    "vit": "{embed_dim: 16, depth: 1, num_heads: 1, img_size: 32}",
    "deit": "{embed_dim: 16, depth: 1, num_heads: 1, img_size: 32}",
    "mixer": "{embed_dim: 16, depth: 1, img_size: 32}",
    "resnet": None,  # ResNet-50 has no smaller form here: its cost at 64-pixel images is small anyway
}
# Each detector's and head's official name, by class: its toy size is ``<name>_toy`` (UperNet has none).
OFFICIAL_NAMES = {build.func: name for name, build in (DETECTORS | SEGMENTATION_HEADS).items() if not build.keywords}
DEFAULT_DETECTORS = {"InstanceSegmentationModule": "mask2former"}  # the other task modules': detr
DETR_TRANSFORMS = [
    "--data.train_transform",
    "{class_path: vision_tx.data.transforms.DetrTrainTransform, init_args: "
    "{scales: [64], max_size: 96, crop_scales: [64], crop_size: [48, 64]}}",
    "--data.val_transform",
    "{class_path: vision_tx.data.transforms.DetrValTransform, init_args: {size: 64, max_size: 96}}",
]
# Two training steps, then one validation batch, whatever the config's schedule.
SHORT = [
    "--trainer.accelerator",
    "cpu",
    "--trainer.max_steps",
    "2",
    "--trainer.max_epochs",
    "1",
    "--trainer.limit_train_batches",
    "2",
    "--trainer.val_check_interval",
    "2",
    "--trainer.check_val_every_n_epoch",
    "1",
    "--trainer.limit_val_batches",
    "1",
    "--trainer.num_sanity_val_steps",
    "0",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--data.num_workers",
    "0",
]


def small_args(config: Path) -> list[str]:
    """The command-line overrides that make ``config`` small; its classes and structure stay."""
    model = load_config(config)["model"]
    init, module = model["init_args"], model["class_path"].rpartition(".")[2]
    backbone_kwargs = SMALL_BACKBONES[init.get("backbone", "swin_t").split("_")[0].rstrip("0123456789")]
    args = ["--model.backbone_kwargs", backbone_kwargs] if backbone_kwargs else []
    # The classes the config's named sizes build (the task modules' default detector: detr, Mask2Former for instances).
    detector = DETECTORS[init.get("detector", DEFAULT_DETECTORS.get(module, "detr"))].func
    head = SEGMENTATION_HEADS[init.get("head", "upernet")].func
    role, sized = ("head", head) if module == "SegmentationModule" else ("detector", detector)
    if (
        sized is not UperNetSegmentor and module != "ClassificationModule"
    ):  # the toy size, the config's own kwargs dropped
        kwargs = "{num_denoising: 4}" if sized in (DINO, RTDETR) else "{}"
        args += [f"--model.{role}", f"{OFFICIAL_NAMES[sized]}_toy", f"--model.{role}_kwargs", kwargs]
        args += ["--model.criterion_kwargs", "{num_points: 256}"] if sized is Mask2Former else []
    if module in ("DetectionModule", "PanopticModule", "InstanceSegmentationModule"):
        args += ["--data.batch_size", "2", *DETR_TRANSFORMS]
    elif module == "SegmentationModule":
        args += ([] if sized is Mask2Former else ["--model.head_kwargs", "{channels: 16, aux_channels: 8}"]) + [
            "--data.scale",
            "[96, 64]",
            "--data.crop_size",
            "[64, 64]",
            "--data.batch_size",
            "2",
            "--data.val_batch_size",
            "1",
        ]
    elif module == "ClassificationModule":
        args += ["--data.image_size", "32", "--data.batch_size", "4", "--data.val_batch_size", "4"]
    return args


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_trains_and_validates_on_cpu(config: Path, tmp_path_factory, tmp_path: Path) -> None:
    # Each toy set is generated once, for all the configs that read it.
    data_class = load_config(config)["data"]["class_path"]
    toy_cache = tmp_path_factory.getbasetemp() / "toy_cache" / data_class
    run_cli(
        "fit",
        [
            "--config",
            str(config),
            *small_args(config),
            *SHORT,
            "--data.toy_cache_dir",
            str(toy_cache),
            "--trainer.default_root_dir",
            str(tmp_path),
        ],
    )
    metrics = json.loads(next(tmp_path.rglob("metrics.json")).read_text())
    assert metrics and all(values for values in metrics.values())
    assert list(tmp_path.rglob("last.ckpt"))


CHECKPOINT_CLASSES = ("lightning.pytorch.callbacks.ModelCheckpoint", "vision_tx.lightning.callbacks.LatestCheckpoint")


def checkpoint_callbacks(config: Path) -> list[tuple[str, dict]]:
    """The class path and ``init_args`` of each checkpoint-writing callback the config lists, in order."""
    callbacks = load_config(config)["trainer"].get("callbacks") or []
    return [(c["class_path"], c.get("init_args") or {}) for c in callbacks if c["class_path"] in CHECKPOINT_CLASSES]


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_config_keeps_its_best_checkpoint_and_the_latest_as_last_ckpt(config: Path) -> None:
    """Lightning (2.6 on) writes a ModelCheckpoint's ``save_last`` only in a step where it saves a top-k checkpoint:
    with a monitored metric, ``last.ckpt`` would be the best weights and ``--ckpt_path last`` would resume from them.
    Each config keeps the best by its metric in a ModelCheckpoint and writes ``last.ckpt`` from a LatestCheckpoint, and
    no callback also saves a ``last.ckpt`` of its own (two writers make ``last-v1.ckpt``)."""
    (best_class, best), (latest_class, latest) = checkpoint_callbacks(config)
    assert best_class == CHECKPOINT_CLASSES[0] and best["monitor"].startswith("val/") and best["mode"] == "max"
    assert not best.get("save_last")
    assert latest_class == CHECKPOINT_CLASSES[1] and latest == {}


class FallingMetric(BoringModel):
    """val/AP at 0.2, 0.5, 0.3 at steps 2, 4, 6."""

    def on_train_start(self) -> None:
        self.first_step = self.trainer.global_step

    def on_validation_epoch_end(self) -> None:
        self.log("val/AP", {2: 0.2, 4: 0.5, 6: 0.3}.get(self.trainer.global_step, 0.0))


def fit_with_the_configs_checkpoints(
    folder: Path, max_steps: int, validate: bool = True, ckpt_path: str | None = None
) -> tuple[FallingMetric, list]:
    """Fits :class:`FallingMetric` (validation every 2 steps) with ``rtdetr_convnext_toy``'s checkpoint callbacks."""
    callbacks = []
    for class_path, args in checkpoint_callbacks(ROOT / "vision_tx/configs/rtdetr_convnext_toy.yaml"):
        module, _, name = class_path.rpartition(".")
        callbacks.append(getattr(importlib.import_module(module), name)(dirpath=folder, **args))
    model = FallingMetric()
    pl.Trainer(
        max_steps=max_steps,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        limit_val_batches=1 if validate else 0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    ).fit(model, ckpt_path=ckpt_path)
    return model, callbacks


def test_last_ckpt_holds_the_latest_weights_when_the_metric_falls_and_a_run_resumes_from_them(tmp_path: Path) -> None:
    """A metric at 0.2, 0.5, 0.3 at steps 2, 4, 6 leaves the best checkpoint at step 4 and ``last.ckpt`` at step 6,
    which ``ckpt_path="last"`` resumes."""
    _, (best, _) = fit_with_the_configs_checkpoints(tmp_path, 6)
    assert torch.load(best.best_model_path, weights_only=False)["global_step"] == 4
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([Path(best.best_model_path).name, "last.ckpt"])
    resumed, _ = fit_with_the_configs_checkpoints(tmp_path, 8, ckpt_path="last")
    assert resumed.first_step == 6


@pytest.mark.parametrize(("max_steps", "validate"), [(5, True), (3, False)])
def test_last_ckpt_holds_the_final_weights_of_a_run_that_ends_between_validations_or_has_none(
    tmp_path: Path, max_steps: int, validate: bool
) -> None:
    fit_with_the_configs_checkpoints(tmp_path, max_steps, validate)
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == max_steps


def test_dino_swin_toy_reads_each_level_at_the_pixel_a_box_names() -> None:
    """The toy DINO config turns ``exact_valid_ratios`` on (docs/LEARNING.md, "What each lever gave": ahead at 800 steps
    in all five pairs, +0.02 to +0.20 AP); DINO itself and the official-size configs keep the official convention."""
    from tests.test_export import build_task

    assert build_task("dino_swin_toy").model.exact_valid_ratios is True
    assert build_task("dino_swin_toy", detector_kwargs={"nms_threshold": 0.5}).model.exact_valid_ratios is False
