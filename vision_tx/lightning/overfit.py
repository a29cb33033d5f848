"""Overfitting checks: train a small model on a few images until a validation metric reaches a target.

Shared by ``scripts/overfit_coco.py`` and ``scripts/overfit_ade20k.py``.
"""

from __future__ import annotations

import time

import lightning.pytorch as pl
from lightning.pytorch.callbacks import EarlyStopping

# A quarter-width Swin (Swin-T's block design), so that a CPU trains it in minutes.
SMALL_SWIN = {"embed_dim": 32, "depths": (2, 2, 2, 2), "num_heads": (1, 2, 4, 8), "drop_path_rate": 0.0}


def fit_until(
    module: pl.LightningModule,
    datamodule: pl.LightningDataModule,
    monitor: str,
    target: float,
    max_steps: int,
    val_every: int,
    root_dir: str,
    gradient_clip_val: float | None = None,
) -> tuple[pl.Trainer, float]:
    """Trains on the CPU, validating every ``val_every`` steps, until ``monitor`` reaches ``target``
    (or ``max_steps``); returns the trainer and the minutes it took."""
    stop = EarlyStopping(monitor, mode="max", stopping_threshold=target, patience=max_steps)
    trainer = pl.Trainer(
        max_steps=max_steps,
        val_check_interval=val_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        gradient_clip_val=gradient_clip_val,
        accelerator="cpu",
        callbacks=[stop],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root_dir,
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    return trainer, (time.perf_counter() - start) / 60
