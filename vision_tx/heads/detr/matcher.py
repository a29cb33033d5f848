"""Hungarian matching of DETR's predictions to the ground-truth boxes, one image at a time."""

from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn
from torchvision.ops import box_convert

from vision_tx.heads.detr.assignment import batched_linear_assignment
from vision_tx.heads.detr.giou import paired_giou_loss

SOLVERS = ("scipy", "batched")


class HungarianMatcher(nn.Module):
    """Finds the one-to-one assignment of queries to targets with the lowest total cost.

    cost = ``cost_class`` * (-p(target class)) + ``cost_bbox`` * L1(cxcywh) + ``cost_giou`` * (-GIoU).
    With ``focal_alpha`` set, the logits are per-class sigmoid logits ``[B,Q,C]`` (no no-object
    class) and the class cost is the sigmoid focal loss of calling the query positive minus that of
    calling it negative (Deformable DETR, DINO), the same terms the focal classification loss uses.
    The costs are computed in one pass for the pairs of each image's queries with its own targets
    (``Q x sum K`` pairs, not every query of the batch against every target: ``B`` times fewer), moved to
    the CPU once and cut into one block per image for ``linear_sum_assignment``.

    ``solver="batched"`` finds the same optimum on the costs' device with
    :func:`~vision_tx.heads.detr.assignment.batched_linear_assignment` (no read back to the host, shapes fixed by the
    target counts: for CUDA graphs and whole-step compilation; slower than scipy on the CPU). It needs at most as
    many targets in an image as queries, and does not check the costs for NaN.
    """

    def __init__(
        self,
        cost_class: float = 1.0,
        cost_bbox: float = 5.0,
        cost_giou: float = 2.0,
        focal_alpha: float | None = None,
        focal_gamma: float = 2.0,
        solver: str = "scipy",
    ) -> None:
        super().__init__()
        if cost_class == cost_bbox == cost_giou == 0:
            raise ValueError(f"{__name__}: all matching costs are 0")
        if solver not in SOLVERS:
            raise ValueError(f"{__name__}: solver must be one of {SOLVERS}, got {solver!r}")
        self.cost_class = cost_class
        self.cost_bbox = cost_bbox
        self.cost_giou = cost_giou
        self.focal_alpha = focal_alpha
        self.focal_gamma = focal_gamma
        self.solver = solver

    @torch.no_grad()
    def forward(
        self, pred_logits: torch.Tensor, pred_boxes: torch.Tensor, targets: list[dict[str, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Matches ``pred_logits [B,Q,C+1]`` (``[B,Q,C]`` with ``focal_alpha``) and ``pred_boxes [B,Q,4]`` (normalised
        cxcywh) to ``targets``.

        ``targets[b]`` holds ``labels`` int64 ``[K_b]`` and ``boxes [K_b,4]`` (normalised cxcywh).
        Returns per image ``(query_indices, target_indices)``, int64 tensors of length ``min(Q, K_b)``, empty for an
        image without targets: on the CPU (with ``solver="batched"``: on the device, the targets in their order).
        """
        batch, num_queries = pred_logits.shape[:2]
        sizes = [len(t["labels"]) for t in targets]
        if len(sizes) != batch:
            raise ValueError(f"{__name__}: {len(sizes)} targets for a batch of {batch} images")
        empty = torch.empty(0, dtype=torch.int64)
        if sum(sizes) == 0:
            return [(empty, empty) for _ in sizes]
        device = pred_boxes.device
        labels = torch.cat([t["labels"] for t in targets]).to(device)
        boxes = torch.cat([t["boxes"] for t in targets]).to(device, pred_boxes.dtype)
        # queries[q, k]: the flat index of query q of the image that target k belongs to
        image_of_target = torch.arange(batch, device=device).repeat_interleave(  # output_size: no wait for the device
            torch.tensor(sizes, device=device), output_size=len(labels)
        )
        queries = image_of_target * num_queries + torch.arange(num_queries, device=device)[:, None]  # [Q, K]

        out_boxes = pred_boxes.flatten(0, 1)
        corners = box_convert(out_boxes, "cxcywh", "xyxy")[queries]  # [Q, K, 4]
        giou = 1 - paired_giou_loss(corners, box_convert(boxes, "cxcywh", "xyxy").expand_as(corners))
        cost = (
            self.cost_class * self._class_cost(pred_logits.flatten(0, 1), queries, labels)
            + self.cost_bbox * (out_boxes[queries] - boxes).abs().sum(-1)
            - self.cost_giou * giou
        )
        if self.solver == "batched":
            return batched_indices(cost, sizes)
        return [assign(block) for block in cost.float().cpu().split(sizes, dim=-1)]

    def _class_cost(self, logits: torch.Tensor, queries: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``[Q, K]``: the cost of giving query ``queries[q, k]`` (a row of ``logits [N, C]``) the class
        ``labels[k]``."""
        if self.focal_alpha is None:
            return -logits.softmax(-1)[queries, labels]
        prob = logits.sigmoid()[queries, labels]
        alpha, gamma, eps = self.focal_alpha, self.focal_gamma, 1e-8
        positive = alpha * (1 - prob) ** gamma * -(prob + eps).log()
        negative = (1 - alpha) * prob**gamma * -(1 - prob + eps).log()
        return positive - negative


def batched_indices(cost: torch.Tensor, sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:meth:`HungarianMatcher.forward`'s indices from ``cost [Q, sum(sizes)]``, the costs of each image's queries with
    its ``sizes[b]`` targets, all images solved at once on ``cost``'s device."""
    num_queries, most = cost.shape[0], max(sizes)
    if most > num_queries:
        raise ValueError(
            f"{__name__}: solver 'batched' needs at most {num_queries} targets an image (the queries), got {most}"
        )
    device = cost.device
    # Each image's targets padded with zero-cost ones (any query may take them: the real targets' optimum holds).
    columns = torch.tensor([image * most + k for image, size in enumerate(sizes) for k in range(size)], device=device)
    dense = cost.new_zeros(num_queries, len(sizes) * most).index_copy_(1, columns, cost)
    query_of_target = batched_linear_assignment(dense.view(num_queries, len(sizes), most).permute(1, 2, 0))
    return [(query_of_target[image, :size], torch.arange(size, device=device)) for image, size in enumerate(sizes)]


def assign(cost: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The lowest-cost one-to-one assignment of one image's queries to its targets, ``cost [Q, K]``:
    ``(query_indices, target_indices)``, int64 CPU tensors of length ``min(Q, K)``."""
    cost = cost.float().cpu()
    if not torch.isfinite(cost).all():
        raise ValueError(f"{__name__}: the matching cost holds NaN/inf (diverged predictions or invalid boxes)")
    rows, cols = linear_sum_assignment(cost.numpy())
    return torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)
