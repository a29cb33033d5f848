"""DETR loaded from the official checkpoint layout against transformers' DetrForObjectDetection loaded from
the same tensors; the ResNet-50 backbone against torchvision."""

from __future__ import annotations

import pytest
import torch
import torchvision

from tests.conftest import require_reference
from tests.models.detr_helpers import official_to_transformers, padded_batch, transformers_config
from tests.official_layout import random_state, read_layout
from tests.parity import perturb_
from vision_tx.backbones import load_weights
from vision_tx.backbones.resnet import ResNet, ResNetClassifier
from vision_tx.heads.detr import SetCriterion
from vision_tx.models import DETR
from vision_tx.models.convert import build_for_conversion

transformers = require_reference("transformers")
from transformers.loss.loss_for_object_detection import ForObjectDetectionLoss  # noqa: E402

NUM_CLASSES = 91


@pytest.fixture(scope="module")
def models() -> tuple[DETR, torch.nn.Module]:
    """vision_tx's DETR and transformers' DetrForObjectDetection, each loaded by its own path from one
    random fill of the official ``detr-r50-e632da11.pth`` layout."""
    official = {k: v.float() for k, v in random_state(read_layout("detr-r50-e632da11")).items()}
    ours = build_for_conversion("detr_resnet50").eval()
    report = load_weights(ours, {"model": official}, strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    reference = transformers.DetrForObjectDetection(transformers_config(NUM_CLASSES, ["stage4"])).eval()
    reference.load_state_dict(official_to_transformers(official), strict=True)
    return ours, reference


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]]:
    return padded_batch((160, 224), (120, 150), (3, 1), NUM_CLASSES)


def test_outputs_and_loss_match_transformers(models, batch) -> None:
    ours, reference = models
    images, pixel_mask, targets = batch
    with torch.no_grad():
        out = ours(images, pixel_mask)
        ref = reference(
            images,
            pixel_mask=(~pixel_mask).long(),
            labels=[{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets],
        )
    # Measured: logits 2.3e-6 apart (largest 2.8), boxes 2.4e-7 (float32; transformers' loss does not
    # run in float64).
    torch.testing.assert_close(out["pred_logits"], ref.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(out["pred_boxes"], ref.pred_boxes, rtol=0, atol=1e-6)
    assert ref.logits.std() > 0.1  # the comparison is not between near-constant outputs

    last_layer = {"pred_logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}
    losses = SetCriterion(NUM_CLASSES)(last_layer, targets)
    for key in ("loss_ce", "loss_bbox", "loss_giou", "cardinality_error"):
        torch.testing.assert_close(losses[key], ref.loss_dict[key], rtol=0, atol=1e-5)
    torch.testing.assert_close(losses["loss"], ref.loss, rtol=0, atol=1e-5)


def test_auxiliary_losses_match_transformers(models, batch) -> None:
    ours, reference = models
    images, pixel_mask, targets = batch
    with torch.no_grad():
        out = ours(images, pixel_mask)
    layers = [*out["aux_outputs"], out]
    logits = torch.stack([layer["pred_logits"] for layer in layers])
    boxes = torch.stack([layer["pred_boxes"] for layer in layers])
    config = reference.config.__class__(**{**reference.config.to_dict(), "auxiliary_loss": True})
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    ref_loss, ref_dict, _ = ForObjectDetectionLoss(
        out["pred_logits"], labels, "cpu", out["pred_boxes"], config, logits, boxes
    )

    losses = SetCriterion(NUM_CLASSES)(out, targets)
    compared = [k for k in ref_dict if k.startswith("loss_")]
    assert len(compared) == 3 * len(layers)
    for key in compared:
        torch.testing.assert_close(losses[key], ref_dict[key], rtol=0, atol=1e-5, msg=key)
    # The weighted sum of the 18 terms is about 73, where float32 steps by 7.6e-6: relative (measured 2.1e-7
    # with two threads, where the sums of the terms' own reductions fall in another order).
    torch.testing.assert_close(losses["loss"], ref_loss, rtol=1e-6, atol=0)


def test_resnet_reads_torchvision_weights() -> None:
    reference = torchvision.models.resnet50().eval()
    perturb_(reference)
    state = reference.state_dict()
    classifier = ResNetClassifier(50).eval()
    assert not load_weights(classifier, state, strict=True).missing_keys
    backbone = ResNet(50, frozen_stages=-1).eval()
    report = load_weights(backbone, state)
    assert not report.missing_keys and set(report.unexpected_keys) == {"fc.weight", "fc.bias"}

    images = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        logits = reference(images)
        # Channels-last convolutions round differently: torchvision's own model moves by ~1e-6 of the
        # logits' range between memory formats.
        torch.testing.assert_close(classifier(images), logits, rtol=0, atol=5e-6 * logits.abs().max().item())
        expected = torch.nn.Sequential(*list(reference.children())[:-2])(images)
        # FrozenBatchNorm2d folds the statistics into one scale and shift: same map, other rounding
        # (measured 1.1e-6 of the largest value, 6e-7 for the logits).
        torch.testing.assert_close(backbone(images)["res5"], expected, rtol=0, atol=5e-6 * expected.abs().max().item())


def test_folded_frozen_batchnorm_gives_torchvisions_gradients() -> None:
    # float64: in float32 the 50 layers' rounding moves the largest gradients by ~0.4%, by CPU and
    # torch version; in float64 the two orders of operations agree to ~1e-13 of the largest gradient.
    backbone = perturb_(ResNet(50, frozen_stages=-1)).double()
    images = torch.randn(1, 3, 64, 96, dtype=torch.float64)
    backbone(images)["res5"].square().mean().backward()
    folded = {name: p.grad.clone() for name, p in backbone.named_parameters()}
    backbone.zero_grad()
    torch.nn.Sequential(backbone.stem, *backbone.stages)(images).square().mean().backward()  # torchvision's forward
    for name, p in backbone.named_parameters():
        torch.testing.assert_close(folded[name], p.grad, rtol=0, atol=1e-10 * p.grad.abs().max().item(), msg=name)


def test_backbone_stem_and_layer1_are_frozen_by_default() -> None:
    backbone = ResNet().train()
    frozen = [p.requires_grad for m in (backbone.stem, backbone.stages[0]) for p in m.parameters()]
    trained = [p.requires_grad for m in backbone.stages[1:] for p in m.parameters()]
    assert frozen and not any(frozen) and all(trained)
    assert all(
        isinstance(m, torchvision.ops.FrozenBatchNorm2d) for m in backbone.modules() if "BatchNorm" in type(m).__name__
    )


def test_bad_inputs_are_named() -> None:
    model = DETR(ResNet(), NUM_CLASSES, num_encoder_layers=1, num_decoder_layers=1)
    with pytest.raises(ValueError, match=r"models\.detr: images must be \[B,3,H,W\]"):
        model(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match=r"models\.detr: pixel_mask must be bool"):
        model(torch.randn(1, 3, 64, 64), torch.zeros(1, 64, 64))
