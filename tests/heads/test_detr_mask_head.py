"""DETR's attention maps and mask head against transformers' DetrMHAttentionMap and DetrMaskHeadSmallConv.

The whole DETRPanoptic is compared with DetrForSegmentation in tests/models/test_detr_panoptic.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import require_reference
from tests.models.detr_helpers import heads_to_transformers
from tests.parity import perturb_
from vision_tx.heads.detr import AttentionMaps, MaskHead

modeling_detr = require_reference("transformers.models.detr.modeling_detr")


def test_attention_maps_match_transformers_and_ignore_padding() -> None:
    ours = AttentionMaps(64, 64, num_heads=8).eval()
    perturb_(ours)
    reference = modeling_detr.DetrMHAttentionMap(64, 8).eval()
    reference.load_state_dict(ours.state_dict())
    queries, memory = torch.randn(2, 5, 64), torch.randn(2, 64, 6, 7)
    padding = torch.zeros(2, 6, 7, dtype=torch.bool)
    padding[1, 4:] = True
    padding[1, :, 5:] = True

    maps = ours(queries, memory, padding)
    additive = torch.zeros(2, 1, 1, 6, 7).masked_fill(padding[:, None, None], torch.finfo(torch.float32).min)
    torch.testing.assert_close(maps, reference(queries, memory, additive), rtol=0, atol=1e-6)
    assert maps.shape == (2, 5, 8, 6, 7)
    assert (maps[1][padding[1].expand(5, 8, 6, 7)] == 0).all()
    torch.testing.assert_close(maps.sum((2, 3, 4)), torch.ones(2, 5))  # one softmax over heads and positions


def test_mask_head_matches_transformers() -> None:
    # hidden 128 + 8 heads in; widths 128/2 .. 128/16; fpn maps at stride 16, 8, 4 of a 48x64 image.
    ours = perturb_(MaskHead(136, [24, 16, 8], 128).eval()).double()
    reference = modeling_detr.DetrMaskHeadSmallConv(136, [24, 16, 8], 128).eval().double()
    state = heads_to_transformers({f"mask_head.{k}": v for k, v in ours.state_dict().items()})
    reference.load_state_dict({k.removeprefix("mask_head."): v for k, v in state.items()})
    features, maps = torch.randn(2, 128, 2, 2).double(), torch.rand(2, 3, 8, 2, 2).double()
    fpn = [torch.randn(2, 24, 3, 4).double(), torch.randn(2, 16, 6, 8).double(), torch.randn(2, 8, 12, 16).double()]

    masks = ours(features, maps, fpn)
    expected = reference(features, maps, fpn)
    assert masks.shape == (2, 3, 12, 16)
    # float64: measured ~1e-16 of the largest value.
    torch.testing.assert_close(masks, expected.view(2, 3, 12, 16), rtol=0, atol=1e-12 * expected.abs().max().item())


def test_mismatched_widths_are_named() -> None:
    head = MaskHead(136, [24, 16, 8], 128)
    with pytest.raises(
        ValueError, match=r"detr\.mask_head: 120 feature channels \+ 8 attention heads != the head's input width 136"
    ):
        head(torch.randn(1, 120, 2, 2), torch.rand(1, 3, 8, 2, 2), [])


def test_widths_groupnorm_cannot_split_are_named() -> None:
    with pytest.raises(
        ValueError, match=r"GroupNorm\(8\).*here 72\) divisible by 8 and a DETR width \(here 64\) divisible by 128"
    ):
        MaskHead(72, [24, 16, 8], 64)
