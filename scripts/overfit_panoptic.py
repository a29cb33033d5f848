"""Overfits a small DETR panoptic model on the first COCO128 panoptic images at reduced resolution, from scratch.

A check that the whole panoptic path learns on real images: COCO panoptic PNG and JSON loading,
mask targets through DETR's resize, backbone, transformer, mask head, matching with the mask
losses, panoptic post-processing at the images' original size and PQ with the COCO panoptic rules.
It writes the panoptic annotations of the first ``--images`` images (by image id, each with at
least one non-crowd segment) to a temporary COCO panoptic root, trains DETR and its mask head
jointly on them and validates on the same images (printing the per-category PQ table each time)
until PQ reaches ``--target``, then prints the steps, minutes, PQ, SQ, RQ and box AP.

    python scripts/overfit_panoptic.py              # 8 images of ../shared/data/coco128
"""

from __future__ import annotations

from overfit_common import COCO128_SPLIT, detr_overfit_parser, overfit_detr, report

from vision_tx.data.panoptic import CocoPanopticDataModule
from vision_tx.lightning.panoptic import PanopticModule


def main() -> None:
    args = detr_overfit_parser(__doc__, images=8, short_side=128, metric="PQ").parse_args()
    trainer, minutes = overfit_detr(  # images with at least one non-crowd segment
        PanopticModule,
        CocoPanopticDataModule,
        args,
        f"panoptic_{COCO128_SPLIT}.json",
        usable=lambda ann: any(not s.get("iscrowd", 0) for s in ann["segments_info"]),
        linked=[COCO128_SPLIT, f"annotations/panoptic_{COCO128_SPLIT}"],
        monitor="val/PQ",
    )
    data = f"{args.images} COCO panoptic images at shorter side {args.short_side}"
    report(trainer, minutes, data, "PQ", args.target, ["SQ", "RQ", "AP50"])


if __name__ == "__main__":
    main()
