"""MLP-Mixer against timm: logits, the classifier-only contract, paper tables."""

from __future__ import annotations

import pytest
import torch

from tests.backbones.family_parity import max_difference, params_and_gflops, timm_and_ours, within_published
from vision_tx.backbones import build_backbone, build_classifier, list_backbones


def test_timm_weights_give_timm_logits() -> None:
    reference, ours = timm_and_ours("mixer_b16", "mixer_b16_224")
    # Measured largest difference against timm's logits (of 0.4-0.9), over two seeds: 0.9-7e-7.
    assert max_difference(reference, ours, torch.randn(1, 3, 224, 224)) < 3e-6


def test_build_backbone_says_why_there_is_no_dense_form() -> None:
    assert "mixer_b16" in list_backbones()
    with pytest.raises(ValueError, match=r"mixer_b16 is a classifier only: .*tied to one input size.*build_classifier"):
        build_backbone("mixer_b16")


def test_other_input_sizes_are_refused_with_the_remedy() -> None:
    model = build_classifier("mixer_s32", depth=1, num_classes=3).eval()
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 3)
    with pytest.raises(ValueError, match=r"224x224 images only.*img_size=256"):
        model(torch.randn(1, 3, 256, 256))
    assert build_classifier("mixer_s32", depth=1, img_size=256)(torch.randn(1, 3, 256, 256)).shape == (1, 1000)


# The Mixer paper's Table 1 gives parameters in whole millions without the classification head; GFLOPs
# (multiply-adds at 224) as tabulated for Mixer-S/16 and B/16 in later comparisons (e.g. gMLP, ResMLP).
PAPER = {
    "mixer_s32": (19, None),
    "mixer_s16": (18, 3.8),
    "mixer_b32": (60, None),
    "mixer_b16": (59, 12.6),
    "mixer_l16": (207, None),
}


@pytest.mark.parametrize("name", list(PAPER))
def test_parameters_and_flops_match_the_paper(name: str) -> None:
    params, gflops = PAPER[name]
    measured_params, measured_gflops, model = params_and_gflops(name)
    head = sum(p.numel() for p in model.head.parameters()) / 1e6
    assert within_published(measured_params - head, params, 1)
    if gflops is not None:
        assert abs(measured_gflops - gflops) <= 0.05 * gflops
