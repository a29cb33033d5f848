"""DETR post-processing: original-pixel xyxy boxes, category ids, no-object never chosen; panoptic
segment maps from hand-built outputs."""

from __future__ import annotations

import math

import pytest
import torch

from vision_tx.heads.detr import (
    normalize_targets,
    postprocess_detections,
    postprocess_panoptic,
    postprocess_sigmoid_detections,
    postprocess_sigmoid_per_query,
)


def test_boxes_in_original_pixels_and_best_real_class() -> None:
    logits = torch.full((2, 2, 4), -5.0)
    logits[0, 0, 2] = 3.0  # class 2
    logits[0, 1, 3], logits[0, 1, 1] = 9.0, 2.0  # no-object wins, class 1 is the best real class
    logits[1, :, 0] = 1.0
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.4], [0.25, 0.25, 0.5, 0.5]], [[0.1, 0.9, 0.2, 0.2], [0.5, 0.5, 1.0, 1.0]]])
    orig_sizes = torch.tensor([[480, 640], [100, 50]])
    results = postprocess_detections({"pred_logits": logits, "pred_boxes": boxes}, orig_sizes)

    torch.testing.assert_close(
        results[0]["boxes"], torch.tensor([[256.0, 144.0, 384.0, 336.0], [0.0, 0.0, 320.0, 240.0]])
    )
    torch.testing.assert_close(results[1]["boxes"], torch.tensor([[0.0, 80.0, 10.0, 100.0], [0.0, 0.0, 50.0, 100.0]]))
    assert results[0]["labels"].tolist() == [2, 1] and results[1]["labels"].tolist() == [0, 0]
    torch.testing.assert_close(results[0]["scores"], logits[0].softmax(-1)[[0, 1], [2, 1]])


def test_round_trip_with_target_normalisation() -> None:
    # A box given in pixels of a resized image comes back in pixels of the original image.
    resized = {
        "boxes": torch.tensor([[40.0, 30.0, 200.0, 150.0]]),
        "labels": torch.tensor([7]),
        "size": torch.tensor([300, 400]),
    }
    normalised = normalize_targets([resized])[0]["boxes"]
    logits = torch.zeros(1, 1, 9)
    logits[0, 0, 7] = 5.0
    (result,) = postprocess_detections(
        {"pred_logits": logits, "pred_boxes": normalised[None]}, torch.tensor([[600, 800]])
    )
    torch.testing.assert_close(result["boxes"], torch.tensor([[80.0, 60.0, 400.0, 300.0]]))
    assert result["labels"].tolist() == [7]


def test_bad_sizes_are_named() -> None:
    outputs = {"pred_logits": torch.zeros(2, 3, 5), "pred_boxes": torch.rand(2, 3, 4)}
    with pytest.raises(ValueError, match="detr.postprocess: orig_sizes must be"):
        postprocess_detections(outputs, torch.tensor([480, 640]))


IS_THING = {1: True, 2: True, 3: True, 5: False}


def panoptic_outputs() -> dict:
    """One padded 16x24 input (masks 4x6 at stride 4) whose image is 12x16: the last row and two
    columns of cells are padding. Each query's mask is +10 on its cells and -10 elsewhere."""
    cells = {
        0: (slice(0, 2), slice(0, 2)),  # thing 1
        1: (slice(0, 2), slice(2, 4)),  # stuff 5
        2: (slice(2, 3), slice(0, 4)),  # stuff 5 again: merged with query 1
        3: (slice(3, 4), slice(None)),  # thing 2 on the padding only (plus the next line)
    }
    masks = torch.full((1, 7, 4, 6), -10.0)
    for query, (rows, cols) in cells.items():
        masks[0, query, rows, cols] = 10.0
    masks[0, 3, :, 4:] = 10.0
    masks[0, 4:] = 20.0  # queries 4-6 would cover everything, were they kept
    logits = torch.zeros(1, 7, 9)  # categories 0..7, no-object 8
    for query, category in enumerate([1, 5, 5, 2]):
        logits[0, query, category] = 10.0
    logits[0, 4, 3] = 1.0  # below the threshold
    logits[0, 5, 8] = 10.0  # no-object
    logits[0, 6, 7] = 10.0  # not a category of the dataset
    return {"pred_logits": logits, "pred_masks": masks}


CONFIDENT = math.exp(10) / (math.exp(10) + 8)  # a query's probability with one logit 10 among 9 zeros


def test_panoptic_merges_stuff_crops_padding_and_resizes() -> None:
    (result,) = postprocess_panoptic(panoptic_outputs(), torch.tensor([[12, 16]]), torch.tensor([[24, 32]]), IS_THING)
    expected = torch.full((12, 16), 2)
    expected[:8, :8] = 1
    expected = expected.repeat_interleave(2, 0).repeat_interleave(2, 1)
    assert torch.equal(result["segment_ids"], expected)
    assert result["segments_info"] == [
        {"id": 1, "category_id": 1, "isthing": True, "area": 256, "score": pytest.approx(CONFIDENT)},
        {"id": 2, "category_id": 5, "isthing": False, "area": 512, "score": pytest.approx(CONFIDENT)},
    ]


