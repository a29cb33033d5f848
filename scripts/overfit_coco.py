"""Overfits a small DETR (or DINO) on the first COCO128 images at reduced resolution, from scratch.

A check that the whole detection path learns on real images: COCO annotation loading, DETR's
resize and normalisation, backbone, transformer, Hungarian matching, set loss, box post-processing
and COCO box AP (pycocotools) at the images' original size. It writes the annotations of the first
``--images`` images (by image id, each with at least one non-crowd box) to a temporary COCO root,
trains on them and validates on the same images until AP50 reaches ``--target``, then prints the
steps, minutes, AP and AP50.

    python scripts/overfit_coco.py                  # 16 images of ../shared/data/coco128
    python scripts/overfit_coco.py --model dino     # a small DINO (lr 4e-4, shorter side 160, to AP50 0.8)
"""

from __future__ import annotations

from overfit_common import COCO128_SPLIT, detr_overfit_parser, overfit_detr, report

from vision_tx.data.detection import CocoDetectionDataModule
from vision_tx.lightning.detection import DetectionModule

# DINO's own defaults: it learns at twice DETR's learning rate (2e-4 and 4e-4 reached AP50 0.45 and 0.76 after
# 160 steps on the toy set; here 8e-4 reached 0.10 after 100 steps, where 4e-4 was at 0.25), is held to a
# higher target, and reads shorter side 160 (AP50 0.87 after 300 steps, at 0.78x the CPU time per step of
# 192, where 192 needed 350 steps for 0.81).
DINO_DEFAULTS = {"lr": 4e-4, "target": 0.8, "val_every": 50, "short_side": 160}


def main() -> None:
    parser = detr_overfit_parser(__doc__, images=16, short_side=192, metric="AP50", models=("detr", "dino"))
    args = parser.parse_args()
    if args.model == "dino":  # options given on the command line still win
        parser.set_defaults(**DINO_DEFAULTS)
        args = parser.parse_args()
    trainer, minutes = overfit_detr(  # images with at least one non-crowd box
        DetectionModule,
        CocoDetectionDataModule,
        args,
        f"instances_{COCO128_SPLIT}.json",
        usable=lambda ann: not ann.get("iscrowd", 0),
        linked=[COCO128_SPLIT],
        monitor="val/AP50",
    )
    report(
        trainer, minutes, f"{args.images} COCO images at shorter side {args.short_side}", "AP50", args.target, ["AP"]
    )


if __name__ == "__main__":
    main()
