"""scripts/compare_detection.py's COCO <-> YOLO conversion loses nothing: the ground truth written as
YOLO labels and read back as predictions scores AP 1.0 with pycocotools. Needs no Ultralytics."""

from __future__ import annotations

import io
import json
import runpy
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@contextmanager
def without_ultralytics() -> Iterator[None]:
    """Imports of ultralytics fail inside this context, as where it is not installed."""
    saved = sys.modules.get("ultralytics")
    sys.modules["ultralytics"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if saved is None:
            del sys.modules["ultralytics"]
        else:
            sys.modules["ultralytics"] = saved


@pytest.fixture(scope="module")
def script() -> dict[str, Any]:
    sys.path.insert(0, str(SCRIPTS))  # the script imports compare_common from beside it
    try:
        with without_ultralytics():
            return runpy.run_path(str(SCRIPTS / "compare_detection.py"))
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def converted(script: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A held-out shapes set (sparse category ids 4, 11, 23, 30; crowds; empty images) and its YOLO form."""
    shapes = runpy.run_path(str(SCRIPTS / "make_shapes_dataset.py"))
    root = tmp_path_factory.mktemp("shapes") / "set"
    shapes["make_dataset"](
        shapes["parser"]().parse_args(
            [
                str(root),
                "--num-train",
                "12",
                "--num-val",
                "8",
                "--kinds",
                "4",
                "--min-side",
                "64",
                "--max-side",
                "112",
                "--empty",
                "0.25",
                "--crowd",
                "0.5",
                "--seed",
                "3",
            ]
        )
    )
    for annotation_file in (root / "annotations").glob("*.json"):  # categories listed in no particular order
        dataset = json.loads(annotation_file.read_text())
        annotation_file.write_text(json.dumps({**dataset, "categories": dataset["categories"][::-1]}))
    yolo_root = root.parent / "yolo"
    with without_ultralytics():
        script["write_yolo_dataset"](root, yolo_root)
    return root, yolo_root


def pycocotools_stats(gt_file: Path, results: list[dict[str, Any]]) -> np.ndarray:
    with redirect_stdout(io.StringIO()):
        gt = COCO(str(gt_file))
        evaluation = COCOeval(gt, gt.loadRes(results), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats


@pytest.mark.parametrize("split", ["train", "val"])
def test_ground_truth_through_yolo_labels_scores_ap_1(
    script: dict[str, Any], converted: tuple[Path, Path], split: str
) -> None:
    root, yolo_root = converted
    gt_file = root / "annotations" / f"instances_{script['SPLITS'][split]}.json"
    with without_ultralytics():
        results = script["labels_as_results"](root, yolo_root, split)
    stats = pycocotools_stats(gt_file, results)
    assert stats[0] == 1.0 and stats[1] == 1.0 and stats[8] == 1.0  # AP, AP50, AR@100
    solid = [a for a in json.loads(gt_file.read_text())["annotations"] if not a["iscrowd"]]
    truth = sorted((a["image_id"], a["category_id"], *a["bbox"]) for a in solid)
    back = sorted((r["image_id"], r["category_id"], *r["bbox"]) for r in results)
    assert [t[:2] for t in truth] == [b[:2] for b in back]
    np.testing.assert_allclose([b[2:] for b in back], [t[2:] for t in truth], rtol=0, atol=1e-6)  # measured 2e-8 px


def test_labels_are_contiguous_classes_without_crowds_and_empty_files_for_empty_images(
    script: dict[str, Any], converted: tuple[Path, Path]
) -> None:
    root, yolo_root = converted
    import yaml

    data = yaml.safe_load((yolo_root / "data.yaml").read_text())
    assert data["names"] == {0: "ellipse", 1: "cross", 2: "star", 3: "hexagon"}  # category ids 4, 11, 23, 30
    crowds = empties = 0
    for split, folder in script["SPLITS"].items():
        dataset = json.loads((root / "annotations" / f"instances_{folder}.json").read_text())
        for image in dataset["images"]:
            anns = [a for a in dataset["annotations"] if a["image_id"] == image["id"]]
            label = yolo_root / "labels" / split / f"{Path(image['file_name']).stem}.txt"
            lines = label.read_text().splitlines()
            assert (yolo_root / "images" / split / image["file_name"]).read_bytes() == (
                root / folder / image["file_name"]
            ).read_bytes()
            assert sorted(int(line.split()[0]) for line in lines) == sorted(
                [4, 11, 23, 30].index(a["category_id"]) for a in anns if not a["iscrowd"]
            )
            crowds += sum(a["iscrowd"] for a in anns)
            empties += not anns
    assert crowds > 0 and empties > 0


def test_the_scripts_check_fails_on_a_label_off_by_a_pixel(
    script: dict[str, Any], converted: tuple[Path, Path], tmp_path: Path
) -> None:
    root, yolo_root = converted
    with without_ultralytics():
        assert max(script["check_round_trip"](root, yolo_root).values()) < 1e-6
    import shutil

    broken = tmp_path / "yolo"
    shutil.copytree(yolo_root, broken)
    label = next(p for p in sorted((broken / "labels" / "val").glob("*.txt")) if p.read_text())
    image = json.loads((root / "annotations" / "instances_val2017.json").read_text())["images"]
    width = next(i["width"] for i in image if Path(i["file_name"]).stem == label.stem)
    cls, cx, *rest = label.read_text().splitlines()[0].split()
    label.write_text(
        " ".join([cls, f"{float(cx) + 1 / width:.10f}", *rest])
        + "\n"
        + "".join(f"{line}\n" for line in label.read_text().splitlines()[1:])
    )
    with pytest.raises(SystemExit, match="need AP 1.0"):
        script["check_round_trip"](root, broken)


def test_boxes_of_a_class_sharing_a_coordinate_are_paired_by_position_not_by_order(script: dict[str, Any]) -> None:
    # Two stars of one image at x = 50 (as in make_shapes_dataset.py --seed 7 --kinds 5): read back at 50 + 1e-9
    # and 50 - 1e-9, sorting would pair each with the other and report their 99 px apart.
    truth = [
        {"image_id": 93, "category_id": 23, "bbox": [50, 69, 69, 105]},
        {"image_id": 93, "category_id": 23, "bbox": [50, 168, 54, 38]},
    ]
    back = [{**truth[0], "bbox": [50 + 1e-9, 69, 69, 105]}, {**truth[1], "bbox": [50 - 1e-9, 168, 54, 38]}]
    assert script["worst_box_error"](truth, back) == pytest.approx(1e-9, abs=1e-12)
    moved = [back[0], {**truth[1], "bbox": [50, 168, 54, 39]}]
    assert script["worst_box_error"](truth, moved) == pytest.approx(1.0)
    assert script["worst_box_error"](truth, back[:1]) is None
    assert script["worst_box_error"](truth, [back[0], {**back[1], "category_id": 4}]) is None
    assert script["worst_box_error"](truth, [back[0], {**back[1], "image_id": 94}]) is None


def test_predictions_map_back_to_category_ids_and_xywh(script: dict[str, Any]) -> None:
    results = script["coco_results"](7, [[10.0, 20.0, 40.0, 25.5]], [2.0], [0.25], [4, 11, 23])
    assert results == [{"image_id": 7, "category_id": 23, "score": 0.25, "bbox": [10.0, 20.0, 30.0, 5.5]}]


def test_without_ultralytics_the_comparison_says_how_to_install_it(
    script: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path))  # the script sets it: restored after the test
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    with without_ultralytics(), pytest.raises(SystemExit, match="pip install ultralytics"):
        script["offline_ultralytics"](tmp_path / "config")


@pytest.mark.parametrize(("score", "kept"), [(0.001, True), (0.00099, False)])
def test_scoring_keeps_scores_from_the_floor(
    script: dict[str, Any], converted: tuple[Path, Path], score: float, kept: bool
) -> None:
    root, yolo_root = converted
    results = [{**r, "score": score} for r in script["labels_as_results"](root, yolo_root, "val")]
    assert script["coco_stats"](root / "annotations" / "instances_val2017.json", results)["AP"] == (
        1.0 if kept else 0.0
    )


def test_classes_merged_score_the_boxes_whatever_their_class(
    script: dict[str, Any], converted: tuple[Path, Path]
) -> None:
    root, yolo_root = converted
    gt_file = root / "annotations" / "instances_val2017.json"
    results = script["labels_as_results"](root, yolo_root, "val")
    ids = sorted({r["category_id"] for r in results})
    wrong = [
        {**r, "category_id": ids[(ids.index(r["category_id"]) + 1) % len(ids)]} for r in results
    ]  # every class wrong
    by_class, merged = script["both_scores"](gt_file, wrong)
    assert by_class["AP"] == 0.0 and merged["AP"] == 1.0 and merged["AP50"] == 1.0
    assert script["both_scores"](gt_file, results)[0]["AP"] == 1.0


@pytest.mark.parametrize(
    ("iou", "high_ap"),
    [
        (0.775, (0.0, 0.0, 0.0, 0.0)),
        (0.825, (1.0, 0.0, 0.0, 0.0)),
        (0.875, (1.0, 1.0, 0.0, 0.0)),
        (0.97, (1.0, 1.0, 1.0, 1.0)),
    ],
)
def test_ap_at_high_ious_counts_each_box_on_the_side_of_every_threshold_its_overlap_falls(
    script: dict[str, Any], converted: tuple[Path, Path], iou: float, high_ap: tuple[float, ...]
) -> None:
    # Every true box shrunk about its corner to a box inside it of area share ``iou``: its IoU with the truth.
    root, yolo_root = converted
    side = iou**0.5
    shrunk = [
        {**r, "bbox": [r["bbox"][0], r["bbox"][1], r["bbox"][2] * side, r["bbox"][3] * side]}
        for r in script["labels_as_results"](root, yolo_root, "val")
    ]
    stats = script["coco_stats"](root / "annotations" / "instances_val2017.json", shrunk)
    assert tuple(stats[f"AP{t}"] for t in (80, 85, 90, 95)) == pytest.approx(high_ap, abs=1e-9)
    passed = sum(threshold <= iou for threshold in np.linspace(0.5, 0.95, 10))
    assert stats["AP"] == pytest.approx(passed / 10, abs=1e-9)  # pycocotools' AP: the mean over its ten thresholds


@pytest.mark.parametrize(("decoys", "ap"), [(99, 1.0), (100, 0.0)])
def test_scoring_keeps_the_best_100_detections_of_an_image_over_all_categories(
    script: dict[str, Any], converted: tuple[Path, Path], decoys: int, ap: float
) -> None:
    # pycocotools' maxDets caps each category of an image; YOLO's max_det and DETR's top 100 cap the image.
    root, yolo_root = converted
    gt_file = root / "annotations" / "instances_val2017.json"
    dataset = json.loads(gt_file.read_text())
    one = next(a for a in dataset["annotations"] if not a["iscrowd"])
    single = root.parent / "single.json"
    single.write_text(
        json.dumps(
            {**dataset, "images": [i for i in dataset["images"] if i["id"] == one["image_id"]], "annotations": [one]}
        )
    )
    truth = {"image_id": one["image_id"], "category_id": one["category_id"], "bbox": one["bbox"], "score": 0.4}
    other = next(c["id"] for c in dataset["categories"] if c["id"] != one["category_id"])
    decoy = {**truth, "category_id": other, "bbox": [0.0, 0.0, 1.0, 1.0], "score": 0.5}
    stats = script["coco_stats"](single, [truth] + [decoy] * decoys)
    assert stats["AP"] == pytest.approx(ap, abs=1e-9)  # the true box is the image's 100th detection, or its 101st


def test_wrong_class_detections_are_those_on_another_class_object_alone(
    script: dict[str, Any], converted: tuple[Path, Path]
) -> None:
    root, yolo_root = converted
    gt_file = root / "annotations" / "instances_val2017.json"
    results = [{**r, "score": 0.5} for r in script["labels_as_results"](root, yolo_root, "val")]
    ids = sorted({r["category_id"] for r in results})
    wrong = [{**r, "category_id": ids[(ids.index(r["category_id"]) + 1) % len(ids)], "score": 0.9} for r in results]
    x, y, w, h = results[0]["bbox"]
    shifted = {**results[0], "bbox": [x + w * 0.55, y, w, h], "category_id": wrong[0]["category_id"]}  # IoU below 0.5
    flags = script["wrong_class_flags"](gt_file, results + wrong + [shifted])
    assert flags == [False] * len(results) + [True] * len(wrong) + [False]
    without, count = script["without_wrong_classes"](gt_file, results + wrong)
    assert without["AP"] == 1.0 and count == len(wrong)
    assert script["coco_stats"](gt_file, results + wrong)["AP"] < 1.0


@pytest.mark.parametrize(("shift", "wrong"), [(0.32, True), (0.35, False)])
def test_a_wrong_class_needs_iou_half_with_the_other_object(
    script: dict[str, Any], converted: tuple[Path, Path], shift: float, wrong: bool
) -> None:
    # a box shifted by s of its width overlaps its object by IoU (1 - s) / (1 + s): 0.515 at 0.32, 0.481 at 0.35
    root, yolo_root = converted
    gt_file = root / "annotations" / "instances_val2017.json"
    results = script["labels_as_results"](root, yolo_root, "val")
    dataset = json.loads(gt_file.read_text())
    lone = [
        r
        for r in results
        if sum(a["image_id"] == r["image_id"] and not a["iscrowd"] for a in dataset["annotations"]) == 1
    ]
    x, y, w, h = lone[0]["bbox"]
    other = next(c["id"] for c in dataset["categories"] if c["id"] != lone[0]["category_id"])
    assert script["wrong_class_flags"](
        gt_file, [{**lone[0], "bbox": [x + shift * w, y, w, h], "category_id": other}]
    ) == [wrong]


@pytest.mark.parametrize(("category", "crowd", "wrong"), [(1, 0, False), (2, 0, False), (3, 0, True), (3, 1, False)])
def test_a_detection_on_an_object_of_its_own_class_is_never_a_wrong_class(
    script: dict[str, Any], tmp_path: Path, category: int, crowd: int, wrong: bool
) -> None:
    # two overlapping objects of classes 1 and 2 (IoU 0.8); a crowd region counts as no object
    gt_file = tmp_path / "gt.json"
    gt_file.write_text(
        json.dumps(
            {
                "images": [{"id": 1, "width": 20, "height": 20}],
                "categories": [{"id": c, "name": str(c)} for c in (1, 2, 3)],
                "annotations": [
                    {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "area": 100, "iscrowd": crowd},
                    {"id": 2, "image_id": 1, "category_id": 2, "bbox": [0, 0, 10, 8], "area": 80, "iscrowd": crowd},
                ],
            }
        )
    )
    detection = {"image_id": 1, "category_id": category, "bbox": [0.0, 0.0, 10.0, 10.0], "score": 0.9}
    assert script["wrong_class_flags"](gt_file, [detection]) == [wrong]


def test_processes_share_the_threads_and_the_configs_batch(
    script: dict[str, Any], converted: tuple[Path, Path], tmp_path: Path
) -> None:
    """``--processes 2 --threads 4``: two processes of two threads, batch 4 each (the config's 8), every
    process's images counted, and the final weights validated."""
    root, _ = converted
    args = script["parser"]().parse_args([str(root), "--budget-seconds", "3", "--threads", "4", "--processes", "2"])
    log_dir, clock = script["train_on_processes"](args, tmp_path, ["--trainer.enable_progress_bar", "false"])
    assert clock["torch_threads"] == [2]
    assert clock["steps"] >= 1 and clock["images_seen"] == 8 * clock["steps"]
    assert clock["validated_step"] == clock["steps"] and (log_dir / "bbox_results.json").is_file()


def test_processes_must_share_the_threads(script: dict[str, Any], converted: tuple[Path, Path], tmp_path: Path) -> None:
    args = script["parser"]().parse_args([str(converted[0]), "--threads", "3", "--processes", "2"])
    with pytest.raises(SystemExit, match="--threads 3 cannot be shared among --processes 2"):
        script["train_on_processes"](args, tmp_path, [])


@pytest.mark.parametrize(
    ("accelerator", "trainer", "yolo"),
    [
        ("cpu", ["--trainer.accelerator", "cpu"], "cpu"),
        ("gpu", ["--trainer.accelerator", "gpu", "--trainer.devices", "1", "--trainer.precision", "bf16-mixed"], 0),
    ],
)
def test_both_sides_train_where_accelerator_says(
    script: dict[str, Any], accelerator: str, trainer: list[str], yolo: str | int
) -> None:
    """The CPU pinned on both sides (Lightning's ``auto`` would take a GPU that YOLO does not use); a GPU in bf16."""
    assert script["accelerator_args"](accelerator) == trainer
    assert script["yolo_device"](accelerator) == yolo


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (["--no-vision-tx"], "--no-vision-tx needs --budget-seconds"),
        (["--no-vision-tx", "--budget-seconds", "60", "--yolo"], "--no-vision-tx needs --budget-seconds"),
        (["--accelerator", "gpu", "--processes", "2"], "--processes N is vision_tx's DDP on the CPU"),
    ],
)
def test_options_that_cannot_run_are_refused(script: dict[str, Any], options: list[str], error: str) -> None:
    with pytest.raises(SystemExit, match=error):
        script["check_options"](script["parser"]().parse_args(["/data", *options]))


@pytest.mark.parametrize("options", [[], ["--no-vision-tx", "--budget-seconds", "60"], ["--accelerator", "gpu"]])
def test_options_that_can_run_pass(script: dict[str, Any], options: list[str]) -> None:
    script["check_options"](script["parser"]().parse_args(["/data", *options]))


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ([], "give a set's folder or --suite NAME"),
        (["/data", "--suite", "real", "--budget-seconds", "60"], "give a set's folder or --suite NAME"),
        (["--suite", "real"], "--suite needs --budget-seconds"),
    ],
)
def test_a_suite_or_a_set_and_a_suite_with_its_budget(script: dict[str, Any], options: list[str], error: str) -> None:
    with pytest.raises(SystemExit, match=error):
        script["check_options"](script["parser"]().parse_args(options))
    script["check_options"](script["parser"]().parse_args(["--suite", "real", "--budget-seconds", "60"]))


