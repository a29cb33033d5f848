"""DETR against transformers' DetrForObjectDetection (same weights), and official checkpoint layouts."""

from __future__ import annotations

import re

import pytest
import torch
import torchvision

from vision_tx.backbones import load_weights
from vision_tx.backbones.resnet import ResNet, ResNetClassifier
from vision_tx.heads.detr import SetCriterion
from vision_tx.models import DETR

transformers = pytest.importorskip("transformers")
from transformers.loss.loss_for_object_detection import ForObjectDetectionLoss  # noqa: E402

NUM_CLASSES = 91

# vision_tx name -> transformers name, applied in order (transformer q/k/v rows are split separately).
_TO_TRANSFORMERS = [
    (r"^backbone\.stem\.0\.", "model.backbone.model.embedder.embedder.convolution."),
    (r"^backbone\.stem\.1\.", "model.backbone.model.embedder.embedder.normalization."),
    (r"^backbone\.stages\.(\d+)\.(\d+)\.conv(\d)\.", lambda m: f"model.backbone.model.encoder.stages.{m[1]}.layers.{m[2]}.layer.{int(m[3]) - 1}.convolution."),
    (r"^backbone\.stages\.(\d+)\.(\d+)\.bn(\d)\.", lambda m: f"model.backbone.model.encoder.stages.{m[1]}.layers.{m[2]}.layer.{int(m[3]) - 1}.normalization."),
    (r"^backbone\.stages\.(\d+)\.(\d+)\.downsample\.0\.", r"model.backbone.model.encoder.stages.\1.layers.\2.shortcut.convolution."),
    (r"^backbone\.stages\.(\d+)\.(\d+)\.downsample\.1\.", r"model.backbone.model.encoder.stages.\1.layers.\2.shortcut.normalization."),
    (r"^input_proj\.", "model.input_projection."),
    (r"^query_embed\.", "model.query_position_embeddings."),
    (r"^transformer\.(encoder|decoder)\.", r"model.\1."),
    (r"\.out_proj\.", ".o_proj."),
    (r"\.cross_attn\.", ".encoder_attn."),
    (r"\.linear(\d)\.", r".mlp.fc\1."),
    (r"(decoder\.layers\.\d+)\.norm2\.", r"\1.encoder_attn_layer_norm."),
    (r"(decoder\.layers\.\d+)\.norm3\.", r"\1.final_layer_norm."),
    (r"(encoder\.layers\.\d+)\.norm2\.", r"\1.final_layer_norm."),
    (r"\.norm1\.", ".self_attn_layer_norm."),
    (r"decoder\.norm\.", "decoder.layernorm."),
    (r"^class_embed\.", "class_labels_classifier."),
    (r"^bbox_embed\.", "bbox_predictor."),
]


def to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    converted = {}
    for key, value in state.items():
        for pattern, replacement in _TO_TRANSFORMERS:
            key = re.sub(pattern, replacement, key)
        if key.endswith(("in_proj_weight", "in_proj_bias")):
            prefix, kind = key.rsplit(".in_proj_", 1)
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3)):
                converted[f"{prefix}.{name}.{kind}"] = part
        else:
            converted[key] = value
    return converted


def randomize_(model: torch.nn.Module) -> None:
    """Moves every weight off its initial value (LayerNorm and FrozenBN included) so no mapping error hides."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not tensor.is_floating_point():
                continue
            noise = torch.rand(tensor.shape, generator=generator)
            if name.endswith("running_var"):
                tensor.copy_(0.5 + noise)
            elif tensor.dim() == 1:
                tensor.add_(0.2 * (noise - 0.5))
            else:
                tensor.add_(0.02 * (noise - 0.5))


@pytest.fixture(scope="module")
def models() -> tuple[DETR, torch.nn.Module]:
    torch.manual_seed(0)
    ours = DETR(ResNet(), NUM_CLASSES).eval()
    randomize_(ours)
    config = transformers.DetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=transformers.ResNetConfig(out_features=["stage4"]),
        num_labels=NUM_CLASSES,
        auxiliary_loss=False,
    )
    reference = transformers.DetrForObjectDetection(config).eval()
    reference.load_state_dict(to_transformers(ours.state_dict()), strict=True)
    return ours, reference


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]]:
    generator = torch.Generator().manual_seed(2)
    images = torch.randn(2, 3, 160, 224, generator=generator)
    pixel_mask = torch.zeros(2, 160, 224, dtype=torch.bool)
    pixel_mask[1, 120:, :] = True
    pixel_mask[1, :, 150:] = True
    images[pixel_mask[:, None].expand_as(images)] = 0
    targets = []
    for num in (3, 1):
        centers = 0.3 + 0.4 * torch.rand(num, 2, generator=generator)
        sizes = 0.05 + 0.3 * torch.rand(num, 2, generator=generator)
        labels = torch.randint(1, NUM_CLASSES, (num,), generator=generator)
        targets.append({"labels": labels, "boxes": torch.cat([centers, sizes], 1)})
    return images, pixel_mask, targets


def test_outputs_and_loss_match_transformers(models, batch) -> None:
    ours, reference = models
    images, pixel_mask, targets = batch
    with torch.no_grad():
        out = ours(images, pixel_mask)
        ref = reference(images, pixel_mask=(~pixel_mask).long(), labels=[
            {"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets
        ])
    torch.testing.assert_close(out["pred_logits"], ref.logits, rtol=0, atol=1e-4)
    torch.testing.assert_close(out["pred_boxes"], ref.pred_boxes, rtol=0, atol=1e-4)
    assert ref.logits.std() > 0.1  # the comparison is not between near-constant outputs

    last_layer = {"pred_logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}
    losses = SetCriterion(NUM_CLASSES)(last_layer, targets)
    for key in ("loss_ce", "loss_bbox", "loss_giou", "cardinality_error"):
        torch.testing.assert_close(losses[key], ref.loss_dict[key], rtol=0, atol=1e-4)
    torch.testing.assert_close(losses["loss"], ref.loss, rtol=0, atol=1e-4)


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
    ref_loss, ref_dict, _ = ForObjectDetectionLoss(out["pred_logits"], labels, "cpu", out["pred_boxes"], config, logits, boxes)

    losses = SetCriterion(NUM_CLASSES)(out, targets)
    compared = [k for k in ref_dict if k.startswith("loss_")]
    assert len(compared) == 3 * len(layers)
    for key in compared:
        torch.testing.assert_close(losses[key], ref_dict[key], rtol=0, atol=1e-4, msg=key)
    torch.testing.assert_close(losses["loss"], ref_loss, rtol=0, atol=1e-4)


def to_official(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """facebookresearch/detr's names: torchvision ResNet under backbone.0.body, cross-attention as multihead_attn."""
    renames = [
        (r"^backbone\.stem\.0\.", "backbone.0.body.conv1."),
        (r"^backbone\.stem\.1\.", "backbone.0.body.bn1."),
        (r"^backbone\.stages\.(\d)\.", lambda m: f"backbone.0.body.layer{int(m[1]) + 1}."),
        (r"\.cross_attn\.", ".multihead_attn."),
    ]
    converted = {}
    for key, value in state.items():
        for pattern, replacement in renames:
            key = re.sub(pattern, replacement, key)
        converted[key] = value
    return converted


