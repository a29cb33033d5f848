"""Official checkpoint -> native vision_tx checkpoint (``tools/convert_weights.py``)."""

from __future__ import annotations

import os

from torch import nn

from vision_tx.backbones import LoadReport, build_backbone, build_classifier, load_weights, save_weights
from vision_tx.models import DETECTORS, DETRPanoptic

# ``<prefix>_<backbone>`` names a whole model; each class builds the model its official checkpoints load into.
CONVERTIBLE_MODELS = {**DETECTORS, "detr_panoptic": DETRPanoptic}


def convertible_model(arch: str) -> tuple[type[nn.Module], str] | None:
    """The class of :data:`CONVERTIBLE_MODELS` that ``arch`` (``<model>_<backbone>``) names, and the backbone's
    name; None for the name of a backbone or classifier."""
    for prefix in sorted(CONVERTIBLE_MODELS, key=len, reverse=True):  # detr_panoptic_ before detr_
        if arch.startswith(f"{prefix}_"):
            return CONVERTIBLE_MODELS[prefix], arch.removeprefix(f"{prefix}_")
    return None


def build_for_conversion(arch: str, form: str = "classifier", num_classes: int | None = None) -> nn.Module:
    """The model a checkpoint of ``arch`` loads into: a classifier or backbone, or ``<model>_<backbone>`` for
    a model of :data:`CONVERTIBLE_MODELS` (``detr_``, ``detr_panoptic_``, ``dino_``; official class counts:
    91 for detection, 250 for panoptic)."""
    found = convertible_model(arch)
    if found is not None:
        model_class, backbone = found
        return model_class.for_conversion(backbone, num_classes)
    if form == "backbone":
        return build_backbone(arch)
    return build_classifier(arch, num_classes=num_classes or 1000)


def convert_checkpoint(
    arch: str, src: str | os.PathLike, dst: str | os.PathLike, form: str = "classifier",
    num_classes: int | None = None, strict: bool = False,
) -> LoadReport:
    """Loads ``src`` into the ``arch`` model through ``load_weights`` and writes it natively to ``dst``. A whole
    model of another ``num_classes`` than the checkpoint keeps its own tensors with a row per class (its
    ``class_keys``), which the report names."""
    model = build_for_conversion(arch, form, num_classes)
    found = convertible_model(arch)
    report = load_weights(model, src, strict=strict, class_keys=found[0].class_keys if found is not None else ())
    save_weights(model, dst, arch=arch, form=form, source=str(src))
    return report
