"""Overfits a small UperNet on the three ADE20K sample images (or on the toy set) at reduced resolution.

A check that the whole segmentation path learns: ADE20K layout loading, augmentation, model, loss,
schedule, whole-image inference and mIoU at the labels' original size. It trains a reduced Swin
from scratch through Lightning until validation mIoU reaches ``--target``, then prints the steps,
minutes and mIoU.

    python scripts/overfit_ade20k.py                # the 3 images of ../shared/data/ade20k_sample
    python scripts/overfit_ade20k.py --toy          # the built-in toy set (train split -> val split)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import lightning.pytorch as pl
from overfit_common import SMALL_BACKBONE, fit_until, report
from PIL import Image

from vision_tx.data.ade20k import ADE20KDataset
from vision_tx.data.segmentation import SegmentationDataModule, keep_ratio_size
from vision_tx.lightning.segmentation import SegmentationModule

SAMPLE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ade20k_sample"


def datamodule_for(args: argparse.Namespace) -> SegmentationDataModule:
    """Fixed-scale images (shorter side ``--short-side``), crops covering them whole: pure memorisation on ADE20K."""
    scale = (4 * args.short_side, args.short_side)
    if args.toy:
        return SegmentationDataModule(
            None,
            scale=scale,
            ratio_range=(0.75, 1.5),
            crop_size=(args.short_side,) * 2,
            batch_size=8,
            val_batch_size=8,
            num_workers=0,
        )
    images = ADE20KDataset(args.root, "validation").images
    sizes = [keep_ratio_size(*Image.open(p).size[::-1], scale) for p in images]
    crop = (max(h for h, _ in sizes), max(w for _, w in sizes))
    return SegmentationDataModule(
        str(args.root),
        train_split="validation",
        scale=scale,
        ratio_range=(1.0, 1.0),
        crop_size=crop,
        cat_max_ratio=1.0,
        batch_size=len(images),
        val_batch_size=len(images),
        num_workers=0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=SAMPLE, help="ADE20K-layout root (default: the shared sample)")
    parser.add_argument("--toy", action="store_true", help="train on the toy set instead")
    parser.add_argument("--short-side", type=int, default=256)
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--val-every", type=int, default=50, help="validate every this many steps")
    parser.add_argument("--target", type=float, default=0.8, help="stop once validation mIoU reaches this")
    parser.add_argument("--lr", type=float, default=2e-3)
    args = parser.parse_args()

    pl.seed_everything(0)
    datamodule = datamodule_for(args)
    module = SegmentationModule(
        SMALL_BACKBONE, head_kwargs={"channels": 96, "aux_channels": 64, "dropout": 0.0}, lr=args.lr, warmup_iters=20
    )
    trainer, minutes = fit_until(
        module,
        datamodule,
        "val/mIoU",
        args.target,
        args.max_steps,
        args.val_every,
        tempfile.mkdtemp(prefix="overfit_ade20k_"),
    )
    data = "toy set" if args.toy else f"{len(datamodule.val_set)} ADE20K sample images"
    report(trainer, minutes, data, "mIoU", args.target)


if __name__ == "__main__":
    main()
