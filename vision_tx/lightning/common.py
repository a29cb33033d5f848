"""Pieces every task's LightningModule shares: optimiser parameter groups and result files."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

import lightning.pytorch as pl
import torch.distributed as dist
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from vision_tx.backbones import build_backbone, load_weights

# Parameters that should not be decayed: normalisation layers, biases, position and bias tables, ViT/DeiT tokens.
NO_DECAY_NAME_PARTS = ("relative_position_bias_table", "rpb", "pos_embed", "absolute_pos_embed", "cls_token", "dist_token")


def _is_no_decay(name: str, param: nn.Parameter, norm_param_names: set[str]) -> bool:
    return param.ndim <= 1 or name in norm_param_names or any(part in name for part in NO_DECAY_NAME_PARTS)


def param_groups(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    backbone_lr: float | None = None,
    decay_norms_and_biases: bool = True,
    backbone_prefix: str = "backbone.",
) -> list[dict[str, Any]]:
    """Optimiser parameter groups: ``{backbone_prefix}*`` at ``backbone_lr`` (default ``lr``), the rest at ``lr``.

    With ``decay_norms_and_biases=False`` norms, biases and position/bias tables get no weight
    decay (Swin/UperNet recipe); DETR decays everything. Frozen parameters are left out.
    """
    norm_param_names = {
        f"{module_name}.{param_name}" if module_name else param_name
        for module_name, module in model.named_modules()
        if isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm))
        for param_name, _ in module.named_parameters(recurse=False)
    }
    groups: dict[tuple[float, float], list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        group_lr = backbone_lr if backbone_lr is not None and name.startswith(backbone_prefix) else lr
        decay = weight_decay
        if not decay_norms_and_biases and _is_no_decay(name, param, norm_param_names):
            decay = 0.0
        groups.setdefault((group_lr, decay), []).append(param)
    return [{"params": params, "lr": group_lr, "weight_decay": decay} for (group_lr, decay), params in groups.items()]


def is_fitting(module: pl.LightningModule) -> bool:
    """Whether ``module`` is being built for ``trainer.fit`` (the only time pretrained weights are read:
    a resumed run then restores its own weights over them, and a reloaded checkpoint needs no file)."""
    return module._trainer is not None and module.trainer.state.fn == TrainerFn.FITTING


def build_task_backbone(
    module: pl.LightningModule, out_indices: Sequence[int] = (0, 1, 2, 3), load_pretrained: bool = True
) -> nn.Module:
    """The backbone named by ``module.hparams`` (``backbone``, ``backbone_kwargs``, ``pretrained``),
    returning the stages ``out_indices`` the task's head reads unless ``backbone_kwargs`` says otherwise.
    ``load_pretrained=False`` leaves ``pretrained`` to the caller (a task that reads it into the whole model).

    Also resolves ``hparams.num_classes`` when it is None, from the trainer's datamodule, so that a
    checkpoint records it and rebuilds the same model.
    """
    hp = module.hparams
    if hp.num_classes is None:
        datamodule = module.trainer.datamodule if module._trainer is not None else None
        if datamodule is None:
            raise ValueError(f"{type(module).__name__}: num_classes is None and there is no datamodule to take it from")
        hp.num_classes = datamodule.num_classes
    backbone = build_backbone(hp.backbone, **{"out_indices": tuple(out_indices), **(hp.backbone_kwargs or {})})
    if load_pretrained and hp.pretrained and is_fitting(module):
        rank_zero_info(f"backbone weights: {load_weights(backbone, hp.pretrained)}")
    return backbone


def sync_batchnorm_where_supported(module: pl.LightningModule, model: nn.Module) -> nn.Module:
    """``model`` with its BatchNorm layers turned into ``SyncBatchNorm`` when ``module``'s trainer runs
    several processes on GPUs (or other accelerators); unchanged on one process or on CPUs, where torch's
    DDP refuses ``SyncBatchNorm``. Called from ``configure_model``, before the strategy wraps the model."""
    trainer = module._trainer
    if trainer is None or trainer.world_size == 1 or trainer.strategy.root_device.type == "cpu":
        return model
    rank_zero_info("BatchNorm layers synchronised over the processes (SyncBatchNorm)")
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def gather_by_image_id(records: dict[int, Any]) -> dict[int, Any]:
    """Every process's ``{image_id: record}`` merged, on every rank (a collective call under DDP).

    The first record of an id wins: the distributed sampler repeats samples to even out the shards.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return records
    shards: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(shards, records)
    merged: dict[int, Any] = {}
    for shard in shards:
        for image_id, record in shard.items():
            merged.setdefault(image_id, record)
    return merged


def write_json_atomic(data: Any, path: str | os.PathLike) -> Path:
    """Writes ``data`` as indented JSON to a temporary file beside ``path``, then renames it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)
    return path


def merge_metrics_json(section: str, values: dict[str, Any], path: str | os.PathLike) -> Path:
    """Adds or replaces ``{section: values}`` in ``metrics.json`` (other sections are kept)."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[section] = values
    return write_json_atomic(data, path)

