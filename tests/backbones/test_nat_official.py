"""Whole vision_tx NAT models, loaded through the official SHI-Labs key names, against the independent
reference of ``nat_reference`` (classifier and detection backbone, at 224x224 and at 96x128, where the
last stages are smaller than the neighborhood and are padded inside the attention)."""

from __future__ import annotations

import pytest
import torch

from tests.backbones.nat_reference import ReferenceNAT, axis_neighbours, neighborhood_attention
from tests.parity import perturb_
from vision_tx.backbones import load_weights
from vision_tx.backbones.nat import NAT, NATClassifier

# Small widths, the official head size (32 channels per head at the official widths, 16 here) and
# every feature of the official models: layer scale (nat_small/base), dilations (DiNAT).
CLASSIFIER = dict(embed_dim=32, depths=(1, 1, 2, 1), num_heads=(2, 4, 8, 16), mlp_ratio=3.0, layer_scale=1e-5)
DETECTION = dict(
    embed_dim=32,
    depths=(2, 2, 2, 2),
    num_heads=(2, 4, 8, 16),
    mlp_ratio=2.0,
    dilations=((1, 8), (1, 4), (1, 2), (1, 1)),
)
SIZES = [(224, 224), (96, 128)]  # at 96x128 the last two stages (6x8, 3x4) are smaller than 7x7
# float64 on both sides, weights from tests.parity.perturb_; measured agreement 4.4e-16 (logits) and
# 7.5e-15 (features, largest ~6).
TOLERANCE = 2e-14


def _reference(seed: int, **config) -> ReferenceNAT:
    model = ReferenceNAT(**config).double().eval()
    return perturb_(model, seed)


def _images(size: tuple[int, int]) -> torch.Tensor:
    return torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


@pytest.mark.parametrize("size", SIZES)
def test_classifier_loaded_from_official_keys_equals_the_reference(size: tuple[int, int]) -> None:
    reference = _reference(0, num_classes=10, **CLASSIFIER)
    model = NATClassifier(num_classes=10, drop_path_rate=0.0, **CLASSIFIER).double().eval()
    report = load_weights(model, reference.state_dict(), strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    images = _images(size)
    with torch.no_grad():
        expected, actual = reference(images), model(images)
    assert expected.abs().max() > 0.1  # logits well away from zero, so the tolerance is meaningful
    torch.testing.assert_close(actual, expected, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("size", SIZES)
def test_detection_backbone_loaded_from_official_keys_equals_the_reference(size: tuple[int, int]) -> None:
    reference = _reference(1, **DETECTION)
    # An mmdetection/mmsegmentation checkpoint: the backbone under ``backbone.``, beside the other modules.
    checkpoint = {"state_dict": {f"backbone.{k}": v for k, v in reference.state_dict().items()}, "meta": {"epoch": 36}}
    checkpoint["state_dict"]["neck.lateral_convs.0.conv.weight"] = torch.zeros(256, 64, 1, 1)
    model = NAT(drop_path_rate=0.0, **DETECTION).double().eval()
    report = load_weights(model, checkpoint, strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    images = _images(size)
    with torch.no_grad():
        expected, actual = reference(images), list(model(images).values())
    assert len(actual) == len(expected) == 4
    for got, want in zip(actual, expected):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=0, atol=TOLERANCE)


def test_neighbourhoods_are_clamped_inside_the_dilation_group() -> None:
    # By hand from NATTEN's window and bias-start rules, 1-D, kernel 3.
    keys, bias_rows = axis_neighbours(5, 3, 1)
    assert keys.tolist() == [[0, 1, 2], [0, 1, 2], [1, 2, 3], [2, 3, 4], [2, 3, 4]]
    assert bias_rows.tolist() == [[2, 3, 4], [1, 2, 3], [1, 2, 3], [1, 2, 3], [0, 1, 2]]
    keys, bias_rows = axis_neighbours(7, 3, 2)  # groups {0, 2, 4, 6} and {1, 3, 5}
    assert keys.tolist() == [[0, 2, 4], [1, 3, 5], [0, 2, 4], [1, 3, 5], [2, 4, 6], [1, 3, 5], [2, 4, 6]]
    assert bias_rows.tolist() == [[2, 3, 4], [2, 3, 4], [1, 2, 3], [1, 2, 3], [1, 2, 3], [0, 1, 2], [0, 1, 2]]


def test_reference_attention_without_bias_equals_dense_attention_when_the_window_is_the_map() -> None:
    # kernel == map size: every query sees the whole map, so the attention is plain softmax attention.
    q, k, v = (torch.randn(1, 2, 5, 5, 4, dtype=torch.float64) for _ in range(3))
    out = neighborhood_attention(q, k, v, torch.zeros(2, 9, 9, dtype=torch.float64), kernel_size=5, dilation=1)
    dense = torch.softmax(q.flatten(2, 3) @ k.flatten(2, 3).transpose(-1, -2), -1) @ v.flatten(2, 3)
    torch.testing.assert_close(out, dense.view_as(out), rtol=0, atol=1e-14)
