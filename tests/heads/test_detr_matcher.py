"""Hungarian matcher against a brute-force search over all assignments."""

from __future__ import annotations

import itertools

import pytest
import torch
from torchvision.ops import box_convert, generalized_box_iou

from vision_tx.heads.detr import HungarianMatcher


def random_boxes(num: int, generator: torch.Generator) -> torch.Tensor:
    centers = 0.2 + 0.6 * torch.rand(num, 2, generator=generator)
    sizes = 0.05 + 0.3 * torch.rand(num, 2, generator=generator)
    return torch.cat([centers, sizes], 1)


def pair_cost(logits, box, label, target_box, weights) -> float:
    """The matching cost of one query and one target, written out term by term."""
    w_class, w_bbox, w_giou = weights
    prob = logits.softmax(-1)[label]
    l1 = (box - target_box).abs().sum()
    giou = generalized_box_iou(
        box_convert(box[None], "cxcywh", "xyxy"), box_convert(target_box[None], "cxcywh", "xyxy")
    )[0, 0]
    return float(-w_class * prob + w_bbox * l1 - w_giou * giou)


def brute_force_cost(logits, boxes, labels, target_boxes, weights) -> float:
    num_queries, num_targets = len(logits), len(labels)
    cost = [
        [pair_cost(logits[q], boxes[q], labels[t], target_boxes[t], weights) for t in range(num_targets)]
        for q in range(num_queries)
    ]
    return min(
        sum(cost[q][t] for t, q in enumerate(chosen))
        for chosen in itertools.permutations(range(num_queries), num_targets)
    )


@pytest.mark.parametrize("solver", ["scipy", "batched"])
@pytest.mark.parametrize("weights", [(1.0, 5.0, 2.0), (2.0, 0.0, 1.0)])
def test_matches_brute_force_optimum(weights, solver) -> None:
    generator = torch.Generator().manual_seed(0)
    matcher = HungarianMatcher(*weights, solver=solver)
    num_classes = 5
    for trial in range(8):
        num_queries = 3 + trial % 4
        target_counts = [trial % 4, num_queries, 1]
        logits = torch.randn(len(target_counts), num_queries, num_classes + 1, generator=generator)
        boxes = torch.stack([random_boxes(num_queries, generator) for _ in target_counts])
        targets = [
            {"labels": torch.randint(0, num_classes, (k,), generator=generator), "boxes": random_boxes(k, generator)}
            for k in target_counts
        ]
        indices = matcher(logits, boxes, targets)
        for image, ((queries, target_index), target) in enumerate(zip(indices, targets)):
            num_targets = len(target["labels"])
            assert len(queries) == len(target_index) == num_targets
            assert sorted(target_index.tolist()) == list(range(num_targets))
            assert len(set(queries.tolist())) == num_targets
            if num_targets == 0:
                continue
            found = sum(
                pair_cost(logits[image, q], boxes[image, q], target["labels"][t], target["boxes"][t], weights)
                for q, t in zip(queries.tolist(), target_index.tolist())
            )
            best = brute_force_cost(logits[image], boxes[image], target["labels"], target["boxes"], weights)
            assert found == pytest.approx(best, abs=1e-5)


def test_batched_solver_gives_scipys_pairs_on_the_devices_side() -> None:
    """Focal class costs, a batch of images with 0 to Q targets: the same pairs, ordered by target."""
    generator = torch.Generator().manual_seed(1)
    counts, num_queries, num_classes = [0, 3, 1, 20, 7, 0, 20], 20, 4
    logits = torch.randn(len(counts), num_queries, num_classes, generator=generator)
    boxes = torch.stack([random_boxes(num_queries, generator) for _ in counts])
    targets = [
        {"labels": torch.randint(0, num_classes, (k,), generator=generator), "boxes": random_boxes(k, generator)}
        for k in counts
    ]
    scipy = HungarianMatcher(2.0, 5.0, 2.0, focal_alpha=0.25)(logits, boxes, targets)
    batched = HungarianMatcher(2.0, 5.0, 2.0, focal_alpha=0.25, solver="batched")(logits, boxes, targets)
    for (queries, target_index), (batched_queries, batched_targets) in zip(scipy, batched):
        assert batched_targets.tolist() == list(range(len(target_index)))
        assert batched_queries.tolist() == queries[target_index.argsort()].tolist()


def test_images_without_targets() -> None:
    matcher = HungarianMatcher()
    logits, boxes = torch.randn(2, 4, 3), torch.rand(2, 4, 4) * 0.5 + 0.25
    none = {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}
    one = {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}
    for targets in ([none, none], [none, one]):
        indices = matcher(logits, boxes, targets)
        assert [len(q) for q, _ in indices] == [len(t["labels"]) for t in targets]
        assert all(q.dtype == t.dtype == torch.int64 for q, t in indices)


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="detr.matcher: 1 targets for a batch of 2"):
        HungarianMatcher()(
            torch.randn(2, 4, 3), torch.rand(2, 4, 4), [{"labels": torch.tensor([0]), "boxes": torch.rand(1, 4)}]
        )
    with pytest.raises(ValueError, match="detr.matcher: all matching costs are 0"):
        HungarianMatcher(0, 0, 0)
    with pytest.raises(ValueError, match="solver must be one of"):
        HungarianMatcher(solver="auction")
    with pytest.raises(ValueError, match="solver 'batched' needs at most 4 targets an image"):
        HungarianMatcher(solver="batched")(
            torch.randn(1, 4, 3),
            torch.rand(1, 4, 4),
            [{"labels": torch.zeros(5, dtype=torch.int64), "boxes": torch.rand(5, 4)}],
        )