def test_panoptic_drops_small_segments_and_reassigns_their_pixels() -> None:
    sizes = torch.tensor([[12, 16]])
    (result,) = postprocess_panoptic(panoptic_outputs(), sizes, sizes, IS_THING, min_area=64)
    assert torch.equal(result["segment_ids"], torch.ones(12, 16, dtype=torch.int64))
    assert result["segments_info"] == [
        {"id": 1, "category_id": 5, "isthing": False, "area": 192, "score": pytest.approx(CONFIDENT)}
    ]


def test_panoptic_without_confident_queries_is_void() -> None:
    outputs = panoptic_outputs()
    results = postprocess_panoptic(
        outputs, torch.tensor([[12, 16]]), torch.tensor([[30, 40]]), IS_THING, threshold=0.99995
    )
    assert torch.equal(results[0]["segment_ids"], torch.zeros(30, 40, dtype=torch.int64))
    assert results[0]["segments_info"] == []


def test_panoptic_bad_sizes_are_named() -> None:
    with pytest.raises(ValueError, match=r"detr\.postprocess: sizes must be \[B,2\]"):
        postprocess_panoptic(panoptic_outputs(), torch.tensor([12, 16]), torch.tensor([[24, 32]]), IS_THING)
    with pytest.raises(ValueError, match=r"detr\.postprocess: sizes \[20, 16\] exceed the padded input \[16, 24\]"):
        postprocess_panoptic(panoptic_outputs(), torch.tensor([[20, 16]]), torch.tensor([[24, 32]]), IS_THING)


def test_sigmoid_detections_match_transformers_deformable_detr() -> None:
    from types import SimpleNamespace

    from transformers import DeformableDetrImageProcessor

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 40, 5, generator=generator) * 3  # 200 (query, class) pairs per image, 100 kept
    boxes = 0.2 + 0.6 * torch.rand(2, 40, 4, generator=generator)
    orig_sizes = torch.tensor([[480, 640], [100, 50]])
    ours = postprocess_sigmoid_detections({"pred_logits": logits, "pred_boxes": boxes}, orig_sizes)
    reference = DeformableDetrImageProcessor().post_process_object_detection(
        SimpleNamespace(logits=logits, pred_boxes=boxes), threshold=0.0, target_sizes=orig_sizes, top_k=100
    )
    for mine, theirs in zip(ours, reference):
        assert len(mine["scores"]) == 100
        torch.testing.assert_close(mine["scores"], theirs["scores"])
        assert mine["labels"].tolist() == theirs["labels"].tolist()
        torch.testing.assert_close(mine["boxes"], theirs["boxes"])


def test_sigmoid_detections_nms_drops_same_class_duplicates_above_the_threshold_only() -> None:
    # Three boxes 10 pixels wide of class 1 starting at x = 10, 11, 12 (IoU 9/11 = 0.818 between
    # neighbours, 8/12 = 0.667 between the outer two), and the first box again in class 2.
    logits = torch.full((1, 4, 3), -20.0)
    logits[0, :3, 1] = torch.tensor([4.0, 3.0, 2.0])
    logits[0, 3, 2] = 1.0
    boxes = torch.tensor([[[0.15, 0.5, 0.1, 0.1], [0.16, 0.5, 0.1, 0.1], [0.17, 0.5, 0.1, 0.1], [0.15, 0.5, 0.1, 0.1]]])
    outputs, sizes = {"pred_logits": logits, "pred_boxes": boxes}, torch.tensor([[100, 100]])

    def kept(threshold: float | None, count: int = 4) -> list[tuple[int, float]]:
        found = postprocess_sigmoid_detections(outputs, sizes, num_detections=count, nms_threshold=threshold)[0]
        assert found["scores"].tolist() == sorted(found["scores"].tolist(), reverse=True)
        confident = found["scores"] > 0.01  # the (query, class) pairs of logit -20 are candidates too
        return [
            (int(label), round(float(box[0]), 3))
            for label, box in zip(found["labels"][confident], found["boxes"][confident])
        ]

    everything = [(1, 10.0), (1, 11.0), (1, 12.0), (2, 10.0)]
    assert kept(None) == everything
    assert kept(0.83) == everything  # no pair above 0.83
    assert kept(0.8) == [(1, 10.0), (1, 12.0), (2, 10.0)]  # 0.818 > 0.8: the box at 11 goes, 12 stays (0.667)
    assert kept(0.6) == [(1, 10.0), (2, 10.0)]  # 0.667 > 0.6 as well; the other class stays
    assert kept(0.6, count=1) == [(1, 10.0)]


