"""D-FINE's fine-grained distribution refinement (Peng et al., D-FINE: Redefine Regression Task of DETRs as
Fine-grained Distribution Refinement, 2024): every box edge is a distribution over ``reg_max + 1`` bins of the
non-uniform weighting function W(n), its integral the edge's distance from an initial box; the targets of the
fine-grained localisation loss; the location-quality estimator and the decoder's gate."""

from __future__ import annotations

import torch
from torch import nn
from torchvision.ops import box_convert

from vision_tx.heads.detr.mlp import MLP


def weighting_function(reg_max: int, up: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """W(n), ``[reg_max + 1]``: 0 in the middle, ``+-(step**k - 1)`` for ``k = 1 .. reg_max/2 - 1`` either
    side with ``step = (a + 1) ** (2 / (reg_max - 2))``, ``a = |up * reg_scale|``, and ``+-2a`` at the ends
    (``reg_max`` even; ``up [1]``, ``reg_scale [1]``: one-element tensors)."""
    bound = (up * reg_scale).abs().reshape(1)
    step = (bound + 1) ** (2 / (reg_max - 2))
    right = step ** torch.arange(1, reg_max // 2, dtype=bound.dtype, device=bound.device) - 1
    return torch.cat([-2 * bound, -right.flip(0), torch.zeros_like(bound), right, 2 * bound])


def integral(corners: torch.Tensor, project: torch.Tensor) -> torch.Tensor:
    """The expected edge distances ``[..., 4]`` of the edges' bin logits ``corners [..., 4 * (R + 1)]`` under
    the weights ``project [R + 1]`` (W(n))."""
    probabilities = corners.unflatten(-1, (4, -1)).softmax(-1)
    return probabilities @ project.to(probabilities.dtype)


def distances_to_boxes(initial: torch.Tensor, distances: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """Boxes ``[..., 4]`` (cxcywh) whose left, top, right and bottom edges lie ``(reg_scale / 2 + d) * size /
    reg_scale`` from the centre of ``initial [..., 4]`` (cxcywh), for the ``distances d [..., 4]`` and
    ``reg_scale [1]``."""
    scale = reg_scale.abs()
    centre, size = torch.cat([initial[..., :2]] * 2, -1), torch.cat([initial[..., 2:]] * 2, -1)
    sign = distances.new_tensor([-1.0, -1.0, 1.0, 1.0])
    edges = centre + sign * (0.5 * scale + distances) * size / scale
    return box_convert(edges, "xyxy", "cxcywh")


def edge_targets(
    initial: torch.Tensor, target_boxes: torch.Tensor, reg_max: int, up: torch.Tensor, reg_scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fine-grained localisation targets of the edges of ``target_boxes [M,4]`` seen from ``initial [M,4]``
    (both cxcywh): each edge's distance (the inverse of :func:`distances_to_boxes`) lies between bins ``left``
    and ``left + 1`` of W(n) (:func:`weighting_function` of ``reg_max``, ``up [1]`` and ``reg_scale [1]``); returns
    ``left [M*4]`` (int64, in ``[0, reg_max - 1]``) and the right bin's share ``[M*4]`` (linear; a distance below
    W(0) is all bin 0's, above W(reg_max) all bin reg_max's)."""
    scale = reg_scale.abs()
    edges = box_convert(target_boxes, "cxcywh", "xyxy")
    sign = edges.new_tensor([-1.0, -1.0, 1.0, 1.0])
    centre, size = initial[:, :2].repeat(1, 2), initial[:, 2:].repeat(1, 2)
    distances = (sign * (edges - centre) / (size / scale + 1e-16) - 0.5 * scale).flatten()
    project = weighting_function(reg_max, up, reg_scale)
    index = torch.searchsorted(project, distances.contiguous(), right=True) - 1  # -1 .. reg_max
    left = index.clamp(0, reg_max - 1)
    to_left, to_right = (distances - project[left]).abs(), (project[left + 1] - distances).abs()
    share = to_left / (to_left + to_right)
    share = torch.where(index < 0, 0.0, torch.where(index >= reg_max, 1.0, share))
    return left, share


class LocationQuality(nn.Module):
    """The location-quality estimator: an MLP (``num_layers``, ``hidden_dim`` wide) of each edge's ``top_k``
    largest bin probabilities and their mean, added to every class logit."""

    def __init__(self, reg_max: int, top_k: int = 4, hidden_dim: int = 64, num_layers: int = 2) -> None:
        super().__init__()
        self.reg_max, self.top_k = reg_max, top_k
        self.reg_conf = MLP(4 * (top_k + 1), hidden_dim, 1, num_layers)
        nn.init.zeros_(self.reg_conf.layers[-1].weight)
        nn.init.zeros_(self.reg_conf.layers[-1].bias)

    def forward(self, logits: torch.Tensor, corners: torch.Tensor) -> torch.Tensor:
        """``logits [B,Q,C]``, ``corners [B,Q,4 * (reg_max + 1)]`` -> ``[B,Q,C]``."""
        top = corners.unflatten(-1, (4, self.reg_max + 1)).softmax(-1).topk(self.top_k, -1).values
        features = torch.cat([top, top.mean(-1, keepdim=True)], -1).flatten(-2)
        return logits + self.reg_conf(features)


class Gate(nn.Module):
    """``norm(g1 * residual + g2 * x)``, ``(g1, g2) = sigmoid(linear([residual, x]))``: the decoder layer's
    gated sum of its input and its cross-attention (in place of a residual sum); both gates start at 0.5."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gate = nn.Linear(2 * dim, 2 * dim)
        self.norm = nn.LayerNorm(dim)
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    def forward(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        first, second = self.gate(torch.cat([residual, x], -1)).sigmoid().chunk(2, -1)
        return self.norm(first * residual + second * x)
