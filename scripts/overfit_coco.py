"""Overfits a small DETR (or DINO) on the first COCO128 images at reduced resolution, from scratch.

A check that the whole detection path learns on real images: COCO annotation loading, DETR's
resize and normalisation, backbone, transformer, Hungarian matching, set loss, box post-processing
and COCO box AP (pycocotools) at the images' original size. It writes the annotations of the first
``--images`` images (by image id, each with at least one non-crowd box) to a temporary COCO root,
trains on them and validates on the same images until AP50 reaches ``--target``, then prints the
steps, minutes, AP and AP50.

    python scripts/overfit_coco.py                  # 16 images of ../shared/data/coco128
    python scripts/overfit_coco.py --model dino     # the same with a small DINO
"""

from __future__ import annotations

from vision_tx.data.detection import CocoDetectionDataModule
from vision_tx.lightning.detection import DetectionModule
from vision_tx.lightning.overfit import COCO128_SPLIT, detr_overfit_parser, overfit_detr, report


def main() -> None:
    args = detr_overfit_parser(__doc__, images=16, short_side=192, metric="AP50", models=("detr", "dino")).parse_args()
    trainer, minutes = overfit_detr(  # images with at least one non-crowd box
        DetectionModule, CocoDetectionDataModule, args, f"instances_{COCO128_SPLIT}.json",
        usable=lambda ann: not ann.get("iscrowd", 0), linked=[COCO128_SPLIT], monitor="val/AP50",
    )
    report(trainer, minutes, f"{args.images} COCO images at shorter side {args.short_side}", "AP50", args.target, ["AP"])


if __name__ == "__main__":
    main()
