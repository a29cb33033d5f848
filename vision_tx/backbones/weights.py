"""``load_weights``: one entry point for official and native checkpoints.

Each model class that can read foreign layouts implements
``convert_state_dict(state_dict) -> state_dict`` returning its own key names and shapes
(e.g. Swin renames Microsoft's and timm's keys and resizes the bias tables to its window).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

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

    def __str__(self) -> str:
        lines = [f"loaded {len(self.loaded_keys)} tensors from {self.source}"]
        if self.missing_keys:
            lines.append(f"missing in the checkpoint ({len(self.missing_keys)}): {', '.join(self.missing_keys)}")
        if self.unexpected_keys:
            lines.append(f"unused from the checkpoint ({len(self.unexpected_keys)}): {', '.join(self.unexpected_keys)}")
        return "\n".join(lines)


def load_weights(
    model: nn.Module,
    checkpoint: str | os.PathLike | Mapping[str, torch.Tensor],
    strict: bool = False,
) -> LoadReport:
    """Loads a checkpoint file (or a state dict) into ``model`` and reports what did not match.

    Accepts official Microsoft Swin, timm, SHI-Labs NAT and facebookresearch DETR checkpoints, and
    vision_tx's own. Tensors whose shape differs from the model's are an error (the checkpoint is
    of another model); with ``strict=True`` missing or unused keys are an error too.
    """
    if isinstance(checkpoint, Mapping):
        source, raw = "<state dict>", checkpoint
    else:
        source, raw = str(checkpoint), read_checkpoint(checkpoint)
    state = unwrap_state_dict(raw, source)
    convert = getattr(model, "convert_state_dict", None)
    if convert is not None:
        state = convert(state)

    missing, unexpected = fit_state_dict(state, model, source)
    model.load_state_dict(state, strict=False)
    unused = set(unexpected)
    report = LoadReport(source, [k for k in state if k not in unused], missing, unexpected)
    if strict and (report.missing_keys or report.unexpected_keys):
        raise CheckpointError(f"{source}: does not match the model exactly\n{report}")
    return report


def save_weights(model: nn.Module, path: str | os.PathLike, **metadata: object) -> None:
    """Writes ``{"model": state_dict, "vision_tx": metadata}`` atomically: the native checkpoint format."""
    save_atomic({"model": model.state_dict(), "vision_tx": dict(metadata)}, path)
