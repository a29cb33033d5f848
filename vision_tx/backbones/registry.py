"""Name -> constructor tables for backbones and classifiers.

Each architecture file registers its variants with :func:`register_backbone`; the factory functions
below are the only way the rest of vision_tx (and users) build them.
"""

from __future__ import annotations

from typing import Callable, Sequence

from torch import nn

_BACKBONES: dict[str, Callable[..., nn.Module]] = {}
_CLASSIFIERS: dict[str, Callable[..., nn.Module]] = {}


def register_backbone(name: str, backbone: Callable[..., nn.Module], classifier: Callable[..., nn.Module] | None = None) -> None:
    """Registers ``backbone(**kwargs)`` (dense-prediction form) and optionally its classifier form."""
    if name in _BACKBONES:
        raise ValueError(f"backbone {name!r} is registered twice")
    _BACKBONES[name] = backbone
    if classifier is not None:
        _CLASSIFIERS[name] = classifier


def list_backbones() -> list[str]:
    """Names accepted by :func:`build_backbone`, sorted."""
    _import_architectures()
    return sorted(_BACKBONES)


def _lookup(table: dict[str, Callable[..., nn.Module]], name: str, what: str) -> Callable[..., nn.Module]:
    _import_architectures()
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; known names: {', '.join(sorted(table))}")
    return table[name]


def build_backbone(name: str, out_indices: Sequence[int] = (0, 1, 2, 3), **kwargs) -> nn.Module:
    """Builds a backbone for dense prediction.

    The module maps images ``[N, 3, H, W]`` to an ordered dict ``res{i+2} -> [N, C_i, H/s_i, W/s_i]``
    for each ``i`` in ``out_indices``; ``module.out_channels`` and ``module.strides`` list ``C_i`` and
    ``s_i`` in the same order.
    """
    return _lookup(_BACKBONES, name, "backbone")(out_indices=tuple(out_indices), **kwargs)


def build_classifier(name: str, num_classes: int = 1000, **kwargs) -> nn.Module:
    """Builds the image-classification form of a backbone: ``[N, 3, H, W] -> [N, num_classes]`` logits."""
    return _lookup(_CLASSIFIERS, name, "classifier")(num_classes=num_classes, **kwargs)


def _import_architectures() -> None:
    # Importing the architecture modules fills the tables; done lazily to avoid import cycles.
    from vision_tx.backbones import convnext, mixer, nat, resnet, swin, vit  # noqa: F401
