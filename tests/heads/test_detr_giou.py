"""The mask-free generalized IoU loss against torchvision's, values and gradients, overlapping or not."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torchvision.ops import generalized_box_iou_loss

from vision_tx.heads.detr.giou import paired_giou_loss


def box_pairs() -> tuple[torch.Tensor, torch.Tensor]:
    """Random pairs, then by hand: identical, contained, overlapping in x only, touching edges, disjoint."""
    generator = torch.Generator().manual_seed(0)
    corner = torch.rand(64, 2, 2, generator=generator)
    size = 0.05 + 0.4 * torch.rand(64, 2, 2, generator=generator)
    boxes, other = torch.cat([corner, corner + size], -1).unbind(1)
    by_hand = torch.tensor(
        [
            [[0.1, 0.1, 0.5, 0.5], [0.1, 0.1, 0.5, 0.5]],
            [[0.1, 0.1, 0.9, 0.9], [0.3, 0.4, 0.5, 0.6]],
            [[0.1, 0.1, 0.5, 0.3], [0.2, 0.5, 0.7, 0.9]],
            [[0.1, 0.1, 0.5, 0.5], [0.5, 0.1, 0.9, 0.5]],
            [[0.0, 0.0, 0.2, 0.2], [0.6, 0.7, 0.9, 0.8]],
        ]
    )
    return torch.cat([boxes, by_hand[:, 0]]), torch.cat([other, by_hand[:, 1]])


def test_values_and_gradients_are_torchvisions() -> None:
    boxes, other = box_pairs()
    overlapping = (torch.minimum(boxes[:, 2:], other[:, 2:]) > torch.maximum(boxes[:, :2], other[:, :2])).all(-1)
    assert overlapping.any() and (~overlapping).any()  # both sides of the overlap test are checked
    ours = [boxes.clone().requires_grad_(), other.clone().requires_grad_()]
    theirs = [boxes.clone().requires_grad_(), other.clone().requires_grad_()]
    weights = torch.rand(len(boxes), generator=torch.Generator().manual_seed(1))
    loss, expected = paired_giou_loss(*ours), generalized_box_iou_loss(*theirs)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    (loss * weights).sum().backward()
    (expected * weights).sum().backward()
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine.grad, reference.grad)


def test_batched_shapes_and_no_value_read_back() -> None:
    boxes, other = box_pairs()
    loss = paired_giou_loss(boxes.view(3, 23, 4), other.view(3, 23, 4))
    torch.testing.assert_close(loss.flatten(), generalized_box_iou_loss(boxes, other), rtol=0, atol=0)
    with FakeTensorMode():
        assert paired_giou_loss(torch.rand(2, 5, 4), torch.rand(2, 5, 4)).shape == (2, 5)
