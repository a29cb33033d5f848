"""Peterande/D-FINE's checkpoint layout (dfine_hgnetv2_l_coco) loads into vision_tx's D-FINE.

The key names and shapes come from ``tests/fixtures/official_keys/dfine_hgnetv2_l_coco_head.txt`` (written
from the official module definitions by ``generate.py``), never from vision_tx's own state dict. The official
backbone (HGNetv2) has no vision_tx counterpart: a backbone without tensors stands in, so that every official
tensor of the head must land (but the derived ones the converter names).
"""

from __future__ import annotations

import torch

from tests.models.test_dino import MapsBackbone
from tests.official_layout import random_state, read_layout
from vision_tx.backbones import load_weights
from vision_tx.models import DFINE

NUM_CLASSES = 80
DERIVED = 4 + 6  # decoder.decoder.{up,reg_scale}, decoder.{anchors,valid_mask}, 6 layers' num_points_scale


def test_l_head_loads_every_tensor_and_runs() -> None:
    official = random_state(read_layout("dfine_hgnetv2_l_coco_head"))
    maps = [
        torch.randn(1, channels, 16 // 2**i, 16 // 2**i, dtype=torch.float64)
        for i, channels in enumerate((512, 1024, 2048))
    ]
    model = DFINE.build(MapsBackbone(maps), NUM_CLASSES).double()
    report = load_weights(model, {"model": official})
    assert report.missing_keys == [] and report.unexpected_keys == []
    assert len(report.loaded_keys) == len(official) - DERIVED
    state = model.state_dict()
    same = {  # ours: official
        "encoder.input_proj.2.1.running_var": "encoder.input_proj.2.norm.running_var",
        "encoder.fpn_blocks.1.csp_rep1.bottlenecks.2.conv1.conv.weight": (
            "encoder.fpn_blocks.1.cv2.0.bottlenecks.2.conv1.conv.weight"
        ),
        "encoder.pan_blocks.0.conv3.norm.bias": "encoder.pan_blocks.0.cv3.1.norm.bias",
        "encoder.pan_blocks.1.conv4.conv.weight": "encoder.pan_blocks.1.cv4.conv.weight",
        "encoder.downsample_convs.1.conv2.conv.weight": "encoder.downsample_convs.1.0.cv2.conv.weight",
        "decoder.layers.5.gateway.gate.weight": "decoder.decoder.layers.5.gateway.gate.weight",
        "decoder.layers.3.ffn.norm.weight": "decoder.decoder.layers.3.norm3.weight",
        "decoder.lqe_layers.4.reg_conf.layers.1.weight": "decoder.decoder.lqe_layers.4.reg_conf.layers.1.weight",
        "decoder.up": "decoder.up",
        "decoder.reg_scale": "decoder.reg_scale",
        "enc_output.weight": "decoder.enc_output.proj.weight",
        "enc_output_norm.bias": "decoder.enc_output.norm.bias",
        "class_embed.6.weight": "decoder.enc_score_head.weight",
        "bbox_embed.6.layers.2.bias": "decoder.enc_bbox_head.layers.2.bias",
        "bbox_embed.5.layers.2.weight": "decoder.dec_bbox_head.5.layers.2.weight",
        "class_embed.0.bias": "decoder.dec_score_head.0.bias",
        "decoder.pre_bbox_head.layers.2.weight": "decoder.pre_bbox_head.layers.2.weight",
    }
    for ours, theirs in same.items():
        torch.testing.assert_close(state[ours], official[theirs], rtol=0, atol=0, msg=ours)
    torch.testing.assert_close(
        state["denoising.label_embed.weight"],
        official["decoder.denoising_class_embed.weight"][:NUM_CLASSES],
        rtol=0,
        atol=0,
    )
    with torch.no_grad():
        out = model.eval()(torch.zeros(1, 3, 128, 128, dtype=torch.float64))
    assert out["pred_logits"].shape == (1, 300, NUM_CLASSES) and torch.isfinite(out["pred_boxes"]).all()
