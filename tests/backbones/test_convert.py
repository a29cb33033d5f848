"""``tools/convert_weights.py``: an official checkpoint becomes a native one that loads exactly."""

from __future__ import annotations

import torch

from tests.conftest import require_reference
from tests.parity import perturb_
from vision_tx.backbones import build_classifier, load_weights
from vision_tx.models.convert import build_for_conversion, convert_checkpoint

timm = require_reference("timm")


def test_timm_checkpoint_converts_to_a_native_file(tmp_path) -> None:
    reference = perturb_(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=10).eval())
    torch.save({"model": reference.state_dict()}, tmp_path / "timm.pth")
    report = convert_checkpoint("swin_t", tmp_path / "timm.pth", tmp_path / "native.pth", num_classes=10, strict=True)
    assert not report.missing_keys and not report.unexpected_keys

    native = torch.load(tmp_path / "native.pth", weights_only=True)
    assert native["vision_tx"]["arch"] == "swin_t" and "layers.0.blocks.0.attn.qkv.weight" not in native["model"]
    model = build_classifier("swin_t", num_classes=10).eval()
    load_weights(model, tmp_path / "native.pth", strict=True)
    images = torch.randn(1, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():  # float64, as in test_swin.py: measured ~1e-15
        torch.testing.assert_close(model.double()(images), reference.double()(images), rtol=0, atol=1e-12)


def test_official_detr_panoptic_checkpoint_converts_to_a_native_file(tmp_path) -> None:
    from tests.official_layout import random_state, read_layout

    official = {
        k: v.float() if v.is_floating_point() else v
        for k, v in random_state(read_layout("detr-r50-panoptic-00ce5173")).items()
    }
    torch.save({"model": official}, tmp_path / "detr-r50-panoptic.pth")
    report = convert_checkpoint(
        "detr_panoptic_resnet50", tmp_path / "detr-r50-panoptic.pth", tmp_path / "native.pth", strict=True
    )
    assert not report.missing_keys and not report.unexpected_keys

    native = build_for_conversion("detr_panoptic_resnet50")
    assert native.detr.class_embed.out_features == 251  # the official 250 classes + no-object
    load_weights(native, tmp_path / "native.pth", strict=True)
    state = native.state_dict()
    assert torch.equal(state["mask_head.out_conv.weight"], official["mask_head.out_lay.weight"])
    assert torch.equal(
        state["detr.transformer.decoder.layers.5.cross_attn.in_proj_weight"],
        official["detr.transformer.decoder.layers.5.multihead_attn.in_proj_weight"],
    )
    assert sorted(v.sum().item() for v in state.values() if v.is_floating_point()) == sorted(
        v.sum().item() for v in official.values() if v.is_floating_point()
    )  # every tensor carried over unchanged
