"""facebookresearch/Mask2Former's Swin-T checkpoint layouts (ADE20K semantic, COCO panoptic and instance) load
into vision_tx's Mask2Former with nothing missing or unused.

The key names and shapes come from ``tests/fixtures/official_keys/mask2former_*.txt``, written by
``generate.py`` there from the official model definitions, never from vision_tx's own state dict.
"""

from __future__ import annotations

import pytest
import torch

from tests.official_layout import random_state, read_layout
from vision_tx.backbones import build_backbone, load_weights
from vision_tx.models.mask2former import Mask2Former

LAYOUTS = {
    "mask2former_swin_tiny_ade20k_semantic_160k": 150,
    "mask2former_swin_tiny_coco_panoptic_50ep": 133,
    "mask2former_swin_tiny_coco_instance_50ep": 80,
}


def build(num_classes: int, device: str = "cpu") -> Mask2Former:
    with torch.device(device):
        return Mask2Former(build_backbone("swin_t", out_indices=(0, 1, 2, 3)), num_classes)


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_official_layout_loads_every_tensor(name: str) -> None:
    official = random_state(read_layout(name))
    report = load_weights(build(LAYOUTS[name], device="meta"), official)
    assert report.missing_keys == [] and report.unexpected_keys == []


def test_renames_land_where_they_mean() -> None:
    official = random_state(read_layout("mask2former_swin_tiny_ade20k_semantic_160k"))
    model = build(150)
    report = load_weights(model, official)
    assert report.missing_keys == [] and report.unexpected_keys == []
    state = model.state_dict()
    pixel, predictor = "sem_seg_head.pixel_decoder.", "sem_seg_head.predictor."
    pairs = {
        "pixel_decoder.projection.input_proj.0.0.weight": pixel + "input_proj.0.0.weight",  # res5 first
        "pixel_decoder.projection.level_embed": pixel + "transformer.level_embed",
        "pixel_decoder.encoder.layers.5.ffn.norm.bias": pixel + "transformer.encoder.layers.5.norm2.bias",
        "pixel_decoder.encoder.layers.2.norm1.weight": pixel + "transformer.encoder.layers.2.norm1.weight",
        "pixel_decoder.lateral_convs.0.0.weight": pixel + "adapter_1.weight",
        "pixel_decoder.lateral_convs.0.1.bias": pixel + "adapter_1.norm.bias",
        "pixel_decoder.output_convs.0.1.weight": pixel + "layer_1.norm.weight",
        "predictor.layers.4.norm1.weight": predictor + "transformer_cross_attention_layers.4.norm.weight",
        "predictor.layers.4.norm2.weight": predictor + "transformer_self_attention_layers.4.norm.weight",
        "predictor.layers.8.cross_attn.in_proj_weight": predictor
        + "transformer_cross_attention_layers.8.multihead_attn.in_proj_weight",
        "predictor.layers.8.ffn.linear2.weight": predictor + "transformer_ffn_layers.8.linear2.weight",
        "predictor.mask_embed.layers.2.bias": predictor + "mask_embed.layers.2.bias",
        "backbone.stages.3.out_norm.weight": "backbone.norm3.weight",
    }
    for ours, theirs in pairs.items():
        torch.testing.assert_close(state[ours], official[theirs].to(state[ours].dtype), msg=ours)
    with torch.no_grad():
        outputs = model.eval()(torch.randn(1, 3, 64, 96))
    assert outputs["pred_logits"].shape == (1, 100, 151) and outputs["pred_masks"].shape == (1, 100, 16, 24)
    assert torch.isfinite(outputs["pred_masks"]).all()
