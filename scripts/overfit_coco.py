"""Overfits a small DETR on the first COCO128 images at reduced resolution, from scratch.

A check that the whole detection path learns on real images: COCO annotation loading, DETR's
resize and normalisation, backbone, transformer, Hungarian matching, set loss, box post-processing
and COCO box AP (pycocotools) at the images' original size. It writes the annotations of the first
``--images`` images (by image id, each with at least one non-crowd box) to a temporary COCO root,
trains on them and validates on the same images until AP50 reaches ``--target``, then prints the
steps, minutes, AP and AP50.

    python scripts/overfit_coco.py                  # 16 images of ../shared/data/coco128
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import lightning.pytorch as pl

from vision_tx.data.detection import CocoDetectionDataModule
from vision_tx.data.transforms import DetrValTransform
from vision_tx.lightning.detection import DetectionModule
from vision_tx.lightning.overfit import SMALL_SWIN, fit_until

COCO128 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "coco128"
SPLIT = "train2017"
# A narrow, shallow DETR: few objects per image, no pretrained weights, no dropout (memorisation).
SMALL_DETR = {
    "num_queries": 50, "hidden_dim": 128, "num_heads": 4, "num_encoder_layers": 2,
    "num_decoder_layers": 2, "dim_feedforward": 512, "dropout": 0.0,
}


def write_subset(root: Path, num_images: int, out_root: Path) -> Path:
    """Writes ``out_root/annotations/instances_train2017.json`` with the first ``num_images`` images
    of ``root`` (by id) that have a non-crowd box, links ``out_root/train2017`` to the images, returns ``out_root``."""
    ann_file = root / "annotations" / f"instances_{SPLIT}.json"
    dataset = json.loads(ann_file.read_text())
    with_boxes = {ann["image_id"] for ann in dataset["annotations"] if not ann.get("iscrowd", 0)}
    images = sorted((img for img in dataset["images"] if img["id"] in with_boxes), key=lambda img: img["id"])[:num_images]
    if len(images) < num_images:
        raise SystemExit(f"{ann_file}: only {len(images)} images with non-crowd boxes, asked for {num_images}")
    ids = {img["id"] for img in images}
    subset = {**dataset, "images": images, "annotations": [a for a in dataset["annotations"] if a["image_id"] in ids]}
    (out_root / "annotations").mkdir(parents=True)
    (out_root / "annotations" / f"instances_{SPLIT}.json").write_text(json.dumps(subset))
    (out_root / SPLIT).symlink_to((root / SPLIT).resolve(), target_is_directory=True)
    return out_root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=COCO128, help="COCO root with train2017/ (default: the shared COCO128)")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--short-side", type=int, default=192)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--val-every", type=int, default=100, help="validate every this many steps")
    parser.add_argument("--target", type=float, default=0.5, help="stop once validation AP50 reaches this")
    parser.add_argument("--lr", type=float, default=2e-4)
    args = parser.parse_args()

    pl.seed_everything(0)
    work_dir = Path(tempfile.mkdtemp(prefix="overfit_coco_"))
    subset = write_subset(args.root, args.images, work_dir / "coco")
    # The same fixed resize for training and validation: the check is memorisation, not augmentation.
    resize = DetrValTransform(args.short_side, max_size=args.short_side * 5 // 3)
    datamodule = CocoDetectionDataModule(
        str(subset), train_split=SPLIT, val_split=SPLIT, train_transform=resize, val_transform=resize,
        batch_size=args.batch_size, num_workers=0,
    )
    module = DetectionModule(
        "swin_t", backbone_kwargs=SMALL_SWIN, detr_kwargs=SMALL_DETR, lr=args.lr, backbone_lr=args.lr,
        lr_drop_epochs=args.max_steps, num_visualized=0,
    )
    trainer, minutes = fit_until(
        module, datamodule, "val/AP50", args.target, args.max_steps, args.val_every, str(work_dir), gradient_clip_val=0.1
    )
    ap, ap50 = (float(trainer.callback_metrics[f"val/{k}"]) for k in ("AP", "AP50"))
    print(
        f"{args.images} COCO images at shorter side {args.short_side}: {trainer.global_step} steps, {minutes:.1f} min, "
        f"box AP {ap:.4f}, AP50 {ap50:.4f} (target {args.target})"
    )
    if ap50 < args.target:
        raise SystemExit(f"AP50 {ap50:.4f} is below the target {args.target}")


if __name__ == "__main__":
    main()