def test_batch_detections_with_nms_are_each_images_alone_padded_after_the_kept_ones() -> None:
    """Two images with the same boxes (one image's box must not suppress the other's): the batch form (what export
    traces) gives each image's detections alone, then padding (score 0, label -1); ``postprocess`` cuts it off."""
    from vision_tx.heads.detr.postprocess import sigmoid_detections

    logits = torch.full((2, 3, 2), -20.0)
    logits[0, :, 0] = torch.tensor([4.0, 3.0, -1.0])  # image 0: queries 0 and 1 overlap in class 0
    logits[1, :, 0] = torch.tensor([2.0, -3.0, 5.0])  # image 1: the same boxes, other scores
    boxes = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.31, 0.3, 0.2, 0.2], [0.7, 0.7, 0.2, 0.2]]).expand(2, 3, 4)
    outputs, sizes = {"pred_logits": logits, "pred_boxes": boxes}, torch.tensor([[50, 80], [50, 80]])  # the same pixels
    batch = sigmoid_detections(outputs, sizes, num_detections=6, nms_threshold=0.5)
    for image in range(2):
        alone = {key: value[image : image + 1] for key, value in outputs.items()}
        (expected,) = postprocess_sigmoid_detections(
            alone, sizes[image : image + 1], num_detections=6, nms_threshold=0.5
        )
        count = len(expected["scores"])
        assert count == 4  # one of the two overlapping class-0 boxes suppressed (the worse), both class-1 copies too
        assert batch["labels"][image, :count].tolist() == expected["labels"].tolist()
        assert (batch["labels"][image, count:] == -1).all() and (batch["scores"][image, count:] == 0).all()
        torch.testing.assert_close(batch["boxes"][image, :count], expected["boxes"])
    found = postprocess_sigmoid_detections(outputs, sizes, num_detections=6, nms_threshold=0.5)
    assert [d["labels"].tolist() for d in found] == [[0, 0, 1, 1], [0, 0, 1, 1]]
    assert found[1]["scores"][0] == torch.tensor(5.0).sigmoid()
    # in pixels (h 50, w 80)
    torch.testing.assert_close(found[1]["boxes"][0], torch.tensor([48.0, 30.0, 64.0, 40.0]))


def test_shared_scores_are_each_class_probability_times_its_share_of_the_query() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 30, 4, generator=generator) * 3
    boxes = 0.2 + 0.6 * torch.rand(2, 30, 4, generator=generator)
    outputs, sizes = {"pred_logits": logits, "pred_boxes": boxes}, torch.tensor([[60, 80], [90, 40]])
    found = postprocess_sigmoid_detections(outputs, sizes, num_detections=50, share_scores=True)
    per_query = postprocess_sigmoid_per_query(outputs, sizes, share_scores=True)
    for image in range(2):
        # Brute force: every (query, class) pair's score written out one at a time, then the best 50.
        pairs = []
        for query in range(30):
            probabilities = [1 / (1 + math.exp(-float(logit))) for logit in logits[image, query]]
            for label, probability in enumerate(probabilities):
                pairs.append((probability * probability / sum(probabilities), query, label))
        pairs.sort(reverse=True)
        expected = torch.tensor([score for score, _, _ in pairs[:50]])
        torch.testing.assert_close(found[image]["scores"], expected.to(found[image]["scores"]))
        assert found[image]["labels"].tolist() == [label for _, _, label in pairs[:50]]
        best = [max((s, label) for s, q, label in pairs if q == query) for query in range(30)]
        torch.testing.assert_close(
            per_query[image]["scores"], torch.tensor([s for s, _ in best]).to(per_query[image]["scores"])
        )
        assert per_query[image]["labels"].tolist() == [label for _, label in best]


def test_shared_scores_keep_a_confident_query_and_lower_a_torn_one() -> None:
    # Query 0 is sure of class 0 (0.9 against 0.01); query 1 is torn between classes 0 and 1 (0.9 and 0.8).
    probabilities = torch.tensor([[[0.9, 0.01], [0.9, 0.8]]])
    logits = torch.log(probabilities / (1 - probabilities))
    outputs = {"pred_logits": logits, "pred_boxes": torch.full((1, 2, 4), 0.5)}
    plain = postprocess_sigmoid_detections(outputs, torch.tensor([[10, 10]]), num_detections=4)[0]
    shared = postprocess_sigmoid_detections(outputs, torch.tensor([[10, 10]]), num_detections=4, share_scores=True)[0]
    torch.testing.assert_close(plain["scores"], torch.tensor([0.9, 0.9, 0.8, 0.01]))
    torch.testing.assert_close(
        shared["scores"], torch.tensor([0.9 * 0.9 / 0.91, 0.9 * 0.9 / 1.7, 0.8 * 0.8 / 1.7, 0.01 * 0.01 / 0.91])
    )
