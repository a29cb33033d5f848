"""Sine position encoding: transformers' DETR formula, and independence from the batch's padding."""

from __future__ import annotations

import torch

from tests.conftest import require_reference
from vision_tx.necks import SinePositionEncoding

detr = require_reference("transformers.models.detr.modeling_detr")


def test_matches_transformers() -> None:
    mask = torch.zeros(2, 9, 13, dtype=torch.bool)
    mask[1, 6:] = True
    mask[1, :, 10:] = True
    reference = detr.DetrSinePositionEmbedding(64, normalize=True)(
        mask.shape[:1] + (1,) + mask.shape[1:], "cpu", torch.float32, ~mask
    )
    ours = SinePositionEncoding(64)(mask)
    assert ours.shape == (2, 9, 13, 128)
    torch.testing.assert_close(ours.permute(0, 3, 1, 2), reference, rtol=0, atol=1e-5)


def test_padding_does_not_shift_positions() -> None:
    encode = SinePositionEncoding(16)
    alone = encode(torch.zeros(1, 5, 7, dtype=torch.bool))
    padded_mask = torch.zeros(1, 8, 11, dtype=torch.bool)
    padded_mask[:, 5:] = True
    padded_mask[:, :, 7:] = True
    padded = encode(padded_mask)
    torch.testing.assert_close(padded[:, :5, :7], alone)
