"""Compositions of backbone, neck and head."""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from vision_tx.models.detr import DETR, DETRFeatures
from vision_tx.models.detr_panoptic import DETRPanoptic
from vision_tx.models.dfine import DFINE
from vision_tx.models.dino import DINO
from vision_tx.models.mask2former import Mask2Former
from vision_tx.models.rtdetr import RTDETR
from vision_tx.models.segmentor import UperNetSegmentor


class NamedSize(functools.partial):
    """``functools.partial(cls, **size)`` (``func`` the class, ``keywords`` the size) whose call builds through the
    class's builder ``cls.build(*args, **size)`` where it has one (the query detectors, whose constructors take
    their parts), else through ``cls`` itself."""

    def __call__(self, /, *args: Any, **kwargs: Any) -> nn.Module:
        build = getattr(self.func, "build", self.func)
        return build(*self.args, *args, **{**self.keywords, **kwargs})


def named_sizes(*classes: type[nn.Module]) -> dict[str, NamedSize]:
    """``name -> NamedSize(cls, **config)`` for every ``name -> config`` of the ``variants`` table of each of
    ``classes`` (its named sizes, as the backbones' ``VARIANTS``); keyword arguments given at build time override
    the config, and ``table[name].func`` is the class."""
    table: dict[str, NamedSize] = {}
    for cls in classes:
        for name, config in cls.variants.items():
            if name in table:
                raise ValueError(
                    f"{__name__}: {cls.__name__} registers {name!r}, which {table[name].func.__name__} has"
                )
            table[name] = NamedSize(cls, **config)
    return table


# The detectors a config can name (``DetectionModule(detector=...)``), each size by its name: ``rtdetr`` the
# official, ``rtdetr_toy`` the toy one. Each class follows the protocol of docs/CONVENTIONS.md ("Detectors"):
# built as ``(backbone, num_classes, matcher_kwargs=..., criterion_kwargs=..., **kwargs)``, it owns ``loss``,
# ``detections`` (the batch post-processing that export traces; ``detection_outputs`` names its keys),
# ``postprocess`` (its per-image cut), ``postprocess_per_query``, ``cross_attention``, ``convert_state_dict``,
# ``no_weight_decay`` and ``for_conversion``, and names its ``variants``, the ``backbone_out_indices`` it reads and the
# ``score_threshold`` pictures draw from.
DETECTORS = named_sizes(DETR, DFINE, DINO, Mask2Former, RTDETR)

# The detector classes the panoptic task builds on, with the model that wraps each to segment
# (``wrapper(detector, postprocess_kwargs=..., **panoptic_kwargs)``), or None for a detector that segments
# by itself. Either way the panoptic model has ``postprocess_panoptic(outputs, sizes, orig_sizes, is_thing)``
# and its batch form ``panoptic_segments(outputs, size, thing, known)``;
# a wrapper names where the backbone's parameters sit in it (``backbone_prefix``).
PANOPTIC_WRAPPERS: dict[type[nn.Module], type[nn.Module] | None] = {DETR: DETRPanoptic, Mask2Former: None}

# The semantic segmentation heads a config can name (``SegmentationModule(head=...)``), each size by its name
# as the detectors', each built as ``(backbone, num_classes, ignore_index=..., **head_kwargs)`` (Mask2Former
# also takes ``criterion_kwargs``); each owns ``loss``, ``predict``, ``class_keys`` and ``no_weight_decay``.
SEGMENTATION_HEADS = named_sizes(UperNetSegmentor, Mask2Former)

__all__ = [
    "DETECTORS",
    "PANOPTIC_WRAPPERS",
    "SEGMENTATION_HEADS",
    "DETR",
    "DETRFeatures",
    "DETRPanoptic",
    "DFINE",
    "DINO",
    "Mask2Former",
    "RTDETR",
    "NamedSize",
    "UperNetSegmentor",
    "named_sizes",
]
