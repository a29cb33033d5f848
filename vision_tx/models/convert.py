"""Official checkpoint -> native vision_tx checkpoint (``tools/convert_weights.py``)."""

from __future__ import annotations

import os
from collections.abc import Callable

from torch import nn

from vision_tx.backbones import LoadReport, build_backbone, build_classifier, load_weights, save_weights
from vision_tx.models import DETECTORS, DETR, DETRPanoptic


def detr_panoptic_for_conversion(backbone: str, num_classes: int | None = None) -> DETRPanoptic:
    """The model an official DETR panoptic checkpoint with backbone ``backbone`` loads into: DETR on the backbone's
    four stages (its mask head reads them all) in :class:`DETRPanoptic`, with ``num_classes`` classes (None: COCO
    panoptic's 250)."""
    return DETRPanoptic(DETR.for_conversion(backbone, num_classes or 250))


# ``<prefix>_<backbone>`` names a whole model: a detector at its official size (a name of ``DETECTORS`` whose
# size is its constructor's defaults) or DETR panoptic, built as its official checkpoints load into it.
CONVERTIBLE_MODELS: dict[str, Callable[[str, int | None], nn.Module]] = {
    **{name: build.func.for_conversion for name, build in DETECTORS.items() if not build.keywords},
    "detr_panoptic": detr_panoptic_for_conversion,
}


def convertible_model(arch: str) -> tuple[Callable[[str, int | None], nn.Module], str] | None:
    """What builds the model of :data:`CONVERTIBLE_MODELS` that ``arch`` (``<model>_<backbone>``) names, and the
    backbone's name; None for the name of a backbone or classifier."""
    for prefix in sorted(CONVERTIBLE_MODELS, key=len, reverse=True):  # detr_panoptic_ before detr_
        if arch.startswith(f"{prefix}_"):
            return CONVERTIBLE_MODELS[prefix], arch.removeprefix(f"{prefix}_")
    return None


def build_for_conversion(arch: str, form: str = "classifier", num_classes: int | None = None) -> nn.Module:
    """The model a checkpoint of ``arch`` loads into: a classifier or backbone (``form``), or ``<model>_<backbone>`` for
    a model of :data:`CONVERTIBLE_MODELS` (``detr_``, ``detr_panoptic_``, ``dino_``), with ``num_classes`` classes
    (None: the official class counts, 1000 for a classifier, 91 for detection, 250 for panoptic)."""
    found = convertible_model(arch)
    if found is not None:
        for_conversion, backbone = found
        return for_conversion(backbone, num_classes)
    if form == "backbone":
        return build_backbone(arch)
    return build_classifier(arch, num_classes=num_classes or 1000)


def convert_checkpoint(
    arch: str,
    src: str | os.PathLike,
    dst: str | os.PathLike,
    form: str = "classifier",
    num_classes: int | None = None,
    strict: bool = False,
) -> LoadReport:
    """Loads ``src`` into the ``arch`` model (of ``form`` and ``num_classes``, as :func:`build_for_conversion`) through
    ``load_weights`` (``strict`` as there) and writes it natively to ``dst``. A whole model of another
    ``num_classes`` than the checkpoint keeps its own tensors with a row per class (its ``class_keys``), which the
    report names."""
    model = build_for_conversion(arch, form, num_classes)
    class_keys = model.class_keys if convertible_model(arch) is not None else ()
    report = load_weights(model, src, strict=strict, class_keys=class_keys)
    save_weights(model, dst, arch=arch, form=form, source=str(src))
    return report
