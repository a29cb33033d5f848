"""Panoptic quality: ground truth against itself, hand-worked edits, torchmetrics parity, DDP gathering."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torchmetrics.detection import PanopticQuality

from vision_tx.data.coco_panoptic import read_panoptic_png, write_panoptic_predictions
from vision_tx.metrics.panoptic import PanopticEvaluator, evaluate_panoptic_files

Image = tuple[int, torch.Tensor, list[dict[str, Any]]]  # (image id, segment ids [H, W], segments_info)

# The panopticapi sample's categories: things person 1, truck 8, horse 19, sports ball 37 and
# stuff gravel 125, tree 184, sky 187, grass 193. Non-crowd segments: 26 persons (13 + 13),
# 2 trucks, 11 horses, 1 sports ball, 2 trees, 2 skies, 2 grasses, 1 gravel; crowds: 2 of
# persons (one per image), 1 of horses (image 439180).
PERSON, TRUCK, HORSE, BALL, CAR = 1, 8, 19, 37, 3


def _load(json_file: Path, png_dir: Path) -> tuple[list[dict[str, Any]], list[Image]]:
    raw = json.loads(json_file.read_text())
    images = [
        (a["image_id"], read_panoptic_png(png_dir / a["file_name"]), a["segments_info"]) for a in raw["annotations"]
    ]
    return raw["categories"], images


@pytest.fixture(scope="module")
def sample(shared_data: Path) -> tuple[list[dict[str, Any]], list[Image]]:
    base = shared_data / "panoptic_sample"
    return _load(base / "panoptic_examples.json", base / "panoptic_examples")


def _score(
    categories: list[dict[str, Any]], gt: list[Image], pred: list[Image]
) -> tuple[dict[str, float], PanopticEvaluator]:
    evaluator = PanopticEvaluator(categories)
    for (image_id, gt_ids, gt_segments), (_, pred_ids, pred_segments) in zip(gt, pred):
        evaluator.update(image_id, gt_ids, gt_segments, pred_ids, pred_segments)
    return evaluator.compute(), evaluator


def _segment(image: Image, segment_id: int) -> dict[str, Any]:
    return next(s for s in image[2] if s["id"] == segment_id)


def test_sample_facts_used_below(sample: tuple[list[dict[str, Any]], list[Image]]) -> None:
    _, images = sample
    segments = [s for _, _, infos in images for s in infos]

    def count(category: int, crowd: int) -> int:
        return sum(s["category_id"] == category and s["iscrowd"] == crowd for s in segments)

    assert [count(c, 0) for c in (PERSON, TRUCK, HORSE, BALL, 125, 184, 187, 193)] == [26, 2, 11, 1, 1, 2, 2, 2]
    assert [count(c, 1) for c in (PERSON, HORSE)] == [2, 1] and len(segments) == 50
    assert not any(s["category_id"] == CAR for s in segments)


def test_ground_truth_against_itself_is_perfect(shared_data: Path, tmp_path: Path) -> None:
    sources = (
        (shared_data / "panoptic_sample", "panoptic_examples"),
        (shared_data / "coco128" / "annotations", "panoptic_train2017"),
    )
    for base, name in sources:
        json_file, png_dir = base / f"{name}.json", base / name
        # Crowd segments are in the "prediction" too: each lies on its own crowd region, so it is no false positive.
        results = evaluate_panoptic_files(json_file, png_dir, json_file, png_dir, tmp_path / "metrics.json")
        assert results == {key: 1.0 for key in ("PQ", "SQ", "RQ", "PQ_th", "SQ_th", "RQ_th", "PQ_st", "SQ_st", "RQ_st")}
        written = json.loads((tmp_path / "metrics.json").read_text())["panoptic"]
        per_category = written.pop("per_category")
        assert per_category and all(row["PQ"] == 1.0 for row in per_category)
        assert written == results


def test_removed_segment(sample: tuple[list[dict[str, Any]], list[Image]]) -> None:
    categories, gt = sample
    pred = copy.deepcopy(gt)
    image_id, ids, segments = pred[0]
    ids[ids == 3937500] = 0  # a person of image 142238 becomes unlabelled
    pred[0] = (image_id, ids, [s for s in segments if s["id"] != 3937500])
    results, evaluator = _score(categories, gt, pred)
    # person: TP 25 (IoU 1 each), FN 1 -> PQ = RQ = 25 / (25 + 0.5), SQ = 1; the 7 other categories are perfect.
    person = 25 / 25.5
    assert evaluator.per_class()[PERSON]["FN"] == 1
    assert results["PQ"] == pytest.approx((7 + person) / 8)
    assert results["RQ"] == pytest.approx((7 + person) / 8)
    assert results["SQ"] == pytest.approx(1.0)
    assert results["PQ_th"] == pytest.approx((3 + person) / 4)
    assert results["PQ_st"] == 1.0


def test_split_segment(sample: tuple[list[dict[str, Any]], list[Image]]) -> None:
    categories, gt = sample
    pred = copy.deepcopy(gt)
    image_id, ids, segments = pred[0]
    person = ids == 3937500  # 3528 pixels, columns 282..329
    right = person & (torch.arange(ids.shape[1]) >= 316)
    ids[right] = 77  # the right part becomes a second person
    pred[0] = (image_id, ids, segments + [{"id": 77, "category_id": PERSON}])
    kept = int((person & ~right).sum()) / int(person.sum())
    assert 0.5 < kept < 1
    results, evaluator = _score(categories, gt, pred)
    # The left part still matches (IoU = kept > 0.5); the right part is a false positive:
    # person TP 26 with IoU sum 25 + kept, FP 1 -> PQ = (25 + kept) / (26 + 0.5), SQ = (25 + kept) / 26, RQ = 26 / 26.5.
    row = evaluator.per_class()[PERSON]
    assert (row["TP"], row["FP"], row["FN"]) == (26, 1, 0)
    assert row["PQ"] == pytest.approx((25 + kept) / 26.5)
    assert row["SQ"] == pytest.approx((25 + kept) / 26)
    assert row["RQ"] == pytest.approx(26 / 26.5)
    assert results["PQ"] == pytest.approx((7 + (25 + kept) / 26.5) / 8)
    assert results["SQ_th"] == pytest.approx((3 + (25 + kept) / 26) / 4)


def test_changed_class(sample: tuple[list[dict[str, Any]], list[Image]]) -> None:
    categories, gt = sample
    pred = copy.deepcopy(gt)
    _segment(pred[1], 4587520)["category_id"] = CAR  # a truck of image 439180 predicted as a car
    results, _ = _score(categories, gt, pred)
    # truck: TP 1, FN 1 -> PQ = RQ = 1 / 1.5, SQ = 1. car (in no ground truth): FP 1 -> PQ = SQ = RQ = 0,
    # and it now counts among the categories: 9 in all, 5 things.
    assert results["PQ"] == pytest.approx((7 + 1 / 1.5 + 0) / 9)
    assert results["SQ"] == pytest.approx((8 + 0) / 9)
    assert results["RQ"] == pytest.approx((7 + 1 / 1.5 + 0) / 9)
    assert results["PQ_th"] == pytest.approx((3 + 1 / 1.5 + 0) / 5)
    assert results["PQ_st"] == 1.0


def test_crowd_regions(sample: tuple[list[dict[str, Any]], list[Image]]) -> None:
    categories, gt = sample
    crowd_person = 5120499  # image 439180's crowd of persons, 7839 pixels
    # A person predicted over the crowd of persons (the crowd's own pixels): no match, and no false
    # positive, as all of it lies on a crowd region of its category.
    results, _ = _score(categories, gt, copy.deepcopy(gt))
    assert results["PQ"] == 1.0
    # The same segment predicted as a horse: the crowd of horses lies elsewhere, so it is a false
    # positive: horse TP 11, FP 1 -> PQ = RQ = 11 / 11.5.
    pred = copy.deepcopy(gt)
    _segment(pred[1], crowd_person)["category_id"] = HORSE
    results, evaluator = _score(categories, gt, pred)
    assert evaluator.per_class()[HORSE]["FP"] == 1
    assert results["PQ"] == pytest.approx((7 + 11 / 11.5) / 8)
    # A person predicted over the crowd and over as many pixels of grass again plus one: more than
    # half of it is not crowd, so it is a false positive (and the grass loses those pixels).
    pred = copy.deepcopy(gt)
    image_id, ids, segments = pred[1]
    crowd = gt[1][1] == crowd_person
    grass = torch.nonzero((gt[1][1] == 10025880).flatten()).squeeze(1)[: int(crowd.sum()) + 1]
    ids.view(-1)[grass] = crowd_person
    results, evaluator = _score(categories, gt, pred)
    grass_area = int((gt[1][1] == 10025880).sum())
    grass_iou = (grass_area - len(grass)) / grass_area
    assert grass_iou > 0.5
    # person: TP 26, FP 1 -> 26 / 26.5; grass: TP 2 with IoU sum 1 + grass_iou -> PQ = (1 + grass_iou) / 2.
    assert evaluator.per_class()[PERSON]["FP"] == 1
    assert results["PQ"] == pytest.approx((6 + 26 / 26.5 + (1 + grass_iou) / 2) / 8)


def test_void_pixels_leave_the_union(sample: tuple[list[dict[str, Any]], list[Image]]) -> None:
    categories, gt = sample
    pred = copy.deepcopy(gt)
    image_id, ids, segments = pred[1]
    void = gt[1][1] == 0
    person = gt[1][1] == 3937500
    assert int(void.sum()) == 7189 and int(person.sum()) == 3512
    # The person also takes every unlabelled pixel: IoU = 3512 / (3512 + 7189 - 7189 on void) = 1,
    # not 3512 / 10701 < 0.5 as it would be if unlabelled pixels counted.
    ids[void] = 3937500
    results, _ = _score(categories, gt, pred)
    assert results["PQ"] == 1.0
    # A new segment lying wholly on unlabelled pixels is no false positive either.
    ids[void] = 0
    ids[void & (torch.arange(ids.shape[0])[:, None] < 200)] = 88
    pred[1] = (image_id, ids, segments + [{"id": 88, "category_id": BALL}])
    results, _ = _score(categories, gt, pred)
    assert results["PQ"] == 1.0


def _random_scene(generator: torch.Generator, size: int = 48) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """Segment ids ``[H, W]`` and segments: stuff 4 and 5 above and below a random row, and 0-4
    overlapping rectangles of thing categories 1-3."""
    ids = torch.ones(size, size, dtype=torch.int64)
    split = int(torch.randint(size // 4, 3 * size // 4, (), generator=generator))
    ids[split:] = 2
    segments = [{"id": 1, "category_id": 4}, {"id": 2, "category_id": 5}]
    for k in range(int(torch.randint(0, 5, (), generator=generator))):
        y, x = torch.randint(0, size - 8, (2,), generator=generator).tolist()
        h, w = torch.randint(6, size // 2, (2,), generator=generator).tolist()
        ids[y : y + h, x : x + w] = 10 + k
        segments.append({"id": 10 + k, "category_id": int(torch.randint(1, 4, (), generator=generator))})
    return ids, segments


def _torchmetrics_map(ids: torch.Tensor, segments: list[dict[str, Any]]) -> torch.Tensor:
    """``[H, W, 2]`` (category, instance) as torchmetrics expects; category 0 (unknown) is void."""
    category = torch.zeros_like(ids)
    for s in segments:
        category[ids == s["id"]] = s["category_id"]
    return torch.stack([category, torch.where(category <= 3, ids, 0)], dim=-1)


def test_agrees_with_torchmetrics_on_random_scenes() -> None:
    # Where both definitions coincide: no crowd, no unlabelled prediction pixels (torchmetrics also
    # drops a prediction's void from the union and forgives ground truth mostly void in the
    # prediction), one segment per stuff category (torchmetrics merges stuff instances).
    generator = torch.Generator().manual_seed(0)
    categories = [{"id": i, "name": str(i), "isthing": int(i <= 3)} for i in range(1, 6)]
    evaluator = PanopticEvaluator(categories)
    reference = PanopticQuality(things={1, 2, 3}, stuffs={4, 5}, return_sq_and_rq=True, return_per_class=True)
    mean_reference = PanopticQuality(things={1, 2, 3}, stuffs={4, 5}, return_sq_and_rq=True)
    for image_id in range(40):
        gt_ids, gt_segments = _random_scene(generator)
        for _ in range(int(torch.randint(0, 3, (), generator=generator))):
            y, x = torch.randint(0, 40, (2,), generator=generator).tolist()
            gt_ids[y : y + 8, x : x + 8] = 0
        gt_segments = [s for s in gt_segments if (gt_ids == s["id"]).any()]
        if image_id % 4 == 0:
            pred_ids, pred_segments = gt_ids.clone(), copy.deepcopy(gt_segments)
            pred_ids[pred_ids == 0] = 1
        else:  # an unrelated scene: some matches, many misses
            pred_ids, pred_segments = _random_scene(generator)
        pred_segments = [s for s in pred_segments if (pred_ids == s["id"]).any()]
        evaluator.update(image_id, gt_ids, gt_segments, pred_ids, pred_segments)
        preds, target = _torchmetrics_map(pred_ids, pred_segments)[None], _torchmetrics_map(gt_ids, gt_segments)[None]
        reference.update(preds, target)
        mean_reference.update(preds, target)
    per_class = evaluator.per_class()
    expected = reference.compute()  # [5, 3]: PQ, SQ, RQ of categories 1..5 (float32 in places)
    for category in range(1, 6):
        row = per_class[category]
        assert [row["PQ"], row["SQ"], row["RQ"]] == pytest.approx(expected[category - 1].tolist(), abs=1e-6)
    results = evaluator.compute()
    assert [results["PQ"], results["SQ"], results["RQ"]] == pytest.approx(mean_reference.compute().tolist(), abs=1e-6)
    assert 0.2 < results["PQ"] < 0.8  # neither trivial nor hopeless


def test_errors_name_the_image_and_segment(
    sample: tuple[list[dict[str, Any]], list[Image]], shared_data: Path, tmp_path: Path
) -> None:
    categories, gt = sample
    image_id, ids, segments = gt[0]
    evaluator = PanopticEvaluator(categories)
    prefix = r"image id 142238 \(prediction\): "
    with pytest.raises(ValueError, match=prefix + r"segment id\(s\) \[3937500\] are not in its segments_info"):
        evaluator.update(image_id, ids, segments, ids, segments[1:])
    with pytest.raises(ValueError, match=prefix + r"segment id\(s\) \[5\] of its segments_info cover no pixel"):
        evaluator.update(image_id, ids, segments, ids, segments + [{"id": 5, "category_id": 1}])
    with pytest.raises(ValueError, match=prefix + r"unknown category id\(s\) \[999\]"):
        evaluator.update(image_id, ids, segments, ids, segments[:-1] + [{"id": segments[-1]["id"], "category_id": 999}])
    with pytest.raises(ValueError, match=r"image id 142238: prediction map \(427, 639\) and ground truth \(427, 640\)"):
        evaluator.update(image_id, ids, segments, ids[:, 1:], segments)
    pred_json, pred_dir = tmp_path / "pred.json", tmp_path / "pred"
    only_first = [{"image_id": image_id, "segment_ids": ids, "segments_info": segments}]
    write_panoptic_predictions(pred_json, pred_dir, only_first, categories)
    base = shared_data / "panoptic_sample"
    with pytest.raises(ValueError, match=r"pred\.json: no prediction for image id 439180"):
        evaluate_panoptic_files(base / "panoptic_examples.json", base / "panoptic_examples", pred_json, pred_dir)


def _edited(images: list[Image]) -> list[Image]:
    """Each image without its first segment (unlabelled instead), so that PQ is below 1."""
    edited = []
    for image_id, ids, segments in images:
        ids = ids.clone()
        ids[ids == segments[0]["id"]] = 0
        edited.append((image_id, ids, segments[1:]))
    return edited


def _coco128(shared_data: Path, count: int = 12) -> tuple[list[dict[str, Any]], list[Image]]:
    base = shared_data / "coco128" / "annotations"
    categories, gt = _load(base / "panoptic_train2017.json", base / "panoptic_train2017")
    return categories, gt[:count]


def _ddp_worker(rank: int, world: int, store: str, shared_data: Path, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    categories, gt = _coco128(shared_data)
    half = len(gt) // 2
    # Rank 0 scores the first half plus the first image of rank 1's half, as DistributedSampler pads.
    shard = range(0, half + 1) if rank == 0 else range(half, len(gt))
    pred = _edited(gt)
    evaluator = PanopticEvaluator(categories)
    for i in shard:
        evaluator.update(gt[i][0], gt[i][1], gt[i][2], pred[i][1], pred[i][2])
    results = evaluator.compute()
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def test_two_processes_give_the_single_process_result(shared_data: Path, tmp_path: Path) -> None:
    categories, gt = _coco128(shared_data)
    expected, _ = _score(categories, gt, _edited(gt))
    assert expected["PQ"] < 1
    out = tmp_path / "results.json"
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "store"), shared_data, str(out)), nprocs=2, join=True)
    assert json.loads(out.read_text()) == pytest.approx(expected, abs=1e-12)
