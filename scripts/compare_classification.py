"""Trains a vision_tx classifier and torchvision's ResNet-18 from scratch on the same ImageFolder set
(``ROOT/{train,val}/CLASS/*``) for the same training wall-clock; prints top-1 and top-5 on the
validation split side by side with the images per second of each.

The vision_tx side is ``python tools/train.py --config CONFIG --data.root ROOT`` (run in this process
through vision_tx's CLI), its training time measured without its validations. ResNet-18
(``torchvision.models.resnet18``, no weights) then trains for that long in a plain loop: AdamW
(learning rate 2e-3, weight decay 0.05) under a cosine decay over the time budget after a warm-up
of its first 5%, batches of 32, random resized crops (scale 0.35-1) at the same image size and
horizontal flips. ``--budget-seconds`` gives both a fixed time instead (vision_tx trains with
``--budget.minutes``: its epoch schedule as written, stopped at that time or at its end, whichever comes first). Same
torch threads, seed, no loader workers. Both final models are scored by the same code on the same validation images,
resized and centre-cropped by vision_tx's validation transform.

    python scripts/make_shapes_classification.py /tmp/shapes_cls --seed 0
    python scripts/compare_classification.py /tmp/shapes_cls                       # classification_toy's own 120 epochs
    python scripts/compare_classification.py /tmp/shapes_cls --budget-seconds 200 --seed 1
    python scripts/compare_classification.py /tmp/shapes_cls -- --trainer.max_epochs 40  # after --: vision_tx options

Writes the results, with the CPU and the versions, to OUT/comparison.json.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from compare_common import (
    comparison_parser,
    cpu_description,
    machine_line,
    parse_with_vision_tx_options,
    side_by_side,
    train_vision_tx,
    versions,
    write_report,
)
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from vision_tx.data.imagefolder import val_transforms
from vision_tx.data.transforms import IMAGENET_MEAN, IMAGENET_STD

WARMUP_FRACTION = 0.05


def top_k(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], model: torch.nn.Module) -> dict[str, float]:
    """Top-1 and top-5 accuracy of ``model`` (logits ``[B, C]``) over ``(images, labels)`` batches."""
    model.eval()
    hits = {1: 0, 5: 0}
    count = 0
    with torch.no_grad():
        for images, labels in batches:
            ranked = model(images).argsort(dim=1, descending=True)
            for k in hits:
                hits[k] += int((ranked[:, :k] == labels[:, None]).any(dim=1).sum())
            count += len(labels)
    return {f"top{k}": hits[k] / count for k in hits}


def resnet_loaders(
    root: Path, size: int, crop_fraction: float, batch_size: int, workers: int, seed: int, classes: Sequence[str]
) -> tuple[DataLoader, DataLoader]:
    """ResNet-18's training loader (random resized crop, flip) and the validation loader (vision_tx's transform)."""
    train_pipeline = v2.Compose(
        [
            v2.PILToTensor(),
            v2.RandomResizedCrop(size, scale=(0.35, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    train = ImageFolder(str(root / "train"), transform=train_pipeline)
    val = ImageFolder(str(root / "val"), transform=v2.Compose([v2.PILToTensor(), val_transforms(size, crop_fraction)]))
    if train.classes != list(classes) or val.classes != list(classes):
        raise SystemExit(f"error: {root}: the class folders of train/ and val/ differ from vision_tx's {list(classes)}")
    generator = torch.Generator().manual_seed(seed)
    return (
        DataLoader(train, batch_size, shuffle=True, num_workers=workers, generator=generator, drop_last=True),
        DataLoader(val, 64, num_workers=workers),
    )


def train_resnet(
    loader: DataLoader, num_classes: int, seconds: float, lr: float, seed: int
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """ResNet-18 from scratch, trained for ``seconds`` of wall-clock (AdamW, warm-up then cosine in time)."""
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=num_classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    images = steps = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    elapsed = 0.0
    model.train()
    while elapsed < seconds:
        for batch, labels in loader:
            progress = elapsed / seconds
            factor = (
                progress / WARMUP_FRACTION
                if progress < WARMUP_FRACTION
                else 0.5 * (1 + math.cos(math.pi * (progress - WARMUP_FRACTION) / (1 - WARMUP_FRACTION)))
            )
            for group in optimizer.param_groups:
                group["lr"] = lr * factor
            loss = F.cross_entropy(model(batch), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            images, steps = images + len(labels), steps + 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
    return model, {
        "train_seconds": elapsed,
        "cpu_seconds": time.process_time() - cpu_start,
        "images_seen": images,
        "images_per_second": images / max(elapsed, 1e-9),
        "steps": steps,
        "epochs": images / len(loader.dataset),
        "torch_threads": [torch.get_num_threads()],
        "final_loss": loss.item(),
    }


def parser() -> argparse.ArgumentParser:
    p = comparison_parser(
        __doc__, "an ImageFolder set: train/CLASS/*, val/CLASS/*", "classification_toy", "runs/compare_classification"
    )
    p.add_argument("--resnet-batch", type=int, default=32)
    p.add_argument("--resnet-lr", type=float, default=2e-3)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args, extra = parse_with_vision_tx_options(parser(), sys.argv[1:] if argv is None else argv)
    for folder in ("train", "val"):
        if not (args.root / folder).is_dir():
            raise SystemExit(f"error: {args.root / folder}: no such folder (expected ROOT/{{train,val}}/CLASS/images)")
    torch.set_num_threads(args.threads)
    out = args.out.resolve()

    cli, vtx = train_vision_tx(
        args.config, args.root, out / "vision_tx", args.seed, args.workers, args.budget_seconds, extra
    )
    data = cli.datamodule
    vtx.update(top_k(data.val_dataloader(), cli.model))
    classes, size, crop_fraction = data.class_names, data.hparams.image_size, data.hparams.crop_fraction
    del cli

    budget = args.budget_seconds or vtx["train_seconds"]
    train_loader, val_loader = resnet_loaders(
        args.root, size, crop_fraction, args.resnet_batch, args.workers, args.seed, classes
    )
    model, resnet = train_resnet(train_loader, len(classes), budget, args.resnet_lr, args.seed)
    resnet.update(top_k(val_loader, model))

    report = {
        "data": str(args.root.resolve()),
        "classes": list(classes),
        "image_size": size,
        "budget_seconds": budget,
        "threads": args.threads,
        "seed": args.seed,
        "workers": args.workers,
        "cpu": cpu_description(),
        "versions": versions("torch", "torchvision", "lightning"),
        "vision_tx": {"config": args.config, "extra_args": extra, **vtx},
        "resnet18": {"batch": args.resnet_batch, "lr": args.resnet_lr, "optimizer": "AdamW", **resnet},
    }
    rows = ("top1", "top5", "train_seconds", "cpu_seconds", "images_seen", "images_per_second", "steps")
    print(
        side_by_side(
            f"\nclassification on {args.root} val, {len(classes)} classes, {size} px, training {budget:.0f} s each\n"
            f"{machine_line(report['cpu'], args.threads, report['versions'])}",
            rows,
            {args.config: vtx, "ResNet-18": resnet},
        )
    )
    write_report(out / "comparison.json", report)


if __name__ == "__main__":
    main()
