"""Official checkpoint -> native vision_tx checkpoint (``tools/convert_weights.py``)."""

from __future__ import annotations

import os

from torch import nn

from vision_tx.backbones import LoadReport, build_backbone, build_classifier, load_weights, save_weights
from vision_tx.models import DETECTORS, DETRPanoptic

# ``<prefix>_<backbone>`` names a whole model; each class builds the model its official checkpoints load into.
CONVERTIBLE_MODELS = {**DETECTORS, "detr_panoptic": DETRPanoptic}


def build_for_conversion(arch: str, form: str = "classifier", num_classes: int | None = None) -> nn.Module:
    """The model a checkpoint of ``arch`` loads into: a classifier or backbone, or ``<model>_<backbone>`` for
    a model of :data:`CONVERTIBLE_MODELS` (``detr_``, ``detr_panoptic_``, ``dino_``; official class counts:
    91 for detection, 250 for panoptic)."""
    for prefix in sorted(CONVERTIBLE_MODELS, key=len, reverse=True):  # detr_panoptic_ before detr_
        if arch.startswith(f"{prefix}_"):
            return CONVERTIBLE_MODELS[prefix].for_conversion(arch.removeprefix(f"{prefix}_"), num_classes)
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
