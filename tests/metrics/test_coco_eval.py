"""COCO evaluation against pycocotools' official numbers on the cocoapi fake results."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from vision_tx.data.coco import load_coco
from vision_tx.metrics.coco import STAT_NAMES, CocoEvaluator, evaluate_results_file

# E.stats listed in ../shared/data/README.md (pycocotools on the official cocoapi fake results).
FIXTURE_STATS = {
    "bbox": [
        0.5045806987249628,
        0.6969727247299577,
        0.5729816669904824,
        0.5856257209410443,
        0.5193996948036719,
        0.5013978986347466,
        0.38681277964578054,
        0.5936795762842003,
        0.595352982877607,
        0.6398109626113442,
        0.5664205978994309,
        0.5642905982905982,
    ],
    "segm": [
        0.3195452758576433,
        0.5622883972521636,
        0.29892653412086784,
        0.3873740315997838,
        0.31018272403369485,
        0.3269339071005138,
        0.2682297225711534,
        0.41544868114906375,
        0.4168394992198818,
        0.4694498622754236,
        0.37675922666197265,
        0.3814715099715099,
    ],
}
RESULT_FILES = {
    "bbox": "instances_val2014_fakebbox100_results.json",
    "segm": "instances_val2014_fakesegm100_results.json",
}


@pytest.fixture(scope="module")
def parity(shared_data: Path) -> Path:
    return shared_data / "coco_eval_parity"


def _pycocotools_stats(gt_json: Path, results_json: Path, iou_type: str) -> list[float]:
    gt = COCO(str(gt_json))
    evaluator = COCOeval(gt, gt.loadRes(str(results_json)), iou_type)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return [float(v) for v in evaluator.stats]


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_results_file_gives_pycocotools_numbers(parity: Path, iou_type: str, capsys: pytest.CaptureFixture) -> None:
    gt_json, results_json = parity / "instances_val2014_100.json", parity / RESULT_FILES[iou_type]
    stats = evaluate_results_file(gt_json, results_json, iou_type=iou_type)
    assert "Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]" in capsys.readouterr().out
    assert stats.pop("per_category")  # checked below
    assert list(stats) == list(STAT_NAMES)
    # Bit for bit what pycocotools itself gives here...
    assert list(stats.values()) == _pycocotools_stats(gt_json, results_json, iou_type)
    # ...and the fixture's numbers, every digit, except segm APs: this pycocotools/numpy build
    # gives ...837 where the fixture has ...838 (2 ulp: floating-point summation order), so that
    # one stat alone is compared to 1e-15.
    for name, got, expected in zip(STAT_NAMES, stats.values(), FIXTURE_STATS[iou_type]):
        if (iou_type, name) == ("segm", "APs"):
            assert math.isclose(got, expected, rel_tol=1e-15, abs_tol=0.0), (name, got, expected)
        else:
            assert got == expected, (name, got, expected)


def _pycocotools_per_category(gt_json: Path, results_json: Path, iou_type: str) -> dict[int, list[float]]:
    """Per category, the means of pycocotools' precision array ``[T, R, K, A, M]`` over its entries
    above -1, at maxDets 100: AP (all IoUs), AP50, AP75 (area all), APs, APm, APl (all IoUs)."""
    gt = COCO(str(gt_json))
    evaluator = COCOeval(gt, gt.loadRes(str(results_json)), iou_type)
    evaluator.evaluate()
    evaluator.accumulate()
    precision = evaluator.eval["precision"]
    assert list(evaluator.params.iouThrs[[0, 5]]) == [0.5, 0.75] and evaluator.params.areaRngLbl == [
        "all",
        "small",
        "medium",
        "large",
    ]

    def mean(values: np.ndarray) -> float | None:
        return float(values[values > -1].mean()) if (values > -1).any() else None

    return {
        category: [
            mean(precision[:, :, k, 0, 2]),
            mean(precision[0, :, k, 0, 2]),
            mean(precision[5, :, k, 0, 2]),
            mean(precision[:, :, k, 1, 2]),
            mean(precision[:, :, k, 2, 2]),
            mean(precision[:, :, k, 3, 2]),
        ]
        for k, category in enumerate(evaluator.params.catIds)
    }


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_per_category_ap_is_pycocotools_precision_per_category(
    parity: Path, iou_type: str, capsys: pytest.CaptureFixture
) -> None:
    gt_json, results_json = parity / "instances_val2014_100.json", parity / RESULT_FILES[iou_type]
    rows = evaluate_results_file(gt_json, results_json, iou_type=iou_type)["per_category"]
    printed = capsys.readouterr().out
    expected = _pycocotools_per_category(gt_json, results_json, iou_type)
    names = {c["id"]: c["name"] for c in json.loads(gt_json.read_text())["categories"]}
    assert [row["id"] for row in rows] == list(expected) and len(rows) == 80
    for row in rows:
        assert row["name"] == names[row["id"]]
        assert [row[k] for k in ("AP", "AP50", "AP75", "APs", "APm", "APl")] == expected[row["id"]], row["name"]
    # Categories without ground truth in these 100 images have no AP (None), not 0.
    scored = [row for row in rows if row["AP"] is not None]
    assert 0 < len(scored) < 80 and any(row["APs"] is None for row in scored)
    # One category evaluated alone gives its row as COCOeval's own summary (independent of the slicing).
    for row in (min(scored, key=lambda r: r["AP"]), max(scored, key=lambda r: r["AP"])):
        gt = COCO(str(gt_json))
        alone = COCOeval(gt, gt.loadRes(str(results_json)), iou_type)
        alone.params.catIds = [row["id"]]
        alone.evaluate()
        alone.accumulate()
        alone.summarize()
        assert [row[k] for k in ("AP", "AP50", "AP75")] == pytest.approx(alone.stats[:3].tolist(), abs=1e-12)
    # The printed table: the ten of lowest AP, lowest first.
    table = printed[printed.index(f"{iou_type} AP per category") :].splitlines()
    lowest = sorted(scored, key=lambda r: r["AP"])[:10]
    assert table[0] == f"{iou_type} AP per category: the 10 lowest AP of 80 categories (all in metrics.json)"
    assert [line.split()[0] for line in table[2:12]] == [row["name"].split()[0] for row in lowest]
    assert table[2].split()[-6:] == [
        f"{100 * v:.1f}" if v is not None else "-"
        for v in (lowest[0][k] for k in ("AP", "AP50", "AP75", "APs", "APm", "APl"))
    ]


def _predictions(parity: Path, iou_type: str) -> tuple[COCO, list[dict]]:
    """The fake results as per-image predictions (boxes xyxy, or masks), one per ground-truth image."""
    gt = load_coco(parity / "instances_val2014_100.json")
    by_image: dict[int, list[dict]] = {image_id: [] for image_id in gt.getImgIds()}
    for result in json.loads((parity / RESULT_FILES[iou_type]).read_text()):
        by_image[result["image_id"]].append(result)
    predictions = []
    for image_id, results in by_image.items():
        prediction = {
            "image_id": image_id,
            "scores": torch.tensor([r["score"] for r in results], dtype=torch.float64),
            "labels": torch.tensor([r["category_id"] for r in results], dtype=torch.int64),
        }
        if iou_type == "bbox":
            prediction["boxes"] = torch.tensor(
                [[x, y, x + w, y + h] for x, y, w, h in (r["bbox"] for r in results)], dtype=torch.float64
            ).reshape(-1, 4)
        else:
            info = gt.imgs[image_id]
            masks = [mask_utils.decode(r["segmentation"]) for r in results]
            prediction["masks"] = (
                torch.from_numpy(np.stack(masks)).bool()
                if masks
                else torch.zeros(0, info["height"], info["width"], dtype=torch.bool)
            )
        predictions.append(prediction)
    return gt, predictions


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # inside pycocotools' decode
@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_update_in_shuffled_duplicated_chunks_matches_file(parity: Path, iou_type: str, tmp_path: Path) -> None:
    gt, predictions = _predictions(parity, iou_type)
    chunks = predictions + random.Random(0).sample(predictions, 10)  # repeats, as a padded sampler gives
    random.Random(1).shuffle(chunks)
    evaluator = CocoEvaluator(gt, iou_type=iou_type)
    for start in range(0, len(chunks), 7):
        evaluator.update(chunks[start : start + 7])
    stats = evaluator.compute()
    assert list(stats.values()) == _pycocotools_stats(
        parity / "instances_val2014_100.json", parity / RESULT_FILES[iou_type], iou_type
    )

    results_json = evaluator.write_results(tmp_path / "results.json")
    assert evaluate_results_file(parity / "instances_val2014_100.json", results_json, iou_type) == {
        **stats,
        "per_category": evaluator.per_category,
    }
    evaluator.write_metrics(stats, tmp_path / "metrics.json")
    assert json.loads((tmp_path / "metrics.json").read_text()) == {
        iou_type: {**stats, "per_category": evaluator.per_category}
    }


def test_only_seen_images_are_evaluated(parity: Path) -> None:
    gt, predictions = _predictions(parity, "bbox")
    evaluator = CocoEvaluator(gt)
    evaluator.update(predictions[:40])
    stats = evaluator.compute()
    reference = COCOeval(gt, gt.loadRes(evaluator.merged_results), "bbox")
    reference.params.imgIds = sorted(p["image_id"] for p in predictions[:40])
    reference.evaluate()
    reference.accumulate()
    reference.summarize()
    assert list(stats.values()) == [float(v) for v in reference.stats]


def test_empty_predictions_warn_and_score_zero(parity: Path) -> None:
    gt, predictions = _predictions(parity, "bbox")
    evaluator = CocoEvaluator(gt)
    evaluator.update(
        [{**p, "boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0)} for p in predictions]
    )
    with pytest.warns(UserWarning, match="empty prediction set"):
        stats = evaluator.compute()
    assert set(stats.values()) == {0.0}  # every area range has ground truth in these images
    with pytest.warns(UserWarning, match="empty prediction set"):
        assert set(CocoEvaluator(gt).compute().values()) == {-1.0}  # no image seen: no ground truth either


def _distributed_worker(rank: int, world_size: int, init_file: str, parity: Path, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        gt, predictions = _predictions(parity, "bbox")
        shard = predictions[rank::world_size] + [predictions[0]]  # the last sample repeated, as a padded sampler does
        evaluator = CocoEvaluator(gt)
        evaluator.update(shard)
        stats = evaluator.compute()
        (out / f"rank{rank}.json").write_text(json.dumps(stats))
    finally:
        dist.destroy_process_group()


def test_two_process_gloo_matches_one_process(parity: Path, tmp_path: Path) -> None:
    # fork rather than spawn: the workers need not import torch again (the test is about the gathering)
    mp.start_processes(
        _distributed_worker, args=(2, str(tmp_path / "init"), parity, tmp_path), nprocs=2, start_method="fork"
    )
    expected = _pycocotools_stats(parity / "instances_val2014_100.json", parity / RESULT_FILES["bbox"], "bbox")
    for rank in range(2):
        assert list(json.loads((tmp_path / f"rank{rank}.json").read_text()).values()) == expected
