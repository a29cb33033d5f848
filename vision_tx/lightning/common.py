"""Pieces every task's LightningModule shares: the optimiser and its parameter groups, the backbone, SyncBatchNorm."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from vision_tx.backbones import build_backbone, load_weights


def param_groups(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    backbone_lr: float | None = None,
    decay_norms_and_biases: bool = True,
    backbone_prefix: str = "backbone.",
) -> list[dict[str, Any]]:
    """Optimiser parameter groups of ``model``: the names starting with ``backbone_prefix`` at ``backbone_lr`` (default
    ``lr``), the rest at ``lr``, all with ``weight_decay``.

    With ``decay_norms_and_biases=False`` the parameters ``model.no_weight_decay()`` names (norms,
    biases, position/bias tables, tokens) get no weight decay (Swin/UperNet recipe); DETR decays
    everything. Frozen parameters are left out.
    """
    no_decay = set() if decay_norms_and_biases else model.no_weight_decay()
    groups: dict[tuple[float, float], list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        group_lr = backbone_lr if backbone_lr is not None and name.startswith(backbone_prefix) else lr
        decay = 0.0 if name in no_decay else weight_decay
        groups.setdefault((group_lr, decay), []).append(param)
    return [{"params": params, "lr": group_lr, "weight_decay": decay} for (group_lr, decay), params in groups.items()]


def adamw(module: pl.LightningModule, groups: list[dict[str, Any]], **kwargs: Any) -> torch.optim.AdamW:
    """AdamW over ``groups`` (:func:`param_groups`; ``kwargs`` as ``torch.optim.AdamW``'s), fused into one
    kernel where torch has one (parameters on a CPU or CUDA device): on a CPU the step of
    ``rtdetr_convnext_toy``'s 312 tensors takes 2 ms fused against 8 ms for the loop over them. Not fused
    under ``16-mixed`` or ``bf16-mixed`` precision of the trainer of ``module``, where Lightning refuses to clip the
    gradients of an optimiser that could unscale them itself: there torch picks (its multi-tensor step on a GPU,
    2.5 ms against 20 for the loop on an H200; ``fused=False`` would turn that off too)."""
    devices = {param.device.type for group in groups for param in group["params"]}
    precision = module.trainer.precision if module._trainer is not None else None
    fused = devices <= {"cpu", "cuda"} and precision not in ("16-mixed", "bf16-mixed")
    return torch.optim.AdamW(groups, fused=fused or None, **kwargs)


def is_fitting(module: pl.LightningModule) -> bool:
    """Whether ``module`` is being built for ``trainer.fit`` (the only time pretrained weights are read:
    a resumed run then restores its own weights over them, and a reloaded checkpoint needs no file)."""
    return module._trainer is not None and module.trainer.state.fn == TrainerFn.FITTING


def build_task_backbone(module: pl.LightningModule, out_indices: Sequence[int] = (0, 1, 2, 3)) -> nn.Module:
    """The backbone named by the hyperparameters of the task ``module`` (``backbone``, ``backbone_kwargs``,
    ``pretrained``), returning the stages ``out_indices`` the task's head reads unless ``backbone_kwargs`` says
    otherwise.

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
    if hp.pretrained and is_fitting(module):
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
