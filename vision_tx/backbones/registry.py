"""Name -> constructor tables for backbones and classifiers.

Each architecture file holds its table of variants (``name -> constructor keyword arguments``) and
registers its classes with the decorators, as timm's ``@register_model`` does::

    @register_backbone(VARIANTS)
    class SwinTransformer(StagedBackbone): ...

    @register_classifier(VARIANTS)
    class SwinClassifier(ClassifierMixin, SwinTransformer): ...

``vision_tx.backbones`` imports every architecture file, so the tables are full once it is imported;
this module imports none of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from torch import nn

_BACKBONES: dict[str, Callable[..., nn.Module]] = {}
_CLASSIFIERS: dict[str, Callable[..., nn.Module]] = {}

ModelClass = TypeVar("ModelClass", bound=type)


def _register(
    table: dict[str, Callable[..., nn.Module]], variants: Mapping[str, Mapping[str, Any]], what: str
) -> Callable[[ModelClass], ModelClass]:
    def decorate(cls: ModelClass) -> ModelClass:
        for name, config in variants.items():
            if name in table:
                raise ValueError(f"{what} {name!r} is registered twice")
            table[name] = functools.partial(cls, **config)  # keyword arguments given at build time override the config
        return cls

    return decorate


def register_backbone(variants: Mapping[str, Mapping[str, Any]]) -> Callable[[ModelClass], ModelClass]:
    """Class decorator: each ``name -> config`` of ``variants`` builds ``cls(**config, out_indices=..., **kwargs)``
    in :func:`build_backbone`."""
    return _register(_BACKBONES, variants, "backbone")


def register_classifier(variants: Mapping[str, Mapping[str, Any]]) -> Callable[[ModelClass], ModelClass]:
    """Class decorator: each ``name -> config`` of ``variants`` builds ``cls(**config, num_classes=..., **kwargs)``
    in :func:`build_classifier`. A classifier class without a dense form says why in ``no_dense_form``."""
    return _register(_CLASSIFIERS, variants, "classifier")


def list_backbones() -> list[str]:
    """Every registered name (dense-prediction backbones and classifiers), sorted."""
    return sorted(_BACKBONES.keys() | _CLASSIFIERS.keys())


def _lookup(table: dict[str, Callable[..., nn.Module]], name: str, what: str) -> Callable[..., nn.Module]:
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; known names: {', '.join(sorted(table))}")
    return table[name]


def build_backbone(name: str, out_indices: Sequence[int] = (0, 1, 2, 3), **kwargs) -> nn.Module:
    """Builds the backbone ``name`` for dense prediction (``kwargs`` go to its builder).

    The module maps images ``[N, 3, H, W]`` to an ordered dict ``res{i+2} -> [N, C_i, H/s_i, W/s_i]``
    for each ``i`` in ``out_indices``; ``module.out_channels`` and ``module.strides`` list ``C_i`` and
    ``s_i`` in the same order.
    """
    if name in _CLASSIFIERS and name not in _BACKBONES:
        reason = getattr(_CLASSIFIERS[name].func, "no_dense_form", "it has no dense-prediction form")
        raise ValueError(
            f"{name} is a classifier only: {reason}; use build_classifier({name!r}) "
            "or a backbone such as vit_base or convnext_tiny"
        )
    return _lookup(_BACKBONES, name, "backbone")(out_indices=tuple(out_indices), **kwargs)


def build_classifier(name: str, num_classes: int = 1000, **kwargs) -> nn.Module:
    """Builds the image-classification form of the backbone ``name`` with ``num_classes`` outputs (``kwargs`` go to
    its builder): ``[N, 3, H, W] -> [N, num_classes]`` logits."""
    return _lookup(_CLASSIFIERS, name, "classifier")(num_classes=num_classes, **kwargs)
