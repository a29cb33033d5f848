"""Official checkpoint -> native vision_tx checkpoint (``tools/convert_weights.py``)."""

from __future__ import annotations

import os

from torch import nn

from vision_tx.backbones.registry import build_backbone, build_classifier
from vision_tx.backbones.weights import LoadReport, load_weights, save_weights


def build_for_conversion(arch: str, form: str = "classifier", num_classes: int | None = None) -> nn.Module:
    """The model a checkpoint of ``arch`` loads into: a classifier or backbone, ``detr_<backbone>``,
    ``detr_panoptic_<backbone>`` or ``dino_<backbone>`` (official class counts: 91 for detection, 250
    for panoptic)."""
    if arch.startswith("dino_"):
        from vision_tx.models import DINO

        return DINO(build_backbone(arch.removeprefix("dino_"), out_indices=DINO.backbone_out_indices), num_classes or 91)
    if arch.startswith("detr_panoptic_"):
        from vision_tx.models import DETR, DETRPanoptic

        backbone = build_backbone(arch.removeprefix("detr_panoptic_"), out_indices=(0, 1, 2, 3))
        return DETRPanoptic(DETR(backbone, num_classes or 250))
    if arch.startswith("detr_"):
        from vision_tx.models import DETR

        return DETR(build_backbone(arch.removeprefix("detr_")), num_classes or 91)
    if form == "backbone":
        return build_backbone(arch)
    return build_classifier(arch, num_classes=num_classes or 1000)


def convert_checkpoint(
    arch: str, src: str | os.PathLike, dst: str | os.PathLike, form: str = "classifier",
    num_classes: int | None = None, strict: bool = False,
) -> LoadReport:
    """Loads ``src`` into the ``arch`` model through ``load_weights`` and writes it natively to ``dst``."""
    model = build_for_conversion(arch, form, num_classes)
    report = load_weights(model, src, strict=strict)
    save_weights(model, dst, arch=arch, form=form, source=str(src))
    return report
