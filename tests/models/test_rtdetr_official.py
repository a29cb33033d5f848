"""lyuwenyu/RT-DETR's checkpoint layout (rtdetr_r50vd) loads into vision_tx's RT-DETR.

The key names and shapes come from ``tests/fixtures/official_keys/rtdetr_r50vd_6x_coco_head.txt``
(written from the official module definitions by ``generate.py``), never from vision_tx's own state
dict. The official backbone (PResNet-vd) has no vision_tx counterpart: a backbone without tensors
stands in, so that every official tensor of the head must land.
"""

from __future__ import annotations

import torch

from tests.models.test_rtdetr import MapsBackbone
from tests.official_layout import random_state, read_layout
from vision_tx.backbones import load_weights
from vision_tx.models import RTDETR

NUM_CLASSES = 80


def test_r50vd_head_loads_every_tensor_and_runs() -> None:
    official = random_state(read_layout("rtdetr_r50vd_6x_coco_head"))
    maps = [
        torch.randn(1, channels, 16 // 2**i, 16 // 2**i, dtype=torch.float64)
        for i, channels in enumerate((512, 1024, 2048))
    ]
    model = RTDETR.build(MapsBackbone(maps), NUM_CLASSES).double()
    report = load_weights(model, {"ema": {"module": official}})  # the released files keep the EMA weights there
    assert report.missing_keys == [] and report.unexpected_keys == []
    assert len(report.loaded_keys) == len(official)
    layers = len(model.decoder.layers)
    state = model.state_dict()
    # The proposal heads are the last heads; each decoder layer reads its own.
    torch.testing.assert_close(
        state[f"class_embed.{layers}.weight"], official["decoder.enc_score_head.weight"], rtol=0, atol=0
    )
    torch.testing.assert_close(
        state[f"bbox_embed.{layers}.layers.2.bias"], official["decoder.enc_bbox_head.layers.2.bias"], rtol=0, atol=0
    )
    torch.testing.assert_close(state["class_embed.2.bias"], official["decoder.dec_score_head.2.bias"], rtol=0, atol=0)
    # The denoising labels keep their rows (the padding row dropped); the FFN norm is norm3, not norm2.
    torch.testing.assert_close(
        state["denoising.label_embed.weight"],
        official["decoder.denoising_class_embed.weight"][:NUM_CLASSES],
        rtol=0,
        atol=0,
    )
    torch.testing.assert_close(
        state["decoder.layers.4.ffn.norm.weight"], official["decoder.decoder.layers.4.norm3.weight"], rtol=0, atol=0
    )
    torch.testing.assert_close(
        state["decoder.layers.4.norm2.weight"], official["decoder.decoder.layers.4.norm2.weight"], rtol=0, atol=0
    )
    with torch.no_grad():
        out = model.eval()(torch.zeros(1, 3, 128, 128, dtype=torch.float64))
    assert out["pred_logits"].shape == (1, 300, NUM_CLASSES) and torch.isfinite(out["pred_boxes"]).all()
