"""RT-DETR's RoI box refinement against torchvision's RoIAlign and a step-by-step version of its edge shifts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchvision.ops import roi_align

from tests.parity import perturb_
from vision_tx.heads.rtdetr.box_refinement import RoIBoxRefinement

DIM, CHANNELS, SIZE, ENLARGE, MAX_SHIFT = 16, 6, 5, 1.25, 0.25
MAP = (10, 14)  # the padded map
VALID_RATIO = torch.tensor([[1.0, 1.0], [0.75, 0.8]])  # (width, height): the second image padded on both sides


def boxes_inside(batch: int = 2, queries: int = 7) -> torch.Tensor:
    """Boxes (cx, cy, w, h) whose widened grids stay inside the unpadded map (RoIAlign and ``grid_sample``
    differ at the map's border only)."""
    generator = torch.Generator().manual_seed(1)
    centers = 0.35 + 0.3 * torch.rand(batch, queries, 2, generator=generator, dtype=torch.float64)
    sizes = 0.1 + 0.3 * torch.rand(batch, queries, 2, generator=generator, dtype=torch.float64)
    return torch.cat([centers, sizes], -1)


def refinement(samples_per_bin: int = 1) -> RoIBoxRefinement:
    torch.manual_seed(0)
    return perturb_(RoIBoxRefinement(DIM, CHANNELS, SIZE, ENLARGE, MAX_SHIFT, samples_per_bin).double().eval())


def roi_align_samples(
    feature_map: torch.Tensor, boxes: torch.Tensor, valid_ratio: torch.Tensor, samples_per_bin: int = 1
) -> torch.Tensor:
    """torchvision's RoIAlign (``samples_per_bin`` squared samples a bin, half-pixel aligned) over each widened box, in
    the map's pixels."""
    height, width = feature_map.shape[-2:]
    scale = torch.stack([valid_ratio[:, 0] * width, valid_ratio[:, 1] * height], -1).repeat(1, 2)[:, None]  # [B,1,4]
    cx, cy, w, h = boxes.unbind(-1)
    corners = (
        torch.stack([cx - w * ENLARGE / 2, cy - h * ENLARGE / 2, cx + w * ENLARGE / 2, cy + h * ENLARGE / 2], -1)
        * scale
    )
    rois = [image_corners for image_corners in corners]
    return (
        roi_align(feature_map, rois, SIZE, spatial_scale=1.0, sampling_ratio=samples_per_bin, aligned=True)
        .flatten(1)
        .view(*boxes.shape[:2], -1)
    )


@pytest.mark.parametrize("samples_per_bin", [1, 2, 3])
def test_the_grid_is_roi_align_of_the_widened_box_within_the_unpadded_map(samples_per_bin: int) -> None:
    feature_map = torch.randn(2, CHANNELS, *MAP, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    boxes = boxes_inside()
    ours = refinement(samples_per_bin).sample(feature_map, boxes, VALID_RATIO.double())
    expected = roi_align_samples(feature_map, boxes, VALID_RATIO.double(), samples_per_bin)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)


def test_refined_boxes_are_each_edge_shifted_by_its_share_of_the_box() -> None:
    """The whole module step by step: 1x1 conv, BatchNorm (its perturbed running statistics), SiLU, RoIAlign, the
    MLP, then left and right moved by their shares of the width, top and bottom by theirs of the height."""
    module = refinement()
    feature_map = torch.randn(2, DIM, *MAP, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    boxes = boxes_inside()
    conv, norm = module.reduce[0], module.reduce[1]
    reduced = F.silu(
        F.batch_norm(
            F.conv2d(feature_map, conv.weight),
            norm.running_mean,
            norm.running_var,
            norm.weight,
            norm.bias,
            eps=norm.eps,
        )
    )
    hidden = roi_align_samples(reduced, boxes, VALID_RATIO.double())
    for index, layer in enumerate(module.edges.layers):
        hidden = layer(hidden) if index == len(module.edges.layers) - 1 else torch.relu(layer(hidden))
    left, top, right, bottom = (MAX_SHIFT * hidden.tanh()).unbind(-1)
    cx, cy, w, h = boxes.unbind(-1)
    x1, y1, x2, y2 = cx - w / 2 + left * w, cy - h / 2 + top * h, cx + w / 2 + right * w, cy + h / 2 + bottom * h
    expected = torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], -1)
    refined = module(boxes, feature_map, VALID_RATIO.double())
    assert (refined - boxes).abs().min() > 1e-6  # every coordinate moved
    torch.testing.assert_close(refined, expected, rtol=0, atol=1e-12)


def test_the_refinement_starts_as_the_identity_and_keeps_positive_sizes() -> None:
    boxes = boxes_inside()
    feature_map = torch.randn(2, DIM, *MAP, dtype=torch.float64)
    fresh = RoIBoxRefinement(DIM, CHANNELS, SIZE, ENLARGE, MAX_SHIFT).double()
    torch.testing.assert_close(fresh(boxes, feature_map, VALID_RATIO.double()), boxes, rtol=0, atol=1e-15)
    extreme = refinement()
    torch.nn.init.constant_(extreme.edges.layers[-1].bias, 50.0)  # every shift at its bound
    extreme.edges.layers[-1].bias.data[[0, 1]] = -50.0  # left and top out, right and bottom out: the largest box
    widest = extreme(boxes, feature_map, VALID_RATIO.double())
    torch.testing.assert_close(widest[..., 2:], boxes[..., 2:] * (1 + 2 * MAX_SHIFT), rtol=0, atol=1e-12)
    extreme.edges.layers[-1].bias.data[[0, 1]] = 50.0  # left and top in, right and bottom out: the same size, moved
    moved = extreme(boxes, feature_map, VALID_RATIO.double())
    torch.testing.assert_close(moved[..., :2], boxes[..., :2] + MAX_SHIFT * boxes[..., 2:], rtol=0, atol=1e-12)
    extreme.edges.layers[-1].bias.data[[2, 3]] = -50.0  # every edge in: the smallest box, still of positive size
    smallest = extreme(boxes, feature_map, VALID_RATIO.double())
    torch.testing.assert_close(smallest[..., 2:], boxes[..., 2:] * (1 - 2 * MAX_SHIFT), rtol=0, atol=1e-12)
