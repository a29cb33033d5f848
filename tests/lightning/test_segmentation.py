"""SegmentationModule: a short fit on the toy set with a tiny backbone, the schedule and the parameter groups."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from tests.models.test_segmentor import TinyBackbone
from vision_tx.data.segmentation import SegmentationDataModule
from vision_tx.data.toy_segmentation import TOY_CLASSES
from vision_tx.lightning import common
from vision_tx.lightning.segmentation import SegmentationModule, warmup_poly_factor


@pytest.fixture
def tiny_backbone(monkeypatch):
    """``build_backbone`` returns the tiny test backbone, whatever the name, so the fit takes seconds."""
    monkeypatch.setattr(common, "build_backbone", lambda name, **kwargs: TinyBackbone(**kwargs))


def test_warmup_then_poly_as_mmcv() -> None:
    factors = [
        warmup_poly_factor(s, total_steps=100, warmup_steps=10, warmup_ratio=1e-6, power=1.0)
        for s in (0, 5, 10, 50, 100)
    ]
    assert factors[0] == pytest.approx(1e-6)
    assert factors[1] == pytest.approx((1 - 0.5 * (1 - 1e-6)) * 0.95)  # the ramp times the decayed rate
    assert factors[2:] == pytest.approx([0.9, 0.5, 0.0])


def test_fit_and_validate_on_toy_set(tiny_backbone, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(Path, "home", lambda: tmp_path)  # the toy set is generated under tmp_path
    datamodule = SegmentationDataModule(
        scale=(256, 128), crop_size=(96, 96), batch_size=2, val_batch_size=2, num_workers=0
    )
    module = SegmentationModule(
        backbone="tiny", head_kwargs={"channels": 16, "aux_channels": 8}, lr=1e-3, warmup_iters=2
    )
    trainer = pl.Trainer(
        max_steps=4,
        limit_val_batches=2,
        val_check_interval=4,
        num_sanity_val_steps=1,
        accelerator="cpu",
        devices=1,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=datamodule)
    assert module.hparams.num_classes == len(TOY_CLASSES)  # taken from the datamodule
    assert trainer.callback_metrics["train/loss"].isfinite()
    metrics = json.loads((Path(trainer.log_dir) / "metrics.json").read_text())["segm_sem"]
    assert set(metrics) == {"mIoU", "mAcc", "aAcc", "per_category"}
    assert [row["name"] for row in metrics["per_category"]] == list(TOY_CLASSES)
    assert 0 <= metrics["aAcc"] <= 1 and trainer.callback_metrics["val/mIoU"] == pytest.approx(metrics["mIoU"])

    # The checkpoint rebuilds the same model with no datamodule: num_classes was recorded.
    checkpoint = tmp_path / "last.ckpt"
    trainer.save_checkpoint(checkpoint)
    restored = SegmentationModule.load_from_checkpoint(checkpoint)
    restored.configure_model()
    restored.load_state_dict(torch.load(checkpoint, weights_only=False)["state_dict"])
    restored.eval()
    module.eval()
    images = torch.randn(1, 3, 64, 64)
    torch.testing.assert_close(restored(images), module(images))


def test_no_weight_decay_on_norms_and_biases(tiny_backbone) -> None:
    module = SegmentationModule(backbone="tiny", num_classes=3, head_kwargs={"channels": 8, "aux_channels": 8})
    module.configure_model()
    module.trainer = pl.Trainer(max_steps=10, accelerator="cpu", logger=False)
    optimizer = module.configure_optimizers()["optimizer"]
    decay_of = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    named = dict(module.model.named_parameters())
    assert decay_of[id(named["decode_head.fpn_bottleneck.bn.weight"])] == 0
    assert decay_of[id(named["decode_head.classifier.bias"])] == 0
    assert decay_of[id(named["decode_head.fpn_bottleneck.conv.weight"])] == 0.01
    assert len(decay_of) == len(named)
