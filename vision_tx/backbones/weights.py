"""``load_weights``: one entry point for official and native checkpoints.

Each model class that can read foreign layouts implements
``convert_state_dict(state_dict) -> state_dict`` returning its own key names and shapes
(e.g. Swin renames Microsoft's and timm's keys and resizes the bias tables to its window).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from vision_tx.checkpoint import CheckpointError, fit_state_dict, read_checkpoint, save_atomic, unwrap_state_dict


@dataclass
class LoadReport:
    """What :func:`load_weights` did: the source and the keys it could not match."""

    source: str
    loaded_keys: list[str] = field(default_factory=list)
    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    other_classes_keys: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"loaded {len(self.loaded_keys)} tensors from {self.source}"]
        if self.other_classes_keys:
            lines.append(
                f"of another number of classes, left at the model's initialisation ({len(self.other_classes_keys)}): "
                f"{', '.join(self.other_classes_keys)}"
            )
        if self.missing_keys:
            lines.append(f"missing in the checkpoint ({len(self.missing_keys)}): {', '.join(self.missing_keys)}")
        if self.unexpected_keys:
            lines.append(f"unused from the checkpoint ({len(self.unexpected_keys)}): {', '.join(self.unexpected_keys)}")
        return "\n".join(lines)


def load_weights(
    model: nn.Module,
    checkpoint: str | os.PathLike | Mapping[str, torch.Tensor],
    strict: bool = False,
    class_keys: Sequence[str] = (),
) -> LoadReport:
    """Loads a ``checkpoint`` file (or a state dict) into ``model`` and reports what did not match.

    Accepts official Microsoft Swin, timm, SHI-Labs NAT and facebookresearch DETR checkpoints, and
    vision_tx's own. Tensors whose shape differs from the model's are an error (the checkpoint is
    of another model); with ``strict=True`` missing or unused keys are an error too.

    Fine-tuning on another number of classes: ``class_keys`` are regular expressions of the keys with
    a row per class (e.g. ``"^class_embed"``). Those whose shape differs from the model's are not
    loaded: they keep the values ``model`` was built with (its own initialisation, when it is new),
    and the report lists them on one line. They are no missing keys, even with ``strict=True``.
    """
    if isinstance(checkpoint, Mapping):
        source, raw = "<state dict>", checkpoint
    else:
        source, raw = str(checkpoint), read_checkpoint(checkpoint)
    state = unwrap_state_dict(raw, source)
    convert = getattr(model, "convert_state_dict", None)
    if convert is not None:
        state = convert(state)
    other_classes = other_class_keys(state, model, class_keys)
    state = {k: v for k, v in state.items() if k not in other_classes}

    missing, unexpected = fit_state_dict(state, model, source)
    model.load_state_dict(state, strict=False)
    unused = set(unexpected)
    missing = [k for k in missing if k not in other_classes]
    report = LoadReport(source, [k for k in state if k not in unused], missing, unexpected, other_classes)
    if strict and (report.missing_keys or report.unexpected_keys):
        raise CheckpointError(f"{source}: does not match the model exactly\n{report}")
    return report


def other_class_keys(state: Mapping[str, torch.Tensor], model: nn.Module, class_keys: Sequence[str]) -> list[str]:
    """The keys of ``state`` matching one of the ``class_keys`` patterns whose shape differs from ``model``'s."""
    own = model.state_dict()
    return [
        key
        for key, value in state.items()
        if key in own and value.shape != own[key].shape and any(re.search(pattern, key) for pattern in class_keys)
    ]


def save_weights(model: nn.Module, path: str | os.PathLike, **metadata: object) -> None:
    """Writes ``{"model": state_dict, "vision_tx": metadata}`` of ``model`` to ``path`` atomically: the native
    checkpoint format, ``metadata`` the keyword arguments."""
    save_atomic({"model": model.state_dict(), "vision_tx": dict(metadata)}, path)