def test_official_checkpoint_layout_loads_completely(models, batch, tmp_path) -> None:
    source, _ = models
    official = to_official(source.state_dict())
    assert "backbone.0.body.layer4.2.bn3.running_var" in official
    assert "transformer.decoder.layers.5.multihead_attn.in_proj_weight" in official
    assert "bbox_embed.layers.2.bias" in official
    path = tmp_path / "detr-r50-e632da11.pth"
    torch.save({"model": official}, path)

    target = DETR(ResNet(), NUM_CLASSES).eval()
    report = load_weights(target, path, strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    images, pixel_mask, _ = batch
    with torch.no_grad():
        torch.testing.assert_close(target(images, pixel_mask), source(images, pixel_mask), rtol=0, atol=0)


def test_resnet_reads_torchvision_weights() -> None:
    reference = torchvision.models.resnet50().eval()
    randomize_(reference)
    state = reference.state_dict()
    classifier = ResNetClassifier(50).eval()
    assert not load_weights(classifier, state, strict=True).missing_keys
    backbone = ResNet(50, frozen_stages=-1).eval()
    report = load_weights(backbone, state)
    assert not report.missing_keys and set(report.unexpected_keys) == {"fc.weight", "fc.bias"}

    images = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        torch.testing.assert_close(classifier(images), reference(images), rtol=1e-5, atol=1e-5)
        expected = torch.nn.Sequential(*list(reference.children())[:-2])(images)
        # FrozenBatchNorm2d folds the statistics into one scale and shift: same map, other rounding.
        torch.testing.assert_close(backbone(images)["res5"], expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


def test_folded_frozen_batchnorm_gives_torchvisions_gradients() -> None:
    backbone = ResNet(50, frozen_stages=-1)
    randomize_(backbone)
    images = torch.randn(1, 3, 64, 96)
    backbone(images)["res5"].square().mean().backward()
    folded = {name: p.grad.clone() for name, p in backbone.named_parameters()}
    backbone.zero_grad()
    torch.nn.Sequential(backbone.stem, *backbone.stages)(images).square().mean().backward()  # torchvision's forward
    for name, p in backbone.named_parameters():
        torch.testing.assert_close(folded[name], p.grad, rtol=1e-3, atol=1e-3 * p.grad.abs().max().item(), msg=name)


def test_backbone_stem_and_layer1_are_frozen_by_default() -> None:
    backbone = ResNet().train()
    frozen = [p.requires_grad for m in (backbone.stem, backbone.stages[0]) for p in m.parameters()]
    trained = [p.requires_grad for m in backbone.stages[1:] for p in m.parameters()]
    assert frozen and not any(frozen) and all(trained)
    assert all(isinstance(m, torchvision.ops.FrozenBatchNorm2d) for m in backbone.modules() if "BatchNorm" in type(m).__name__)


def test_bad_inputs_are_named() -> None:
    model = DETR(ResNet(), NUM_CLASSES, num_encoder_layers=1, num_decoder_layers=1)
    with pytest.raises(ValueError, match=r"detr.py: images must be \[B,3,H,W\]"):
        model(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match=r"detr.py: pixel_mask must be bool"):
        model(torch.randn(1, 3, 64, 64), torch.zeros(1, 64, 64))
