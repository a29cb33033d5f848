"""vision_tx ``HungarianMatcher`` against transformers' matchers on the same predictions and targets:
the focal-cost matcher of DINO and RT-DETR (``DeformableDetrHungarianMatcher``, costs 2, 5, 2) and
DETR's softmax one (``HungarianMatcher``, costs 1, 5, 2). Each is called once per decoder layer of a
training step, so its cost is paid several times a step. Rows:

1. The main job on real photographs: 8 images, 100 queries, 3 classes, 26 boxes an image (BCCD's 13
   with as many pasted by copy-paste).
2. DINO on COCO: 2 images, 900 queries, 91 classes, 7 boxes an image.
3. DETR on COCO: 2 images, 100 queries, 92 logits (91 classes and no-object), 7 boxes an image.

Before timing, each row checks that both sides find the same assignment (ties aside, which random
inputs do not have).
"""

from __future__ import annotations

import torch

from benchmarks.timing import Row, compare
from vision_tx.heads.detr import HungarianMatcher

ROWS = (  # name, images, queries, logits per query, boxes per image, focal
    ("main job (BCCD with copy-paste)", 8, 100, 3, 26, True),
    ("DINO on COCO", 2, 900, 91, 7, True),
    ("DETR on COCO", 2, 100, 92, 7, False),
)


def random_boxes(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Normalised cxcywh boxes inside the image."""
    centres = 0.15 + 0.7 * torch.rand(*shape, 2, generator=generator)
    sizes = 0.02 + 0.25 * torch.rand(*shape, 2, generator=generator)
    return torch.cat([centres, sizes], -1)


def run(device: str, quick: bool) -> list[Row]:
    from transformers.loss.loss_deformable_detr import DeformableDetrHungarianMatcher
    from transformers.loss.loss_for_object_detection import HungarianMatcher as DetrHungarianMatcher

    iters = 10 if quick else 40  # per process
    rows = []
    for label, images, queries, logits_per_query, boxes, focal in ROWS:
        generator = torch.Generator().manual_seed(0)
        logits = torch.randn(images, queries, logits_per_query, generator=generator).to(device)
        pred_boxes = random_boxes((images, queries), generator).to(device)
        classes = logits_per_query if focal else logits_per_query - 1
        labels = [torch.randint(classes, (boxes,), generator=generator).to(device) for _ in range(images)]
        targets = [
            {"labels": image_labels, "boxes": random_boxes((boxes,), generator).to(device)} for image_labels in labels
        ]
        if focal:
            ours_matcher = HungarianMatcher(2.0, 5.0, 2.0, focal_alpha=0.25)
            reference_matcher = DeformableDetrHungarianMatcher(class_cost=2.0, bbox_cost=5.0, giou_cost=2.0)
        else:
            ours_matcher = HungarianMatcher(1.0, 5.0, 2.0)
            reference_matcher = DetrHungarianMatcher(class_cost=1.0, bbox_cost=5.0, giou_cost=2.0)
        reference_targets = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
        outputs = {"logits": logits, "pred_boxes": pred_boxes}

        def ours(matcher=ours_matcher, logits=logits, pred_boxes=pred_boxes, targets=targets):
            return matcher(logits, pred_boxes, targets)

        def reference(matcher=reference_matcher, outputs=outputs, targets=reference_targets):
            return matcher(outputs, targets)

        for (our_queries, our_targets), (their_queries, their_targets) in zip(ours(), reference()):
            if not (torch.equal(our_queries, their_queries) and torch.equal(our_targets, their_targets)):
                raise AssertionError(f"matcher benchmark, {label}: the two sides assign differently")
        name = f"matcher {label}: b{images} q{queries} c{logits_per_query} k{boxes}"
        rows.append(compare(name, ours, reference, "transformers", device, unit_items=images, warmup=2, iters=iters))
    return rows
