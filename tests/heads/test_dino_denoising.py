"""DINO's contrastive denoising queries against the official IDEA-Research/DINO ``prepare_for_cdn``
arithmetic (written in the test) and transformers' RT-DETR construction of the same scheme."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import require_reference
from vision_tx.heads.dino import ContrastiveDenoising

NUM_CLASSES, DIM, MATCHING = 7, 8, 5
EPS = 1e-3  # DINO's inverse_sigmoid bound


def official_groups(dn_number: int, max_targets: int) -> int:
    """The group count of IDEA-Research/DINO's ``prepare_for_cdn``, step by step: ``dn_number`` is
    doubled (positives and negatives), then divided by twice the largest target count when it is at
    least 100, and at least 1. (Below 100 the official code keeps the doubled number as the group
    count whatever the targets; its configs all use ``dn_number=100``.)"""
    doubled = dn_number * 2
    groups = doubled // (max_targets * 2) if doubled >= 100 else doubled
    return max(groups, 1)


def targets_of(counts: list[int], seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    targets = []
    for count in counts:
        centres = torch.rand(count, 2, generator=generator) * 0.8 + 0.1
        sizes = torch.rand(count, 2, generator=generator) * 0.3 + 0.05
        labels = torch.randint(NUM_CLASSES, (count,), generator=generator)
        targets.append({"labels": labels, "boxes": torch.cat([centres, sizes], 1)})
    return targets


@pytest.mark.parametrize("dn_number", [50, 100, 300])
@pytest.mark.parametrize("counts", [[1], [2, 1], [3, 0], [4, 2], [7], [30, 5], [101], [250, 3]])
def test_group_count_is_the_official_dn_number(dn_number: int, counts: list[int]) -> None:
    """``num_denoising`` counts as the official ``dn_number``: 100 and 4 targets make 25 groups of
    4 positive and 4 negative queries (200), not 12 groups (96)."""
    torch.manual_seed(0)
    queries = ContrastiveDenoising(NUM_CLASSES, DIM, num_queries=dn_number)(targets_of(counts), MATCHING)
    largest = max(counts)
    groups = official_groups(dn_number, largest)
    assert (queries.num_groups, queries.group_size) == (groups, largest)
    assert queries.boxes.shape[1] == queries.content.shape[1] == 2 * largest * groups
    assert queries.attn_mask.shape == (2 * largest * groups + MATCHING,) * 2


def test_no_queries_without_targets() -> None:
    assert ContrastiveDenoising(NUM_CLASSES, DIM)(targets_of([0, 0]), MATCHING) is None


def test_noised_boxes_are_clamped_and_stored_through_the_inverse_sigmoid() -> None:
    """The official code clamps the noised corners to the image, converts them to cxcywh (crossed
    corners give negative sizes) and keeps ``inverse_sigmoid(box, eps=1e-3)``, which the decoder turns
    back with a sigmoid: every coordinate it reads lies within [eps / (1 + eps), 1 / (1 + eps)]."""
    torch.manual_seed(0)
    targets = targets_of([6, 3], seed=1)
    queries = ContrastiveDenoising(NUM_CLASSES, DIM, num_queries=100, label_noise_ratio=0.0, box_noise_scale=1.0)(
        targets, MATCHING
    )
    low, high = EPS / (1 + EPS), 1 / (1 + EPS)
    assert queries.boxes.min() >= low - 1e-7 and queries.boxes.max() <= high + 1e-7
    # Crossed corners (about 44% of the negatives at noise scale 1) become sizes of exactly eps / (1 + eps).
    negatives = queries.boxes.view(2, queries.num_groups, 2, queries.group_size, 4)[0, :, 1, :, 2:]
    at_floor = (negatives - low).abs() < 1e-7
    assert 0.2 < at_floor.float().mean() < 0.6
    # Coordinates inside [eps, 1 - eps] pass unchanged: those of the positives are their noised boxes.
    positives = queries.boxes.view(2, queries.num_groups, 2, queries.group_size, 4)[0, :, 0, :6]
    corners = torch.cat([positives[..., :2] - positives[..., 2:] / 2, positives[..., :2] + positives[..., 2:] / 2], -1)
    target = targets[0]["boxes"]
    target_corners = torch.cat([target[:, :2] - target[:, 2:] / 2, target[:, :2] + target[:, 2:] / 2], -1)
    inside = (corners > 0) & (corners < 1)
    moved = (corners - target_corners).abs() / (target[:, 2:] / 2).repeat(1, 2)
    assert (moved[inside] < 1 + 1e-5).all()


def official_readout(boxes: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """What DINO's decoder reads from a noised cxcywh box: ``sigmoid(inverse_sigmoid(box, eps))`` with
    the official ``inverse_sigmoid`` (clamp to [0, 1], then each side of the ratio to at least eps)."""
    x = boxes.clamp(0, 1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps)).sigmoid()


def test_queries_are_transformers_rt_detr_contrastive_denoising_groups() -> None:
    """transformers' RT-DETR builds DINO's contrastive denoising groups independently; it draws the
    same random numbers in the same order, so with one seed both give the same labels and boxes
    (RT-DETR keeps them through an inverse sigmoid of eps 1e-5, read back here with DINO's 1e-3), the
    same positive indices and the same attention mask."""
    rt_detr = require_reference("transformers.models.rt_detr.modeling_rt_detr")
    targets = targets_of([5, 2, 0, 3], seed=2)
    targets[0]["boxes"][0] = torch.tensor([0.05, 0.95, 0.3, 0.2])  # noise crosses the image's edges
    denoising = ContrastiveDenoising(NUM_CLASSES, DIM, num_queries=20, box_noise_scale=1.0)  # RT-DETR's default scale
    class_embed = torch.nn.Embedding(NUM_CLASSES + 1, DIM)  # RT-DETR's padding label is num_classes
    with torch.no_grad():
        class_embed.weight[:NUM_CLASSES] = denoising.label_embed.weight
    torch.manual_seed(5)
    queries = denoising(targets, MATCHING)
    torch.manual_seed(5)
    content, logit_boxes, mask, meta = rt_detr.get_contrastive_denoising_training_group(
        [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets],
        NUM_CLASSES,
        MATCHING,
        class_embed,
        20,
        label_noise_ratio=0.5,
        box_noise_scale=1.0,
    )
    assert queries.num_groups == meta["dn_num_group"] == 20 // 5
    assert meta["dn_num_split"] == [queries.boxes.shape[1], MATCHING]
    valid = torch.zeros(queries.boxes.shape[:2], dtype=torch.bool)
    for image, target in enumerate(targets):
        for group in range(queries.num_groups):
            for half in range(2):
                start = (2 * group + half) * queries.group_size
                valid[image, start : start + len(target["labels"])] = True
    torch.testing.assert_close(queries.content[valid], content[valid], rtol=0, atol=0)
    assert (queries.content[~valid] == 0).all()  # padding: no label (the official zero rows)
    expected_boxes = official_readout(logit_boxes.sigmoid())
    torch.testing.assert_close(queries.boxes[valid], expected_boxes[valid], rtol=0, atol=1e-7)  # measured 1.2e-8
    assert (queries.boxes[~valid] == 0.5).all()  # padding: the official inverse-sigmoid 0
    assert ((logit_boxes[valid].sigmoid() < EPS) | (logit_boxes[valid].sigmoid() > 1 - EPS)).any()  # the clamp matters
    for (ours, _), theirs in zip(queries.positive_indices(targets), meta["dn_positive_idx"]):
        assert ours.tolist() == theirs.tolist()
    assert torch.equal(queries.attn_mask, mask == -torch.inf)


def test_attention_mask_in_both_directions() -> None:
    """Matching queries never see denoising ones; a denoising query sees its own group and every
    matching query, and no other group."""
    torch.manual_seed(0)
    queries = ContrastiveDenoising(NUM_CLASSES, DIM, num_queries=9)(targets_of([3, 1]), MATCHING)
    blocked = queries.attn_mask
    per_group = 2 * queries.group_size
    total = per_group * queries.num_groups
    assert queries.num_groups == 3
    for row in range(total + MATCHING):
        for column in range(total + MATCHING):
            if row >= total:  # a matching query
                expected = column < total
            else:
                expected = column < total and column // per_group != row // per_group
            assert bool(blocked[row, column]) == expected, (row, column)
