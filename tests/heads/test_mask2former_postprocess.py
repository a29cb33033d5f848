"""Mask2Former's semantic, panoptic and instance inference against transformers' Mask2FormerImageProcessor
on the same outputs (masks given at its working size of 384x384, so that no side resizes), and the
paper's rules where transformers departs from them, on hand-made cases."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import require_reference
from vision_tx.heads.mask2former import instance_inference, panoptic_inference, resize_masks, semantic_inference

transformers = require_reference("transformers")

SIZE = 384  # the size transformers resizes the masks to before every inference
NUM_CLASSES, QUERIES = 4, 6


@pytest.fixture(scope="module")
def processor():
    return transformers.Mask2FormerImageProcessor()


def random_outputs(seed: int, saturated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Class logits ``[1,Q,C+1]`` and mask logits ``[1,Q,SIZE,SIZE]`` (smooth blobs; where ``saturated``, +-20 with
    about a tenth of each mask positive)."""
    generator = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(1, QUERIES, NUM_CLASSES + 1, generator=generator, dtype=torch.float64)
    coarse = 4 * torch.randn(1, QUERIES, 6, 6, generator=generator, dtype=torch.float64)
    masks = torch.nn.functional.interpolate(coarse, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    return logits, (20 * (masks - 5).sign() if saturated else masks)


@pytest.mark.parametrize("seed", [0, 1])
def test_semantic_matches_transformers(processor, seed: int) -> None:
    logits, masks = random_outputs(seed)
    (expected,) = processor.post_process_semantic_segmentation(
        SimpleNamespace(class_queries_logits=logits, masks_queries_logits=masks), return_segmentation_scores=True
    )
    scores = semantic_inference(logits[0], masks[0])
    torch.testing.assert_close(scores, expected.segmentation_scores, rtol=0, atol=1e-15)  # measured 0 (same einsum)
    assert torch.equal(scores.argmax(0), expected.segmentation)


@pytest.mark.parametrize("seed", [0, 1])
def test_instances_match_transformers(processor, seed: int) -> None:
    logits, masks = random_outputs(seed)
    (expected,) = processor.post_process_instance_segmentation(
        SimpleNamespace(class_queries_logits=logits, masks_queries_logits=masks), threshold=0.0, return_binary_maps=True
    )
    ours = instance_inference(logits[0], masks[0], topk=QUERIES)
    assert all(m.any() for m in ours["masks"])  # transformers drops empty masks, the paper keeps them
    info = sorted(expected["segments_info"], key=lambda s: -s["score"])
    binary = expected["segmentation"][[s["id"] for s in info]]
    torch.testing.assert_close(
        ours["scores"], torch.tensor([s["score"] for s in info], dtype=torch.float64), rtol=0, atol=5e-7
    )  # rounded to 6 digits there
    assert ours["labels"].tolist() == [s["label_id"] for s in info]
    assert torch.equal(ours["masks"], binary.bool())


def test_instances_keep_the_thing_classes_of_the_top_k() -> None:
    """As the official panoptic models: the top-k pairs first, then the thing classes among them."""
    logits, masks = random_outputs(3)
    every = instance_inference(logits[0], masks[0], topk=5)
    things = instance_inference(logits[0], masks[0], topk=5, thing_classes={1, 2})
    kept = [label in (1, 2) for label in every["labels"].tolist()]
    assert 0 < sum(kept) < 5
    assert things["labels"].tolist() == every["labels"][kept].tolist()
    torch.testing.assert_close(things["scores"], every["scores"][kept])


def _saturated_panoptic(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Confident outputs with query 0 a stuff background covering every pixel: the case where the
    paper's rules and transformers' coincide (every pixel's winner holds it with probability ~1)."""
    logits, masks = random_outputs(seed, saturated=True)
    masks[0, 0] = 20.0
    logits[0, 0] = 0.0
    logits[0, 0, 3] = 3.5  # class 3 (stuff) with probability 0.89: kept, and below the other kept queries
    logits[0, 1:, :] *= 3  # confident classes, so several queries pass the 0.8 threshold
    return logits, masks


# Seeds whose kept queries hold each stuff class once: when a second query of a fused class comes after
# a new segment, transformers (5.x compute_segments) sets its running id back to the fused segment's
# and gives the next segment an id already used (seed 0 shows it); the paper's code numbers on.
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_panoptic_matches_transformers(processor, seed: int) -> None:
    logits, masks = _saturated_panoptic(seed)
    is_thing = {0: True, 1: True, 2: True, 3: False}
    (expected,) = processor.post_process_panoptic_segmentation(
        SimpleNamespace(class_queries_logits=logits, masks_queries_logits=masks),
        threshold=0.8,
        overlap_mask_area_threshold=0.8,
        label_ids_to_fuse={3},
    )
    ours = panoptic_inference(logits[0], masks[0], is_thing, object_mask_threshold=0.8, overlap_threshold=0.8)
    their_ids = sorted({s["id"] for s in expected["segments_info"]})
    assert len(ours["segments_info"]) == len(their_ids) >= 2
    first = {s["id"]: s for s in reversed(expected["segments_info"])}
    for info, their_id in zip(ours["segments_info"], their_ids):
        assert info["category_id"] == first[their_id]["label_id"]
        assert torch.equal(ours["segment_ids"] == info["id"], expected["segmentation"] == their_id)


def test_panoptic_paper_rules() -> None:
    """Stuff queries of one class merge; a pixel whose winner's own probability is below 0.5 is void; a
    query keeping under ``overlap_threshold`` of its mask is dropped; no-object and low scores are dropped."""
    logits = torch.full((5, 4), -10.0, dtype=torch.float64)
    logits[0, 2] = logits[1, 2] = 10.0  # two stuff queries of class 2
    logits[2, 0] = 10.0  # a thing, mostly covered by query 3
    logits[3, 1] = 12.0  # a thing with a higher score
    logits[4, 3] = 10.0  # no-object
    masks = torch.full((5, 4, 8), -20.0, dtype=torch.float64)
    masks[0, :, :2] = masks[1, :, 2:4] = 20.0
    masks[2, :, 4:8] = 20.0
    masks[3, :, 5:8] = 20.0
    masks[4] = 20.0
    masks[0, 0, 0] = -0.5  # the winner of this pixel below 0.5: void
    ours = panoptic_inference(logits, masks, {0: True, 1: True, 2: False}, overlap_threshold=0.8)
    categories = [s["category_id"] for s in ours["segments_info"]]
    assert categories == [2, 1]  # query 2 keeps 1/4 of its mask: dropped
    stuff, thing = (s["id"] for s in ours["segments_info"])
    assert (ours["segment_ids"][:, :4] == stuff).sum() == 15 and ours["segment_ids"][0, 0] == 0
    assert (ours["segment_ids"][:, 5:] == thing).all() and (ours["segment_ids"][:, 4] == 0).all()
    assert [s["area"] for s in ours["segments_info"]] == [15, 12]


@pytest.mark.parametrize(
    "probability, threshold, kept", [(0.65, 0.6, True), (0.65, 0.7, False), (0.4, 0.3, True), (0.4, 0.45, False)]
)
def test_panoptic_object_threshold_is_the_given_one(probability: float, threshold: float, kept: bool) -> None:
    """A thing query whose class has ``probability`` is kept exactly when it is above the given
    ``object_mask_threshold``, on both sides of 0.5 (a stuff query covers the rest of the image)."""
    logits = torch.full((2, 4), -30.0, dtype=torch.float64)
    logits[0, 1] = 10.0  # stuff, score ~1
    logits[1, 0] = math.log(probability)  # a thing; the rest split between another thing and no-object
    logits[1, 2] = logits[1, 3] = math.log((1 - probability) / 2)
    masks = torch.full((2, 4, 4), 20.0, dtype=torch.float64)
    masks[0, :2, :2] = -20.0
    masks[1] = -20.0
    masks[1, :2, :2] = 20.0
    ours = panoptic_inference(logits, masks, {0: True, 1: False, 2: True}, object_mask_threshold=threshold)
    assert [s["category_id"] for s in ours["segments_info"]] == ([1, 0] if kept else [1])


def test_resize_masks_crops_the_padding_before_resizing() -> None:
    masks = torch.arange(2 * 4 * 6, dtype=torch.float64).view(2, 4, 6)
    resized = resize_masks(masks, (12, 20), (6, 10))
    upsampled = torch.nn.functional.interpolate(masks[None], size=(16, 24), mode="bilinear", align_corners=False)[
        :, :, :12, :20
    ]
    torch.testing.assert_close(
        resized, torch.nn.functional.interpolate(upsampled, size=(6, 10), mode="bilinear", align_corners=False)[0]
    )
    with pytest.raises(ValueError, match="exceeds the padded input"):
        resize_masks(masks, (17, 20), (6, 10))