def side_report(
    config: str | None, ap50: float, ap: float, ap75: float, speed: float, yolos: dict[str, tuple]
) -> dict[str, Any]:
    """A comparison report as ``compare`` writes it, with only what the suite's table reads."""

    def run(stats: tuple) -> dict[str, Any]:
        return {"coco": dict(zip(("AP50", "AP", "AP75"), stats[:3])), "images_per_second": stats[3]}

    return {
        "vision_tx": config and {"config": config, **run((ap50, ap, ap75, speed))},
        "yolo": {name: run(stats) for name, stats in yolos.items()},
    }


def test_the_suite_table_gives_each_set_and_the_means_of_the_sides_that_ran_on_all(script: dict[str, Any]) -> None:
    reports = {
        "bccd": side_report(
            "ours", 0.8, 0.5, 0.6, 20.0, {"yolov8n": (0.6, 0.4, 0.45, 50.0), "yolo11n": (0.7, 0.3, 0.35, 40.0)}
        ),
        "plates": side_report("ours", 0.4, 0.2, 0.1, 10.0, {"yolov8n": (0.5, 0.3, 0.25, 30.0)}),
    }
    table, means = script["suite_table"](reports)
    assert set(means) == {"ours", "YOLOv8n"}  # YOLO11n ran on one set of two: no mean
    assert means["ours"] == pytest.approx({"AP50": 0.6, "AP": 0.35, "AP75": 0.35, "images_per_second": 15.0})
    assert means["YOLOv8n"] == pytest.approx({"AP50": 0.55, "AP": 0.35, "AP75": 0.35, "images_per_second": 40.0})
    lines = table.splitlines()
    assert lines[1].split() == ["bccd", "ours", "0.800", "/", "0.500", "/", "0.600", "20.0"]
    assert [line.split()[:2] for line in lines[1:]] == [
        ["bccd", "ours"],
        ["bccd", "YOLOv8n"],
        ["bccd", "YOLO11n"],
        ["plates", "ours"],
        ["plates", "YOLOv8n"],
        ["mean", "ours"],
        ["mean", "YOLOv8n"],
    ]


