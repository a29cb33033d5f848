"""Overfitting checks: train a small model on a few images until a validation metric reaches a target.

Shared by ``overfit_coco.py``, ``overfit_panoptic.py`` and ``overfit_ade20k.py`` beside it (which import it as
``overfit_common``: a script's folder is on its import path).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import EarlyStopping

from vision_tx.data.transforms import DetrValTransform

# The toy configs' quarter-width Swin, so that a CPU trains it in minutes.
SMALL_BACKBONE = "swin_toy"
COCO128 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "coco128"
COCO128_SPLIT = "train2017"
# Each detector's toy size (``<model>_toy`` of ``vision_tx.models.DETECTORS``, no pretrained weights) with 50
# queries (real images hold more objects than the toy set's) and, for DINO and RT-DETR, twice the width and 50
# denoising queries: the sizes docs/LEARNING.md's figures were measured at.
TOY_OVERRIDES = {
    "detr": {"num_queries": 50},
    "dino": {"num_queries": 50, "hidden_dim": 128, "dim_feedforward": 512, "num_denoising": 50},
    "rtdetr": {
        "num_queries": 50,
        "hidden_dim": 128,
        "encoder_feedforward": 512,
        "dim_feedforward": 512,
        "num_denoising": 50,
    },
}


def write_coco_subset(
    root: Path,
    ann_file: str,
    num_images: int,
    out_root: Path,
    usable: Callable[[dict[str, Any]], bool],
    linked: Sequence[str],
) -> Path:
    """Writes ``out_root/annotations/{ann_file}`` holding the first ``num_images`` images of
    ``root/annotations/{ann_file}`` (by id) with a ``usable`` annotation, and their annotations;
    links the folders ``linked`` (paths under ``root``) into ``out_root``. Returns ``out_root``."""
    source = root / "annotations" / ann_file
    dataset = json.loads(source.read_text())
    with_targets = {ann["image_id"] for ann in dataset["annotations"] if usable(ann)}
    images = sorted((img for img in dataset["images"] if img["id"] in with_targets), key=lambda img: img["id"])[
        :num_images
    ]
    if len(images) < num_images:
        raise SystemExit(f"{source}: only {len(images)} images with usable annotations, asked for {num_images}")
    ids = {img["id"] for img in images}
    subset = {**dataset, "images": images, "annotations": [a for a in dataset["annotations"] if a["image_id"] in ids]}
    (out_root / "annotations").mkdir(parents=True)
    (out_root / "annotations" / ann_file).write_text(json.dumps(subset))
    for folder in linked:
        (out_root / folder).symlink_to((root / folder).resolve(), target_is_directory=True)
    return out_root


class ValidationProgress(pl.Callback):
    """Prints ``monitor`` after each validation, with the step, the wall-clock minutes and this
    process's CPU seconds per training step since the start (a cost that a loaded machine moves less)."""

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = trainer.global_step
        cpu_per_step = (time.process_time() - self.cpu) / max(step, 1)
        minutes = (time.perf_counter() - self.wall) / 60
        value = float(trainer.callback_metrics[self.monitor])
        print(
            f"step {step}: {self.monitor} {value:.4f} ({minutes:.1f} min, {cpu_per_step:.2f} CPU s per step)",
            flush=True,
        )


def fit_until(
    module: pl.LightningModule,
    datamodule: pl.LightningDataModule,
    monitor: str,
    target: float,
    max_steps: int,
    val_every: int,
    root_dir: str,
    gradient_clip_val: float | None = None,
) -> tuple[pl.Trainer, float]:
    """Trains on the CPU, validating every ``val_every`` steps, until ``monitor`` reaches ``target``
    (or ``max_steps``); returns the trainer and the minutes it took."""
    stop = EarlyStopping(monitor, mode="max", stopping_threshold=target, patience=max_steps)
    trainer = pl.Trainer(
        max_steps=max_steps,
        val_check_interval=val_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        gradient_clip_val=gradient_clip_val,
        accelerator="cpu",
        callbacks=[stop, ValidationProgress(monitor)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root_dir,
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    return trainer, (time.perf_counter() - start) / 60


def report(
    trainer: pl.Trainer, minutes: float, data: str, metric: str, target: float, others: Sequence[str] = ()
) -> None:
    """Prints the steps, minutes and validation ``metric`` (then ``others``) of a :func:`fit_until` run;
    exits with an error where ``metric`` stayed below ``target``."""
    values = {name: float(trainer.callback_metrics[f"val/{name}"]) for name in (metric, *others)}
    shown = ", ".join(f"{name} {value:.4f}" for name, value in values.items())
    print(f"{data}: {trainer.global_step} steps, {minutes:.1f} min, {shown} (target {metric} {target})")
    if values[metric] < target:
        raise SystemExit(f"{metric} {values[metric]:.4f} is below the target {target}")


def detr_overfit_parser(
    description: str, images: int, short_side: int, metric: str, models: Sequence[str] = ("detr",)
) -> argparse.ArgumentParser:
    """The options of the DETR overfitting scripts (``--root``, ``--images``, ``--short-side``, ``--model``
    among ``models``, ...)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--root", type=Path, default=COCO128, help=f"COCO root with {COCO128_SPLIT}/ (default: the shared COCO128)"
    )
    parser.add_argument("--images", type=int, default=images)
    parser.add_argument("--short-side", type=int, default=short_side)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--val-every", type=int, default=100, help="validate every this many steps")
    parser.add_argument("--target", type=float, default=0.5, help=f"stop once validation {metric} reaches this")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument(
        "--model", choices=models, default=models[0], help="the detector (its toy size, with TOY_OVERRIDES)"
    )
    return parser


def overfit_detr(
    module_class: type[pl.LightningModule],
    datamodule_class: type[pl.LightningDataModule],
    args: argparse.Namespace,
    ann_file: str,
    usable: Callable[[dict[str, Any]], bool],
    linked: Sequence[str],
    monitor: str,
) -> tuple[pl.Trainer, float]:
    """Trains ``module_class`` (``args.model``'s toy size on ``SMALL_BACKBONE``, from scratch) on the first
    ``args.images`` images of ``args.root`` (see :func:`write_coco_subset`) and validates on the same images until
    ``monitor`` reaches ``args.target``; returns the trainer and the minutes it took."""
    pl.seed_everything(0)
    work_dir = Path(tempfile.mkdtemp(prefix="overfit_"))
    subset = write_coco_subset(args.root, ann_file, args.images, work_dir / "coco", usable, linked)
    # The same fixed resize for training and validation: the check is memorisation, not augmentation.
    resize = DetrValTransform(args.short_side, max_size=args.short_side * 5 // 3)
    datamodule = datamodule_class(
        str(subset),
        train_split=COCO128_SPLIT,
        val_split=COCO128_SPLIT,
        train_transform=resize,
        val_transform=resize,
        batch_size=args.batch_size,
        num_workers=0,
    )
    module = module_class(
        backbone=SMALL_BACKBONE,
        detector=f"{args.model}_toy",
        detector_kwargs=TOY_OVERRIDES[args.model],
        lr=args.lr,
        backbone_lr=args.lr,
        lr_drop_epochs=args.max_steps,
        num_visualized=0,
    )
    return fit_until(
        module, datamodule, monitor, args.target, args.max_steps, args.val_every, str(work_dir), gradient_clip_val=0.1
    )
