"""Mask2Former on one batch whose second image is padded by different amounts in height (16 rows) and width
(32 columns): the unpadded sizes it records from the pixel mask, and the set loss and its gradients against
transformers' ``Mask2FormerLoss`` given the same targets zero-padded by hand at the bottom and right (the
pipeline gives each image's masks at its unpadded size; transformers' matcher reads them at the size it is
given, so the reference gets them padded)."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_mask2former import IMAGE_SIZE, NUM_CLASSES, _their_loss, blob_masks, ours_and_transformers
from vision_tx.heads.mask2former import Mask2FormerCriterion

VALID = (48, 64)  # the second image inside IMAGE_SIZE (64, 96)


def padded_inputs() -> tuple[list[torch.Tensor], torch.Tensor, list[dict[str, torch.Tensor]]]:
    """Backbone maps of the padded batch, its pixel mask (True on padding) and the targets at each image's own size."""
    generator = torch.Generator().manual_seed(5)
    maps = [
        torch.randn(2, c, IMAGE_SIZE[0] // s, IMAGE_SIZE[1] // s, generator=generator, dtype=torch.float64)
        for c, s in zip((16, 32, 64, 128), (4, 8, 16, 32))
    ]
    pixel_mask = torch.ones(2, *IMAGE_SIZE, dtype=torch.bool)
    pixel_mask[0] = False
    pixel_mask[1, : VALID[0], : VALID[1]] = False
    second = torch.zeros(3, *VALID, dtype=torch.bool)
    second[0, 4:30, 8:60] = True
    second[1, 20:48, 0:24] = True
    second[2, 30:44, 40:64] = True  # touches the padding's corner
    targets = [
        {"labels": torch.tensor([1, 3, 0]), "masks": blob_masks(3, generator)},
        {"labels": torch.tensor([4, 2, 4]), "masks": second},
    ]
    return maps, pixel_mask, targets


def padded_by_hand(targets: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Each target's masks written into the top-left corner of zeros of the padded size."""
    padded = []
    for target in targets:
        masks = torch.zeros(len(target["masks"]), *IMAGE_SIZE, dtype=torch.bool)
        masks[:, : target["masks"].shape[1], : target["masks"].shape[2]] = target["masks"]
        padded.append({**target, "masks": masks})
    return padded


@pytest.fixture
def float64_default():
    """float64 as the default dtype for the test (transformers draws its points in it)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(default)


def test_padded_batch_sizes_loss_and_gradients_match_transformers(float64_default) -> None:
    maps, pixel_mask, targets = padded_inputs()
    leaves = [m.requires_grad_() for m in maps]
    ours, reference = ours_and_transformers(leaves)
    ours.criterion = Mask2FormerCriterion(NUM_CLASSES, num_points=300)
    images = torch.zeros(2, 3, *IMAGE_SIZE)
    torch.manual_seed(11)
    outputs = ours(images, pixel_mask)
    losses = ours.loss(outputs, targets)
    ours_grads = torch.autograd.grad(losses["loss"], leaves)
    torch.manual_seed(11)
    expected = _their_loss(reference, images, padded_by_hand(targets))
    their_grads = torch.autograd.grad(expected.loss, leaves)
    assert outputs["sizes"].tolist() == [list(IMAGE_SIZE), list(VALID)]
    # Measured: the loss equal (58.46), the maps' gradients within 4e-17 (largest 0.039).
    torch.testing.assert_close(losses["loss"], expected.loss, rtol=1e-13, atol=0)
    for ours_grad, their_grad in zip(ours_grads, their_grads):
        torch.testing.assert_close(ours_grad, their_grad, rtol=0, atol=1e-14)