def test_a_kept_yolo_run_is_reused_only_where_everything_that_decides_it_matches(
    script: dict[str, Any], converted: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = converted
    trained: list[tuple[str, float, int]] = []

    def fake_train(name: str, data_yaml: Path, out: Path, seconds: float, args: Any) -> tuple[Path, dict[str, Any]]:
        trained.append((name, seconds, args.seed))
        return tmp_path / "last.pt", {"epochs": len(trained), "images_per_second": 1.0}

    namespace = script["run_yolo"].__globals__
    monkeypatch.setitem(namespace, "train_yolo", fake_train)
    monkeypatch.setitem(namespace, "predict_yolo", lambda weights, root, args: [])
    monkeypatch.setitem(
        namespace, "versions", lambda *packages: {p: "1.0" for p in packages}
    )  # ultralytics absent here

    def run(*options: str) -> dict[str, Any]:
        args = script["parser"]().parse_args(
            [str(root), "--yolo-cache", str(tmp_path / "cache"), "--threads", "2", *options]
        )
        try:
            return script["run_yolo"]("yolov8n", tmp_path / "data.yaml", tmp_path, args.budget_seconds or 7.0, args)
        finally:
            torch.set_num_threads(threads)  # a trained side sets its threads

    threads = torch.get_num_threads()

    first = run("--budget-seconds", "60")
    assert run("--budget-seconds", "60") == first and len(trained) == 1  # kept
    run("--budget-seconds", "60", "--seed", "1")
    run("--budget-seconds", "60", "--threads", "3")
    run("--budget-seconds", "90")
    run("--budget-seconds", "60", "--imgsz", "256")
    assert len(trained) == 5
    run("--budget-seconds", "60", "--no-yolo-cache")
    run()  # no fixed budget: never kept
    run()
    assert len(trained) == 8
    annotations = root / "annotations" / "instances_val2017.json"
    saved = annotations.read_bytes()
    try:
        annotations.write_bytes(saved + b" ")  # other contents: another set
        run("--budget-seconds", "60")
        assert len(trained) == 9
    finally:
        annotations.write_bytes(saved)
    assert run("--budget-seconds", "60") == first and len(trained) == 9


def test_the_suite_runs_each_real_set_into_its_folder_and_writes_the_means(
    script: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = script["run_suite"].__globals__
    data = tmp_path / "data"
    for name in ("bccd", "masks", "plates", "aquarium"):
        (data / name).mkdir(parents=True)
    ran: list[tuple[Path, Path]] = []

    def fake_compare(args: Any, out: Path, extra: list[str]) -> dict[str, Any]:
        ran.append((args.root, out))
        return side_report("ours", 0.5, 0.1 * len(ran), 0.2, 10.0, {"yolov8n": (0.4, 0.2, 0.1, 30.0)})

    monkeypatch.setitem(namespace, "SHARED_DATA", data)
    monkeypatch.setitem(namespace, "compare", fake_compare)
    args = script["parser"]().parse_args(["--suite", "real", "--budget-seconds", "60", "--out", str(tmp_path / "out")])
    with redirect_stdout(io.StringIO()) as printed:
        script["run_suite"](args, [])
    assert ran == [
        (data / name, (tmp_path / "out" / name).resolve()) for name in ("bccd", "masks", "plates", "aquarium")
    ]
    written = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert written["means"]["ours"]["AP"] == pytest.approx(0.25) and written["means"]["YOLOv8n"]["AP"] == pytest.approx(
        0.2
    )
    assert "mean      ours" in printed.getvalue()
    (data / "plates").rmdir()
    with pytest.raises(SystemExit, match="plates: no such folder"):
        script["run_suite"](args, [])


def test_the_scripts_check_passes_an_image_with_more_objects_than_the_detections_scored(
    script: dict[str, Any], converted: tuple[Path, Path], tmp_path: Path
) -> None:
    # A crowd of 130 faces in one image (../shared/data/masks has an image of 115): written and read back exactly,
    # the check must count them all, not the 100 detections an image the comparison scores.
    import shutil

    root, yolo_root = tmp_path / "set", tmp_path / "yolo"
    shutil.copytree(converted[0], root)
    shutil.copytree(converted[1], yolo_root)
    gt_file = root / "annotations" / "instances_val2017.json"
    dataset = json.loads(gt_file.read_text())
    image = max(dataset["images"], key=lambda i: i["width"] * i["height"])
    crowd = [
        {
            "id": 100_000 + k,
            "image_id": image["id"],
            "category_id": 4,
            "bbox": [float(k % 13) * 4, float(k // 13) * 4, 3.0, 3.0],
            "area": 9.0,
            "iscrowd": 0,
        }
        for k in range(130)
    ]
    gt_file.write_text(json.dumps({**dataset, "annotations": dataset["annotations"] + crowd}))
    label = yolo_root / "labels" / "val" / f"{Path(image['file_name']).stem}.txt"
    width, height = image["width"], image["height"]
    lines = [
        f"0 {(x + w / 2) / width:.10f} {(y + h / 2) / height:.10f} {w / width:.10f} {h / height:.10f}\n"
        for x, y, w, h in (a["bbox"] for a in crowd)
    ]
    label.write_text(label.read_text() + "".join(lines))
    with without_ultralytics():
        assert max(script["check_round_trip"](root, yolo_root).values()) < 1e-6
