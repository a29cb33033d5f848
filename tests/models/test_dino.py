"""DINO against transformers' DeformableDetrForObjectDetection (two-stage, box refinement) on the same
backbone maps and weights, and the contract of its contrastive denoising."""

from __future__ import annotations

import re
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.heads.detr import HungarianMatcher
from vision_tx.heads.dino import DINOCriterion
from vision_tx.models import DINO

from tests.models.detr_helpers import padded_batch

transformers = pytest.importorskip("transformers")

NUM_CLASSES, DIM, QUERIES, LAYERS = 7, 64, 12, 2
CHANNELS = (16, 32, 64)  # the stride 8, 16, 32 maps
IMAGE_SIZE = (80, 112)

# vision_tx name -> transformers name, applied in order (self-attention q/k/v rows are split separately).
_TO_TRANSFORMERS = [
    (r"^neck\.input_proj\.", "model.input_proj."),
    (r"^neck\.level_embed$", "model.level_embed"),
    (r"^(encoder|decoder)\.", r"model.\1."),
    (r"^(enc_output|enc_output_norm|pos_trans|pos_trans_norm)\.", r"model.\1."),
    (r"\.ffn\.linear(\d)\.", r".mlp.fc\1."),
    (r"\.ffn\.norm\.", ".final_layer_norm."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.cross_attn\.", ".encoder_attn."),
    (r"(decoder\.layers\.\d+)\.norm2\.", r"\1.encoder_attn_layer_norm."),
    (r"\.norm1\.", ".self_attn_layer_norm."),
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
        elif key.startswith(("class_embed.", "bbox_embed.")):  # tied to the decoder's copies
            converted[key] = converted[f"model.decoder.{key}"] = value
        else:
            converted[key] = value
    return converted


class MapsBackbone(nn.Module):
    """Returns the given maps whatever the images: both models read the same backbone features."""

    def __init__(self, maps: list[torch.Tensor]) -> None:
        super().__init__()
        self.maps = maps
        self.out_channels = [m.shape[1] for m in maps]

    def forward(self, images: torch.Tensor) -> OrderedDict:
        return OrderedDict((f"res{i + 3}", m) for i, m in enumerate(self.maps))


def perturb_(model: nn.Module) -> None:
    """Moves every parameter off its initialisation (norm weights off 1, biases and zero-initialised
    heads off 0) by amounts that keep activations well-scaled."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            noise = torch.rand(tensor.shape, generator=generator) - 0.5
            if tensor.dim() == 1:
                tensor.add_(0.4 * noise)
            else:
                tensor.add_(noise * 1.5 / tensor[0].numel() ** 0.5)


def tiny_dino(maps: list[torch.Tensor], **overrides) -> DINO:
    kwargs = dict(
        num_queries=QUERIES, hidden_dim=DIM, num_heads=4, num_encoder_layers=LAYERS, num_decoder_layers=LAYERS,
        dim_feedforward=96, num_points=3, query_selection="two_stage", num_denoising=0,
    )
    return DINO(MapsBackbone(maps), NUM_CLASSES, **{**kwargs, **overrides})


@pytest.fixture(scope="module")
def batch():
    images, pixel_mask, targets = padded_batch(IMAGE_SIZE, (56, 72), (3, 2), NUM_CLASSES)
    generator = torch.Generator().manual_seed(3)
    maps = []
    for stride, channels in zip((8, 16, 32), CHANNELS):
        maps.append(torch.randn(2, channels, IMAGE_SIZE[0] // stride, IMAGE_SIZE[1] // stride, generator=generator))
    return images, pixel_mask, targets, maps


@pytest.fixture(scope="module")
def models(batch):
    images, pixel_mask, _, maps = batch
    torch.manual_seed(0)
    ours = tiny_dino(maps).eval()
    perturb_(ours)
    config = transformers.DeformableDetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False,
        backbone_config=transformers.ResNetConfig(out_features=["stage2", "stage3", "stage4"], hidden_sizes=[8, *CHANNELS], embedding_size=8, depths=[1, 1, 1, 1]),
        num_labels=NUM_CLASSES, d_model=DIM, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, encoder_n_points=3, decoder_n_points=3,
        num_queries=QUERIES, two_stage_num_proposals=QUERIES, two_stage=True, with_box_refine=True,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, auxiliary_loss=True, class_cost=2,
    )
    reference = transformers.DeformableDetrForObjectDetection(config).eval()
    state = to_transformers(ours.state_dict())
    backbone_keys = {k for k in reference.state_dict() if k.startswith("model.backbone.")}
    assert set(state) == set(reference.state_dict()) - backbone_keys
    reference.load_state_dict(state, strict=False)

    def backbone_maps(pixel_values, pixel_mask):
        return [(m, F.interpolate(pixel_mask[None].float(), size=m.shape[-2:])[0].bool()) for m in maps]

    reference.model.backbone.forward = backbone_maps
    return ours, reference


def test_outputs_and_loss_match_transformers(models, batch) -> None:
    ours, reference = models
    images, pixel_mask, targets, _ = batch
    with torch.no_grad():
        out = ours(images, pixel_mask)
        ref = reference(images, pixel_mask=(~pixel_mask).long(), labels=[
            {"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets
        ])
    torch.testing.assert_close(out["pred_logits"], ref.logits, rtol=0, atol=1e-4)
    torch.testing.assert_close(out["pred_boxes"], ref.pred_boxes, rtol=0, atol=1e-4)
    for layer, aux in enumerate(out["aux_outputs"]):
        torch.testing.assert_close(aux["pred_boxes"], ref.auxiliary_outputs[layer]["pred_boxes"], rtol=0, atol=1e-4)
    assert ref.logits.std() > 0.3 and ref.pred_boxes.std() > 0.05  # not near-constant outputs
    assert (out["pred_boxes"] - out["aux_outputs"][0]["pred_boxes"]).abs().mean() > 0.003  # the last layer refines

    decoder_outputs = {k: v for k, v in out.items() if k != "enc_outputs"}  # transformers leaves the encoder's loss out
    losses = ours.loss(decoder_outputs, targets)
    compared = [k for k in ref.loss_dict if k.startswith("loss_")]
    assert len(compared) == 3 * LAYERS
    for key in compared:
        torch.testing.assert_close(losses[key], ref.loss_dict[key], rtol=0, atol=1e-4, msg=key)
    torch.testing.assert_close(losses["loss"], ref.loss, rtol=0, atol=1e-4)
