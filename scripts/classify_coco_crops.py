"""Trains classifiers on object crops cut from COCO128's boxes, with and without distillation and SAM.

A small real-image check of the classification task: the non-crowd boxes (at least ``--min-box``
pixels a side) of the ten most frequent categories of ``../shared/data/coco128`` are cut out as
square crops with some context, written in the ImageFolder layout, and split by image (every
``--val-every``-th image's crops are held out), so no object is seen in both splits. Each student is
trained from scratch plainly, with DeiT's hard distillation from a teacher trained first (a student
with a ``*_distilled`` form learns through its distillation token), and with SAM; top-1 and top-5 on
the held-out crops are printed as a table, beside always answering the most frequent training class (for top-5: the five
most frequent). The teacher's own run is the plain row of its architecture when that is a student (same seed, same
recipe: the same run). The defaults take about 5 minutes of one CPU core in all (`--epochs 15`: about 25).

    python scripts/classify_coco_crops.py                                # deit_tiny and convnext_tiny
    python scripts/classify_coco_crops.py --students swin_t resnet50 --teacher resnet50
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from PIL import Image

from vision_tx.backbones import list_backbones
from vision_tx.data.imagefolder import ImageFolderDataModule
from vision_tx.lightning.callbacks import SharpnessAwareMinimization
from vision_tx.lightning.classification import ClassificationModule

COCO128 = Path(__file__).resolve().parents[2] / "shared" / "data" / "coco128"
# Small forms for crops of a few dozen pixels on a CPU, where a name's full size would be too slow; others
# as registered. ViTs get ``img_size`` (their position-embedding grid) from ``--size``.
SMALL_KWARGS: dict[str, dict[str, Any]] = {
    "deit_tiny": {"patch_size": 6, "drop_path_rate": 0.1},
    "convnext_tiny": {"drop_path_rate": 0.1},
    "swin_t": {
        "embed_dim": 48,
        "depths": [2, 2, 2, 2],
        "num_heads": [2, 4, 8, 16],
        "window_size": 3,
        "patch_size": 2,
        "drop_path_rate": 0.1,
    },
}


def small_kwargs(name: str, size: int) -> dict[str, Any] | None:
    """``SMALL_KWARGS`` of ``name`` (a ``*_distilled`` form shares its base's), with ViTs' grid set to ``size``."""
    kwargs = SMALL_KWARGS.get(name.removesuffix("_distilled"))
    if kwargs is None or "patch_size" not in kwargs or not name.startswith(("deit", "vit")):
        return kwargs
    return {**kwargs, "img_size": size}


def cut_crops(
    coco_root: Path, out: Path, categories: int, min_box: int, context: float, side: int, val_every: int
) -> dict[str, Counter]:
    """Writes ``out/{train,val}/CATEGORY/ANN.png`` crops; returns the crop counts per split and category."""
    data = json.loads((coco_root / "annotations" / "instances_train2017.json").read_text())
    names = {c["id"]: c["name"].replace(" ", "_") for c in data["categories"]}
    usable = [a for a in data["annotations"] if not a.get("iscrowd", 0) and min(a["bbox"][2:]) >= min_box]
    top = {cat for cat, _ in Counter(a["category_id"] for a in usable).most_common(categories)}
    image_ids = sorted({a["image_id"] for a in usable})
    held_out = set(image_ids[val_every - 1 :: val_every])
    files = {i["id"]: i["file_name"] for i in data["images"]}
    counts: dict[str, Counter] = {"train": Counter(), "val": Counter()}
    for ann in usable:
        if ann["category_id"] not in top:
            continue
        split = "val" if ann["image_id"] in held_out else "train"
        with Image.open(coco_root / "train2017" / files[ann["image_id"]]) as image:
            x, y, w, h = ann["bbox"]
            half = max(w, h) * (1 + context) / 2
            cx, cy = x + w / 2, y + h / 2
            crop = image.convert("RGB").crop((round(cx - half), round(cy - half), round(cx + half), round(cy + half)))
        folder = out / split / names[ann["category_id"]]
        folder.mkdir(parents=True, exist_ok=True)
        crop.resize((side, side), Image.BICUBIC).save(folder / f"{ann['id']}.png")
        counts[split][names[ann["category_id"]]] += 1
    return counts


def train(
    args: argparse.Namespace,
    root: Path,
    run_dir: Path,
    backbone: str,
    teacher: Path | None = None,
    teacher_backbone: str | None = None,
    sam: bool = False,
) -> dict[str, Any]:
    """Trains one classifier from scratch; returns its final validation metrics, last checkpoint,
    optimiser steps and wall and CPU minutes (this process, all its threads)."""
    pl.seed_everything(args.seed, workers=True)
    module = ClassificationModule(
        backbone,
        backbone_kwargs=small_kwargs(backbone, args.size),
        lr=args.lr,
        lr_batch_size=args.batch_size,
        warmup_epochs=args.warmup_epochs,
        mixup_alpha=args.mixup_alpha,
        cutmix_alpha=args.cutmix_alpha,
        teacher=str(teacher) if teacher else None,
        teacher_backbone=teacher_backbone,
        teacher_kwargs=small_kwargs(teacher_backbone, args.size) if teacher_backbone else None,
    )
    data = ImageFolderDataModule(
        str(root),
        image_size=args.size,
        crop_fraction=1.0,
        repeats=1,
        batch_size=args.batch_size,
        val_batch_size=64,
        num_workers=args.workers,
        train_transform_kwargs={"scale": (0.35, 1.0), "rand_augment_ops": args.rand_augment_ops},
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        default_root_dir=run_dir,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        check_val_every_n_epoch=args.epochs,
        callbacks=[SharpnessAwareMinimization(args.rho)] if sam else [],
    )
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.fit(module, data)
    wall, cpu = (time.perf_counter() - wall) / 60, (time.process_time() - cpu) / 60
    checkpoint = run_dir / "last.ckpt"
    trainer.save_checkpoint(checkpoint)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    return {"metrics": metrics, "checkpoint": checkpoint, "steps": trainer.global_step, "wall": wall, "cpu": cpu}


def distilled_form(name: str) -> str:
    """The ``*_distilled`` form of ``name`` (DeiT's distillation token) when the factory has one, else ``name``."""
    return f"{name}_distilled" if f"{name}_distilled" in list_backbones() else name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--coco", type=Path, default=COCO128)
    parser.add_argument("--students", nargs="+", default=["deit_tiny", "convnext_tiny"])
    parser.add_argument("--teacher", default="convnext_tiny", help="the teacher's architecture, trained first")
    parser.add_argument("--size", type=int, default=48, help="training and validation image side")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3, help="at --batch-size (lr_batch_size = batch size)")
    parser.add_argument("--warmup-epochs", type=float, default=1)
    parser.add_argument("--mixup-alpha", type=float, default=0.0)
    parser.add_argument("--cutmix-alpha", type=float, default=0.0)
    parser.add_argument("--rand-augment-ops", type=int, default=1)
    parser.add_argument("--rho", type=float, default=0.05, help="SAM's neighbourhood radius")
    parser.add_argument("--min-box", type=int, default=16)
    parser.add_argument("--val-every", type=int, default=4, help="every N-th image (by id) is held out")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="where crops and runs go (default: a temporary folder)")
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

    out = args.out or Path(tempfile.mkdtemp(prefix="coco_crops_"))
    root = out / "crops"
    counts = cut_crops(args.coco, root, 10, args.min_box, 0.1, 2 * args.size, args.val_every)
    for split, count in counts.items():
        print(
            f"{split}: {sum(count.values())} crops: " + ", ".join(f"{n} {c}" for n, c in sorted(count.items())),
            flush=True,
        )
    frequent = [name for name, _ in counts["train"].most_common(5)]
    baseline = {
        f"val/top{k}": sum(counts["val"][name] for name in frequent[:k]) / counts["val"].total() for k in (1, 5)
    }
    rows = [(f"always `{frequent[0]}` (top-5: the five most frequent training classes)", {"metrics": baseline})]

    def record(name: str, run: dict[str, Any]) -> None:
        rows.append((name, run))
        print(
            name, run["metrics"], f"{run['steps']} steps, {run['wall']:.1f} min, {run['cpu']:.1f} CPU min", flush=True
        )

    plain = {student: train(args, root, out / student, student) for student in args.students if student == args.teacher}
    teacher = plain.get(args.teacher) or train(args, root, out / "teacher", args.teacher)
    if args.teacher not in args.students:
        record(f"{args.teacher} (teacher)", teacher)
    for student in args.students:
        if student not in plain:
            plain[student] = train(args, root, out / student, student)
        record(student + (" (the teacher)" if student == args.teacher else ""), plain[student])
        distilled = distilled_form(student)
        record(
            f"{distilled} + distillation from {args.teacher}",
            train(
                args,
                root,
                out / f"{distilled}_distillation",
                distilled,
                teacher=teacher["checkpoint"],
                teacher_backbone=args.teacher,
            ),
        )
        record(f"{student} + SAM (rho {args.rho})", train(args, root, out / f"{student}_sam", student, sam=True))

    print(
        f"\n| model (from scratch, {args.size} px, {args.epochs} epochs) | top-1 | top-5 | train crops | val crops "
        f"| steps | minutes (wall) | CPU minutes |\n|---|---|---|---|---|---|---|---|"
    )
    train_size, val_size = counts["train"].total(), counts["val"].total()
    for name, run in rows:
        metrics = run["metrics"]
        time_columns = f"{run['steps']} | {run['wall']:.1f} | {run['cpu']:.1f}" if "steps" in run else "- | - | -"
        print(
            f"| {name} | {metrics.get('val/top1', float('nan')):.3f} | {metrics.get('val/top5', float('nan')):.3f} | "
            f"{train_size} | {val_size} | {time_columns} |"
        )


if __name__ == "__main__":
    main()
