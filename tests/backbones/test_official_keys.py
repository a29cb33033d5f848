"""Every released checkpoint layout in ``tests/fixtures/official_keys`` (names and shapes written from
the official model definitions, see ``generate.py`` there) lands in its vision_tx model through
``load_weights``: no missing, unexpected or mis-shaped key. Checked on the ``meta`` device."""

from __future__ import annotations

import pytest
import torch

from tests.backbones.nat_reference import ReferenceNAT
from tests.official_layout import FIXTURES, RECOMPUTED, random_state, read_layout
from vision_tx.backbones import build_backbone, build_classifier, load_weights
from vision_tx.models.convert import build_for_conversion

# fixture -> (vision_tx architecture, form, keyword overrides)
MODELS = {
    "swin_tiny_patch4_window7_224": ("swin_t", "classifier", {}),
    "swin_small_patch4_window7_224": ("swin_s", "classifier", {}),
    "swin_base_patch4_window7_224": ("swin_b", "classifier", {}),
    "swin_base_patch4_window12_384": ("swin_b", "classifier", {"window_size": 12}),
    "swin_large_patch4_window12_384_22kto1k": ("swin_l", "classifier", {}),
    "mask_rcnn_swin_tiny_patch4_window7": ("swin_t", "backbone", {}),
    "upernet_swin_base_patch4_window7_512x512": ("swin_b", "backbone", {}),
    "nat_mini": ("nat_mini", "classifier", {}),
    "nat_tiny": ("nat_tiny", "classifier", {}),
    "nat_small": ("nat_small", "classifier", {}),
    "nat_base": ("nat_base", "classifier", {}),
    "mask_rcnn_nat_mini_3x_coco": ("nat_mini", "backbone", {}),
    "mask_rcnn_nat_tiny_3x_coco": ("nat_tiny", "backbone", {}),
    "upernet_nat_small_in1k_512x512": ("nat_small", "backbone", {}),
    "upernet_nat_base_in1k_512x512": ("nat_base", "backbone", {}),
    "detr-r50-e632da11": ("detr_resnet50", "classifier", {}),
    "detr-r50-panoptic-00ce5173": ("detr_panoptic_resnet50", "classifier", {}),
}
# DINO's layouts leave official tensors unused on purpose: their own tests say which.
TESTED_ELSEWHERE = {
    "dino_4scale_r50": "tests/models/test_dino_official.py",
    "dino_4scale_swin_l": "tests/models/test_dino_official.py",
    "rtdetr_r50vd_6x_coco_head": "tests/models/test_rtdetr_official.py",
    "dfine_hgnetv2_l_coco_head": "tests/models/test_dfine_official.py",
    **{
        f"mask2former_swin_tiny_{task}": "tests/models/test_mask2former_official.py"
        for task in ("ade20k_semantic_160k", "coco_instance_50ep", "coco_panoptic_50ep")
    },
}


def test_every_fixture_is_tested() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.txt")) == sorted([*MODELS, *TESTED_ELSEWHERE])


@pytest.mark.parametrize("name", list(MODELS))
def test_official_layout_lands_without_missing_unexpected_or_misshaped_keys(name: str) -> None:
    arch, form, overrides = MODELS[name]
    layout = read_layout(name)
    with torch.device("meta"):
        model = (
            build_for_conversion(arch)
            if arch.startswith("detr")
            else build_classifier(arch, **overrides)
            if form == "classifier"
            else build_backbone(arch, **overrides)
        )
        state = {
            key: torch.empty(shape, dtype=torch.long if key.endswith("index") else torch.float32)
            for key, shape in layout.items()
        }
    checkpoint = {"state_dict": state} if form == "backbone" else {"model": state}
    report = load_weights(model, checkpoint, strict=True)  # raises on a shape mismatch
    assert not report.missing_keys and not report.unexpected_keys
    kept = [key for key in layout if not key.endswith(RECOMPUTED)]
    assert len(report.loaded_keys) == len(kept) == len(model.state_dict())


@pytest.mark.parametrize("name", ["nat_small", "mask_rcnn_nat_tiny_3x_coco"])
def test_the_nat_reference_has_the_official_layout(name: str) -> None:
    # The reference that test_nat_official loads vision_tx from must itself be the official layout.
    embed_dim, depths, heads, mlp_ratio = {
        "nat_small": (96, (3, 4, 18, 5), (3, 6, 12, 24), 2.0),
        "mask_rcnn_nat_tiny_3x_coco": (64, (3, 4, 18, 5), (2, 4, 8, 16), 3.0),
    }[name]
    classifier = name == "nat_small"
    with torch.device("meta"):
        reference = ReferenceNAT(
            embed_dim,
            depths,
            heads,
            mlp_ratio,
            layer_scale=1e-5 if classifier else None,
            num_classes=1000 if classifier else None,
        )
    prefix = "" if classifier else "backbone."
    assert {prefix + k: tuple(v.shape) for k, v in reference.state_dict().items()} == read_layout(name)


def test_microsoft_swin_checkpoint_gives_timms_logits() -> None:
    # timm reads the same official dict through its own checkpoint filter: an independent loader.
    import timm
    from timm.models.swin_transformer import checkpoint_filter_fn

    state = random_state(read_layout("swin_tiny_patch4_window7_224"))
    reference = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).double().eval()
    reference.load_state_dict(checkpoint_filter_fn(state, reference), strict=True)
    model = build_classifier("swin_t").double().eval()
    report = load_weights(model, {"model": state}, strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    images = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        expected, actual = reference(images), model(images)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(actual, expected, rtol=0, atol=2e-14)  # measured 2.8e-15
