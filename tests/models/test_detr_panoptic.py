"""DETRPanoptic loaded from the official checkpoint layout against transformers' DetrForSegmentation loaded
from the same tensors; a detection checkpoint for the detector alone; freezing of the detector."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import require_reference
from tests.models.detr_helpers import official_to_transformers, padded_batch, transformers_config
from tests.official_layout import random_state, read_layout
from vision_tx.backbones import load_weights
from vision_tx.backbones.resnet import ResNet
from vision_tx.heads.detr import SetCriterion
from vision_tx.models import DETR, DETRPanoptic
from vision_tx.models.convert import build_for_conversion

transformers = require_reference("transformers")

NUM_CLASSES = 20
OFFICIAL_CLASSES = 250
# A small DETR (the mask head's narrowest layer, hidden_dim / 16, needs 8 channels for GroupNorm(8)).
SIZES = {"hidden_dim": 128, "num_queries": 8, "num_encoder_layers": 2, "num_decoder_layers": 2, "dim_feedforward": 256}


def build(freeze_detr: bool = False, **backbone_kwargs) -> DETRPanoptic:
    return DETRPanoptic(DETR(ResNet(**backbone_kwargs), NUM_CLASSES, **SIZES), freeze_detr=freeze_detr)


@pytest.fixture(scope="module")
def official() -> dict[str, torch.Tensor]:
    """A random fill of the official ``detr-r50-panoptic-00ce5173.pth`` layout."""
    return {k: v.float() for k, v in random_state(read_layout("detr-r50-panoptic-00ce5173")).items()}


@pytest.fixture(scope="module")
def models(official) -> tuple[DETRPanoptic, torch.nn.Module]:
    """vision_tx's DETRPanoptic and transformers' DetrForSegmentation, each loaded by its own path from
    the official tensors."""
    ours = build_for_conversion("detr_panoptic_resnet50").eval()
    report = load_weights(ours, {"model": official}, strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    config = transformers_config(OFFICIAL_CLASSES, ["stage1", "stage2", "stage3", "stage4"])
    reference = transformers.DetrForSegmentation(config).eval()
    reference.load_state_dict(official_to_transformers(official), strict=True)
    return ours, reference


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]]:
    return padded_batch((96, 128), (72, 100), (3, 2), NUM_CLASSES, with_masks=True)


def test_outputs_and_mask_losses_match_transformers(models, batch) -> None:
    ours, reference = models
    images, pixel_mask, targets = batch
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"], "masks": t["masks"].float()} for t in targets]
    with torch.no_grad():
        out = ours(images, pixel_mask)
        ref = reference(images, pixel_mask=(~pixel_mask).long(), labels=labels)
    assert out["pred_masks"].shape == (2, 100, 24, 32)
    # Measured (float32): logits 2.4e-6 apart (largest 3.7), boxes 2.1e-7, masks 5.9e-6 of their largest
    # value, losses 9.5e-7.
    torch.testing.assert_close(out["pred_logits"], ref.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(out["pred_boxes"], ref.pred_boxes, rtol=0, atol=1e-6)
    scale = ref.pred_masks.abs().max().item()
    torch.testing.assert_close(out["pred_masks"], ref.pred_masks, rtol=0, atol=2e-5 * scale)
    assert ref.pred_masks.std() > 0.05 * scale  # the masks are not near-constant

    last_layer = {k: v for k, v in out.items() if k != "aux_outputs"}  # the reference has no auxiliary loss
    losses = SetCriterion(OFFICIAL_CLASSES)(last_layer, targets)
    for key in ("loss_ce", "loss_bbox", "loss_giou", "loss_mask", "loss_dice"):
        torch.testing.assert_close(losses[key], ref.loss_dict[key], rtol=0, atol=5e-6, msg=key)
    torch.testing.assert_close(losses["loss"], ref.loss, rtol=0, atol=5e-6)


def test_detection_checkpoint_initialises_the_detector(official, models) -> None:
    detection = {k.removeprefix("detr."): v for k, v in official.items() if k.startswith("detr.")}
    target = build_for_conversion("detr_panoptic_resnet50")
    report = load_weights(target, {"model": detection})
    heads = {k for k in target.state_dict() if not k.startswith("detr.")}
    assert set(report.missing_keys) == heads and not report.unexpected_keys
    for key, value in models[0].detr.state_dict().items():
        torch.testing.assert_close(target.detr.state_dict()[key], value, rtol=0, atol=0)


def test_frozen_detector_trains_only_the_mask_head() -> None:
    model = build(freeze_detr=True).train()
    assert not any(p.requires_grad for p in model.detr.parameters())
    images = torch.randn(1, 3, 64, 96)
    out = model(images)
    assert not out["pred_logits"].requires_grad  # the frozen detector builds no graph
    out["pred_masks"].square().mean().backward()
    heads = [model.bbox_attention, model.mask_head]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for head in heads for p in head.parameters())


def test_backbone_without_all_strides_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"models\.detr_panoptic: the mask head needs the backbone's maps at strides \[4, 8, 16, 32\]"
    ):
        build(out_indices=(1, 2, 3))
