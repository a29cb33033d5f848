"""DINO's contrastive denoising queries (Zhang et al., 2022): noised copies of the ground truth that the
decoder learns to reconstruct (positives) or to reject (negatives), in groups that cannot see each other."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchvision.ops import box_convert

from vision_tx.heads.dino.transformer import inverse_sigmoid


@dataclass
class DenoisingQueries:
    """``num_groups`` groups of ``2 * group_size`` queries: ``group_size`` positives, then as many negatives.

    Query ``g * 2 * group_size + k`` is group ``g``'s positive copy of target ``k`` of its image, and
    ``g * 2 * group_size + group_size + k`` the negative one; slots past an image's targets are padding.
    """

    content: torch.Tensor  # [B,N,D] label embeddings of the noised labels (zero on padding)
    boxes: torch.Tensor  # [B,N,4] noised boxes, cxcywh, as the decoder reads them: sigmoid(inverse_sigmoid(b, eps))
    attn_mask: torch.Tensor  # [N+Q,N+Q] bool, True where a query may not look (Q matching queries last)
    num_groups: int
    group_size: int

    def positive_indices(self, targets: list[dict[str, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per image ``(query_indices, target_indices)`` of the positive queries, every group's."""
        indices = []
        for target in targets:
            count = len(target["labels"])
            group_start = torch.arange(self.num_groups)[:, None] * 2 * self.group_size
            queries = (group_start + torch.arange(count)).flatten()
            indices.append((queries, torch.arange(count).repeat(self.num_groups)))
        return indices


class ContrastiveDenoising(nn.Module):
    """DINO's denoising queries for a batch's targets.

    ``num_queries`` is the official ``dn_number``: with at most ``K`` targets per image, it makes
    ``num_queries // K`` groups (at least one), each of ``K`` positive and ``K`` negative queries, so
    ``2 * K * (num_queries // K)`` queries in all, up to twice ``num_queries`` (DINO's 100 gives 25
    groups, 200 queries, for 4 targets; 33 groups, 198 queries, for 3). Each group copies every target twice. A label is
    replaced by a random class with probability ``label_noise_ratio / 2``. Each box edge moves by ``box_noise_scale``
    times half the box's width (or height) times a random factor: below 1 for positives, between 1
    and 2 for negatives, so positives stay closer to their target than negatives (defaults: the official
    DINO training command's ``dn_label_noise_ratio`` 0.5 and ``dn_box_noise_scale`` 1.0, ``scripts/DINO_train.sh``). The
    noised corners are clamped to the image and the boxes go through ``inverse_sigmoid(., eps)`` and back, as the
    official ``prepare_for_cdn`` stores them, so the decoder reads sizes of at least about ``eps``.
    """

    def __init__(
        self,
        num_classes: int,
        dim: int,
        num_queries: int = 100,
        label_noise_ratio: float = 0.5,
        box_noise_scale: float = 1.0,
        eps: float = 1e-3,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.label_noise_ratio = label_noise_ratio
        self.box_noise_scale = box_noise_scale
        self.eps = eps
        self.label_embed = nn.Embedding(num_classes, dim)

    def forward(self, targets: list[dict[str, torch.Tensor]], num_matching: int) -> DenoisingQueries | None:
        """``targets``: per image ``labels [K]`` and ``boxes [K,4]`` (normalised cxcywh); ``num_matching``:
        the number of matching queries that follow. None when the batch has no target."""
        group_size = max((len(t["labels"]) for t in targets), default=0)
        if group_size == 0 or self.num_queries < 1:
            return None
        num_groups = max(1, self.num_queries // group_size)
        device = self.label_embed.weight.device
        batch = len(targets)
        labels = torch.zeros(batch, group_size, dtype=torch.int64, device=device)
        boxes = torch.full((batch, group_size, 4), 0.5, device=device)
        valid = torch.zeros(batch, group_size, dtype=torch.bool, device=device)
        for image, target in enumerate(targets):
            count = len(target["labels"])
            labels[image, :count] = target["labels"]
            boxes[image, :count] = target["boxes"].to(boxes.dtype)
            valid[image, :count] = True
        shape = (batch, num_groups, 2, group_size)
        labels, valid = labels[:, None, None].expand(shape), valid[:, None, None].expand(shape)
        boxes = boxes[:, None, None].expand(*shape, 4)

        relabel = torch.rand(shape, device=device) < self.label_noise_ratio * 0.5
        labels = torch.where(relabel, torch.randint_like(labels, self.num_classes), labels)
        corners = box_convert(boxes, "cxcywh", "xyxy")
        half_size = boxes[..., 2:].repeat(1, 1, 1, 1, 2) / 2
        sign = torch.randint_like(corners, 2) * 2 - 1
        magnitude = torch.rand_like(corners)
        magnitude[:, :, 1] += 1.0  # negatives
        corners = (corners + sign * magnitude * half_size * self.box_noise_scale).clamp(0.0, 1.0)
        noised = box_convert(corners, "xyxy", "cxcywh")  # crossed corners give negative sizes...
        noised = inverse_sigmoid(noised, self.eps).sigmoid()  # ...which the official code clamps here
        noised = torch.where(valid[..., None], noised, boxes)

        content = self.label_embed(labels) * valid[..., None]
        num_denoising = num_groups * 2 * group_size
        return DenoisingQueries(
            content.reshape(batch, num_denoising, -1),
            noised.reshape(batch, num_denoising, 4),
            denoising_attention_mask(num_groups, 2 * group_size, num_matching, device),
            num_groups,
            group_size,
        )


def denoising_attention_mask(
    num_groups: int, group_queries: int, num_matching: int, device: torch.device | None = None
) -> torch.Tensor:
    """``[N+Q,N+Q]`` bool on ``device``, True where a query may not look: the ``num_matching`` matching queries (last
    ``Q``) see no denoising query, and each of the ``num_groups`` groups of ``group_queries`` denoising queries
    (``N = num_groups * group_queries``) sees no other group."""
    num_denoising = num_groups * group_queries
    group = torch.arange(num_denoising + num_matching, device=device) // group_queries
    is_denoising = group < num_groups
    other_group = is_denoising[:, None] & is_denoising[None, :] & (group[:, None] != group[None, :])
    return other_group | (~is_denoising[:, None] & is_denoising[None, :])
