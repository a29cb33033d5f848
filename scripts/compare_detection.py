"""Trains a vision_tx detector and Ultralytics YOLO models (YOLOv8n, YOLO11n, YOLO26n: ``--yolo``) from
scratch on the same COCO-layout set for the same training wall-clock, and scores all with pycocotools
on the set's validation split.

The vision_tx side is ``python tools/train.py --config CONFIG --data.root ROOT`` (run in this process
through vision_tx's CLI; with ``--processes N``, as N processes of Lightning's DDP on the CPU, each with
1/N of the threads and of the config's batch), its training time measured without its validations; each YOLO model
(``YOLO("yolov8n.yaml")``: no weights, Ultralytics' default augmentations) then trains for that
long through Ultralytics' own ``time=`` budget (which fits its learning-rate schedule to it) with
no validation before the end. ``--budget-seconds`` gives both sides a fixed time instead (vision_tx
then trains with ``--budget.minutes``: its config's step plan stretched to that time). Both use the same
torch threads, seed and no loader workers. Each final model (YOLO's last EMA weights, not a best
epoch picked on the validation set) predicts the validation images once and pycocotools scores
the COCO results of both: at most 100 detections per image, scores from 0.001 (YOLO's validation
threshold).

COCO to YOLO: category ids (any, not necessarily contiguous) map to 0..K-1 in increasing order;
crowd regions (``iscrowd=1``) get no YOLO label, as vision_tx's training leaves them out too (their
pixels are background to both), and COCO evaluation ignores detections on them; images without
objects keep an empty label file. Before training, the labels written are read back, converted to
COCO results the way YOLO's predictions are, and scored: AP must be 1.0 and every box back to
within 1e-3 px. Ultralytics (AGPL-3.0) is imported only inside this script: ``pip install
ultralytics``. Nothing is downloaded: the model comes from its YAML, its font is matplotlib's
DejaVu Sans, its settings (no hub, no online checks, no TensorBoard) live in OUT/ultralytics_config.

    python scripts/make_shapes_dataset.py /tmp/shapes_a --seed 1
    python scripts/compare_detection.py /tmp/shapes_a  # rtdetr_convnext_toy, YOLOv8n the same time
    python scripts/compare_detection.py /tmp/shapes_a --yolo yolov8n yolo11n yolo26n  # each of the three, the same time
    python scripts/compare_detection.py /tmp/shapes_a --budget-seconds 180 --seed 1
    # two 1-thread processes:
    python scripts/compare_detection.py /tmp/shapes_a --budget-seconds 480 --threads 2 --processes 2
    # after --: vision_tx options
    python scripts/compare_detection.py /tmp/shapes_a --config detr_swin_toy -- --model.lr 2e-4
    python scripts/compare_detection.py BCCD --accelerator gpu --budget-seconds 300 --workers 8 --imgsz 640 \
        -- --data.batch_size 16 --data.val_transform.init_args.size 480 --data.val_transform.init_args.max_size 640
    python scripts/compare_detection.py BCCD --no-vision-tx --budget-seconds 300 --yolo yolo26n   # a YOLO side alone
    python scripts/compare_detection.py --suite real --budget-seconds 180 --threads 2 --yolo yolov8n yolo11n --seed 0

``--suite real`` runs the comparison on each real set of ``../shared/data`` (BCCD, masks, plates, aquarium) in turn,
each into OUT/SET, and prints one table: per set AP50 / AP / AP75 and images per second of each side, and the suite's
means. A YOLO side's scored run is kept in ``--yolo-cache`` under its set (the annotation files' contents), budget,
seed, threads, loader workers, image size, batch, accelerator, CPU or GPU model and torch and Ultralytics versions, and
reused when all of them match (``--no-yolo-cache``: train again): a recipe change reruns only vision_tx's side. Only
runs of a fixed ``--budget-seconds`` are kept.

``--accelerator gpu`` trains and predicts both sides on the first GPU: vision_tx in ``bf16-mixed``, YOLO with
Ultralytics' own mixed precision (``amp=True``, fp16 with loss scaling). ``--no-vision-tx`` trains only the YOLO
models, for ``--budget-seconds``: with two commands side by side (each pinned to its share of the cores with
``taskset``), the sides can train at the same time on one machine.

Prints the COCO tables side by side (and AP at IoU 0.80, 0.85, 0.90 and 0.95: how tight the boxes are), with AP
and AP50 of the same detections with every class merged
into one and without the detections of a wrong class (TIDE's classification errors: which part of a gap
is the boxes, which the classes), the training wall-clock, CPU seconds,
images seen and images per second of each, the CPU and the versions; writes all of it to OUT/comparison.json.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from compare_common import (
    comparison_parser,
    cpu_description,
    machine_line,
    parse_with_vision_tx_options,
    side_by_side,
    train_vision_tx,
    training_args,
    versions,
    write_report,
)
from PIL import Image
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from scipy.optimize import linear_sum_assignment
from torchvision.ops import box_convert, box_iou

PYCOCOTOOLS_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")
HIGH_IOU_THRESHOLDS = (0.80, 0.85, 0.90, 0.95)  # past pycocotools' AP75: where the box edges decide AP
STAT_NAMES = (*PYCOCOTOOLS_NAMES[:3], *(f"AP{round(100 * t)}" for t in HIGH_IOU_THRESHOLDS), *PYCOCOTOOLS_NAMES[3:])
SPLITS = {"train": "train2017", "val": "val2017"}  # YOLO split -> COCO folder
MAX_DETECTIONS = 100
SCORE_FLOOR = 0.001
ROUND_TRIP_TOLERANCE_PX = 1e-3
GPU_PRECISION = (
    "bf16-mixed"  # vision_tx's on a GPU; Ultralytics' own mixed precision (amp=True) is fp16 with loss scaling
)
TRAIN_TOOL = Path(__file__).resolve().parents[1] / "tools" / "train.py"
YOLO_MODELS = {
    "yolov8n": "YOLOv8n",
    "yolo11n": "YOLO11n",
    "yolo26n": "YOLO26n",
}  # Ultralytics' YAML name -> display name
# ../shared/data beside the checkout, or VISION_TX_SHARED_DATA (as the tests read it)
SHARED_DATA = Path(os.environ.get("VISION_TX_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
SUITES = {"real": ("bccd", "masks", "plates", "aquarium")}  # sets of SHARED_DATA, in the order they run
SUITE_STATS = ("AP50", "AP", "AP75")


def annotation_file(root: Path, folder: str) -> Path:
    return Path(root) / "annotations" / f"instances_{folder}.json"


def category_ids(dataset: dict[str, Any]) -> list[int]:
    """The COCO category ids in increasing order: YOLO class ``i`` is ``category_ids(...)[i]``."""
    return sorted(c["id"] for c in dataset["categories"])


def yolo_label_lines(
    annotations: Sequence[dict[str, Any]], width: int, height: int, classes: dict[int, int]
) -> list[str]:
    """YOLO label lines ``class cx cy w h`` (fractions of the image) of an image's non-crowd COCO
    annotations (xywh ``bbox`` in pixels); ``classes`` maps category id -> YOLO class."""
    lines = []
    for ann in annotations:
        if ann.get("iscrowd", 0):
            continue
        x, y, w, h = ann["bbox"]
        lines.append(
            f"{classes[ann['category_id']]} {(x + w / 2) / width:.10f} {(y + h / 2) / height:.10f} "
            f"{w / width:.10f} {h / height:.10f}"
        )
    return lines


def read_yolo_labels(path: Path, width: int, height: int) -> tuple[list[int], np.ndarray]:
    """The classes and pixel xyxy boxes ``[N,4]`` of a YOLO label file of a ``width x height`` image."""
    rows = [line.split() for line in Path(path).read_text().splitlines() if line.strip()]
    if any(len(row) != 5 for row in rows):
        raise ValueError(f"{path}: a YOLO detection label line has 5 fields (class cx cy w h)")
    values = np.array([[float(v) for v in row[1:]] for row in rows], dtype=np.float64).reshape(-1, 4)
    centre, size = values[:, :2] * [width, height], values[:, 2:] * [width, height]
    return [int(row[0]) for row in rows], np.concatenate([centre - size / 2, centre + size / 2], axis=1)


def coco_results(
    image_id: int, boxes: Any, classes: Sequence[float], scores: Sequence[float], categories: Sequence[int]
) -> list[dict[str, Any]]:
    """COCO results (xywh) of one image's detections: pixel xyxy ``boxes [N,4]``, YOLO ``classes``."""
    return [
        {
            "image_id": image_id,
            "category_id": categories[int(c)],
            "score": float(s),
            "bbox": [float(x0), float(y0), float(x1) - float(x0), float(y1) - float(y0)],
        }
        for (x0, y0, x1, y1), c, s in zip(np.asarray(boxes, dtype=np.float64).reshape(-1, 4), classes, scores)
    ]


def write_yolo_dataset(root: Path, out: Path) -> Path:
    """Writes ``out/images/{train,val}/`` (copies), ``out/labels/{train,val}/*.txt`` and ``out/data.yaml``."""
    names: list[str] = []
    for split, folder in SPLITS.items():
        dataset = json.loads(annotation_file(root, folder).read_text())
        ids = category_ids(dataset)
        names = names or [{c["id"]: c["name"] for c in dataset["categories"]}[i] for i in ids]
        classes = {cid: i for i, cid in enumerate(ids)}
        by_image = defaultdict(list)
        for ann in dataset["annotations"]:
            by_image[ann["image_id"]].append(ann)
        (out / "images" / split).mkdir(parents=True, exist_ok=True)
        (out / "labels" / split).mkdir(parents=True, exist_ok=True)
        stems = set()
        for image in dataset["images"]:
            source = Path(root) / folder / image["file_name"]
            with Image.open(source) as picture:
                if picture.size != (image["width"], image["height"]):
                    raise SystemExit(
                        f"error: {source}: the image is {picture.size[0]}x{picture.size[1]}, its annotation says "
                        f"{image['width']}x{image['height']}"
                    )
            stem = Path(image["file_name"]).stem
            if stem in stems:
                raise SystemExit(f"error: {source}: a second image named {stem}.* in {folder} (YOLO labels go by name)")
            stems.add(stem)
            shutil.copyfile(source, out / "images" / split / Path(image["file_name"]).name)
            lines = yolo_label_lines(by_image[image["id"]], image["width"], image["height"], classes)
            (out / "labels" / split / f"{stem}.txt").write_text("".join(f"{line}\n" for line in lines))
    data = {"path": str(out.resolve()), "train": "images/train", "val": "images/val", "names": dict(enumerate(names))}
    (out / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return out / "data.yaml"


def labels_as_results(root: Path, yolo_root: Path, split: str) -> list[dict[str, Any]]:
    """The YOLO labels of ``split`` read back as COCO results of score 1 (the ground truth as predictions)."""
    dataset = json.loads(annotation_file(root, SPLITS[split]).read_text())
    results = []
    for image in dataset["images"]:
        label = yolo_root / "labels" / split / f"{Path(image['file_name']).stem}.txt"
        classes, boxes = read_yolo_labels(label, image["width"], image["height"])
        results += coco_results(image["id"], boxes, classes, [1.0] * len(classes), category_ids(dataset))
    return results


def ap_at_iou(evaluation: COCOeval, threshold: float) -> float:
    """An accumulated ``evaluation``'s AP at one of its IoU thresholds, over all areas at its largest number of
    detections (pycocotools' own summary of AP50 and AP75, at any threshold); -1 where no category has objects."""
    index = int(np.argmin(np.abs(evaluation.params.iouThrs - threshold)))
    precision = evaluation.eval["precision"][index, :, :, evaluation.params.areaRngLbl.index("all"), -1]
    valid = precision[precision > -1]
    return float(valid.mean()) if valid.size else -1.0


def coco_stats(
    gt_file: Path, results: list[dict[str, Any]], classes: bool = True, max_detections: int = MAX_DETECTIONS
) -> dict[str, float]:
    """pycocotools' 12 box statistics of ``results`` against ``gt_file`` and AP at ``HIGH_IOU_THRESHOLDS``, keeping
    each image's ``max_detections`` best detections scoring at least ``SCORE_FLOOR``; with ``classes=False`` every
    category is one (pycocotools' ``useCats=0``): what the boxes score whatever class they were given. At another
    ``max_detections`` than 100 only AP and the AP at single thresholds are read at it."""
    by_image = defaultdict(list)
    for r in results:
        if r["score"] >= SCORE_FLOOR:
            by_image[r["image_id"]].append(r)
    kept = [r for rs in by_image.values() for r in sorted(rs, key=lambda r: -r["score"])[:max_detections]]
    if not kept:
        return dict.fromkeys(STAT_NAMES, 0.0)
    with redirect_stdout(io.StringIO()):  # pycocotools prints its progress and table
        gt = COCO(str(gt_file))
        evaluation = COCOeval(gt, gt.loadRes(kept), "bbox")
        evaluation.params.maxDets = [1, 10, max_detections]
        evaluation.params.useCats = int(classes)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    stats = {
        **dict(zip(PYCOCOTOOLS_NAMES, (float(v) for v in evaluation.stats))),
        **{f"AP{round(100 * t)}": ap_at_iou(evaluation, t) for t in HIGH_IOU_THRESHOLDS},
    }
    if max_detections != 100:  # pycocotools' summary reads AP (and the area rows) at 100 detections only
        stats["AP"] = float(np.mean([ap_at_iou(evaluation, t) for t in evaluation.params.iouThrs]))
    return stats


def worst_box_error(truth: Sequence[dict[str, Any]], back: Sequence[dict[str, Any]]) -> float | None:
    """The largest coordinate difference (pixels) between COCO boxes ``truth`` and ``back`` (annotations or
    results: ``image_id``, ``category_id``, xywh ``bbox``), each image's boxes of a category paired by the least
    total difference (two objects of a class can share a coordinate, whose rounding then decides no order).
    None when the two do not hold the same number of boxes of each category in each image."""
    groups: dict[tuple[int, int], tuple[list, list]] = defaultdict(lambda: ([], []))
    for side, boxes in enumerate((truth, back)):
        for box in boxes:
            groups[box["image_id"], box["category_id"]][side].append(box["bbox"])
    worst = 0.0
    for expected, found in groups.values():
        if len(expected) != len(found):
            return None
        differences = np.abs(
            np.asarray(expected, dtype=np.float64)[:, None] - np.asarray(found, dtype=np.float64)[None]
        ).max(-1)
        rows, columns = linear_sum_assignment(differences)
        worst = max(worst, float(differences[rows, columns].max()))
    return worst


def both_scores(gt_file: Path, results: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`coco_stats` of ``results`` by class and with the classes merged: the boxes' share of a gap and the
    classes'."""
    return coco_stats(gt_file, results), coco_stats(gt_file, results, classes=False)


def wrong_class_flags(gt_file: Path, results: Sequence[dict[str, Any]], iou_threshold: float = 0.5) -> list[bool]:
    """For each of ``results``: is it a detection of the wrong class (TIDE's classification error)? One that overlaps
    no object of its own class by IoU ``iou_threshold`` but an object of another class that much (a second box on an
    object of its class is a duplicate, not a class error). Crowd regions count as no object."""
    dataset = json.loads(Path(gt_file).read_text())
    objects: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for annotation in dataset["annotations"]:
        if not annotation.get("iscrowd", 0):
            objects[annotation["image_id"]].append(annotation)
    flags = [False] * len(results)
    for index, result in enumerate(results):
        truth = objects.get(result["image_id"], [])
        if not truth:
            continue
        ious = box_iou(
            box_convert(torch.tensor([result["bbox"]], dtype=torch.float64), "xywh", "xyxy"),
            box_convert(torch.tensor([a["bbox"] for a in truth], dtype=torch.float64), "xywh", "xyxy"),
        )[0]
        same = torch.tensor([a["category_id"] == result["category_id"] for a in truth])
        flags[index] = bool((ious[same] < iou_threshold).all() and (ious[~same] >= iou_threshold).any())
    return flags


def without_wrong_classes(gt_file: Path, results: Sequence[dict[str, Any]]) -> tuple[dict[str, float], int]:
    """:func:`coco_stats` of ``results`` less their wrong-class detections (:func:`wrong_class_flags`): what the
    classes cost, counted by kind of error rather than by merging them; and how many of those score at least 0.2."""
    flags = wrong_class_flags(gt_file, results)
    kept = [result for result, wrong in zip(results, flags) if not wrong]
    return coco_stats(gt_file, kept), sum(wrong and result["score"] >= 0.2 for result, wrong in zip(results, flags))


def scored(gt_file: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's scores of one side's ``results``: by class, with the classes merged, and without the wrong-class
    detections (with their count from score 0.2)."""
    by_class, merged = both_scores(gt_file, results)
    without, wrong = without_wrong_classes(gt_file, results)
    return {
        "coco": by_class,
        "coco_classes_merged": merged,
        "coco_without_wrong_classes": without,
        "wrong_class_detections": wrong,
    }


def check_round_trip(root: Path, yolo_root: Path) -> dict[str, float]:
    """Scores the YOLO labels of both splits, read back, against the COCO ground truth of ``root`` (the labels in
    ``yolo_root``): AP must be 1.0, counting as many detections an image as its most crowded image holds objects (a
    crowd of faces can hold more than ``MAX_DETECTIONS``), and every non-crowd box come back to within
    ``ROUND_TRIP_TOLERANCE_PX``. Returns the worst error."""
    errors = {}
    for split, folder in SPLITS.items():
        gt_file = annotation_file(root, folder)
        results = labels_as_results(root, yolo_root, split)
        truth = [a for a in json.loads(gt_file.read_text())["annotations"] if not a.get("iscrowd", 0)]
        errors[split] = worst_box_error(truth, results)
        if errors[split] is None:
            raise SystemExit(
                f"error: {yolo_root}/labels/{split}: the labels read back are not the objects of {gt_file}"
            )
        most = max(Counter(a["image_id"] for a in truth).values(), default=0)
        ap = coco_stats(gt_file, results, max_detections=max(most, MAX_DETECTIONS))["AP"] if results else 1.0
        if ap != 1.0 or errors[split] > ROUND_TRIP_TOLERANCE_PX:
            raise SystemExit(
                f"error: {yolo_root}/labels/{split}: the ground truth through YOLO labels scores AP {ap} with "
                f"boxes off by up to {errors[split]:.2g} px (need AP 1.0, within {ROUND_TRIP_TOLERANCE_PX} px)"
            )
    return errors


def offline_ultralytics(config_dir: Path) -> None:
    """Imports ultralytics with its settings in ``config_dir``: offline, no hub or loggers, a local font."""
    os.environ["YOLO_CONFIG_DIR"] = str(config_dir)
    os.environ["YOLO_OFFLINE"] = "1"
    try:
        import matplotlib
        from ultralytics.utils import SETTINGS, USER_CONFIG_DIR
        from ultralytics.utils.checks import check_font
    except ImportError as err:
        raise SystemExit(
            f"error: this comparison needs Ultralytics (AGPL-3.0, not a vision_tx dependency): "
            f"pip install ultralytics ({err})"
        ) from err
    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    for name in ("Arial.ttf", "Arial.Unicode.ttf"):  # the fonts Ultralytics would otherwise download
        if not (USER_CONFIG_DIR / name).is_file():
            shutil.copyfile(font, USER_CONFIG_DIR / name)
        if Path(check_font(name) or "") != USER_CONFIG_DIR / name:
            raise SystemExit(f"error: {USER_CONFIG_DIR / name}: Ultralytics does not take this local font")
    SETTINGS.update(
        {
            key: False
            for key in (
                "sync",
                "hub",
                "clearml",
                "comet",
                "dvc",
                "mlflow",
                "neptune",
                "raytune",
                "tensorboard",
                "wandb",
            )
            if key in SETTINGS
        }
    )


class YoloClock:
    """Ultralytics callbacks counting training time (without the final validation), CPU seconds,
    images and torch threads; they set the torch threads once Ultralytics has set its own."""

    def __init__(self, threads: int) -> None:
        self.threads, self.seen_threads = threads, set()
        self.wall = self.cpu = 0.0
        self.images = self.epochs = self.batches = 0

    def on_train_start(self, trainer: Any) -> None:
        torch.set_num_threads(self.threads)  # Ultralytics' select_device sets its own count (cores - 1)
        self.start = (time.perf_counter(), time.process_time())

    def on_train_epoch_start(self, trainer: Any) -> None:
        self.batches = 0

    def on_train_batch_start(
        self, trainer: Any
    ) -> None:  # every batch started is trained (its end hook is skipped at the time limit)
        self.batches += 1
        self.seen_threads.add(torch.get_num_threads())

    def on_train_epoch_end(self, trainer: Any) -> None:
        self.wall, self.cpu = time.perf_counter() - self.start[0], time.process_time() - self.start[1]
        self.images += min(self.batches * trainer.batch_size, len(trainer.train_loader.dataset))
        self.epochs += 1

    def summary(self) -> dict[str, Any]:
        return {
            "train_seconds": self.wall,
            "cpu_seconds": self.cpu,
            "images_seen": self.images,
            "images_per_second": self.images / max(self.wall, 1e-9),
            "epochs": self.epochs,
            "torch_threads": sorted(self.seen_threads),
        }


def accelerator_args(accelerator: str) -> list[str]:
    """vision_tx's trainer options for ``--accelerator``: the CPU in fp32, or one GPU in bf16 mixed precision."""
    if accelerator == "gpu":
        return ["--trainer.accelerator", "gpu", "--trainer.devices", "1", "--trainer.precision", GPU_PRECISION]
    return ["--trainer.accelerator", "cpu"]


def yolo_device(accelerator: str) -> str | int:
    """Ultralytics' ``device`` for ``--accelerator``: ``"cpu"``, or the first GPU."""
    return 0 if accelerator == "gpu" else "cpu"


def train_yolo(
    name: str, data_yaml: Path, out: Path, seconds: float, args: argparse.Namespace
) -> tuple[Path, dict[str, Any]]:
    """Trains the YOLO model ``name`` (e.g. ``yolov8n``) from its YAML for ``seconds`` of training;
    returns its last weights and its clock."""
    offline_ultralytics(out / "ultralytics_config")
    from ultralytics import YOLO

    model = YOLO(f"{name}.yaml")
    clock = YoloClock(args.threads)
    for event in ("on_train_start", "on_train_epoch_start", "on_train_batch_start", "on_train_epoch_end"):
        model.add_callback(event, getattr(clock, event))
    model.train(
        data=str(data_yaml),
        imgsz=args.imgsz,
        batch=args.yolo_batch,
        time=seconds / 3600,
        workers=args.workers,
        seed=args.seed,
        device=yolo_device(args.accelerator),
        pretrained=False,
        amp=args.accelerator == "gpu",
        val=False,
        plots=False,
        project=str(out.resolve()),
        name=name,
        exist_ok=True,
    )
    # Ultralytics' own validation of the same weights (best.pt is the last epoch's: the only one validated),
    # a cross-check
    own = {
        "own AP50": model.trainer.metrics.get("metrics/mAP50(B)"),
        "own AP": model.trainer.metrics.get("metrics/mAP50-95(B)"),
    }
    return Path(model.trainer.last), {**clock.summary(), "ultralytics_val": own}


def predict_yolo(weights: Path, root: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """COCO results of YOLO's predictions on the validation images (conf 0.001, NMS IoU 0.7: YOLO's validation)."""
    from ultralytics import YOLO

    dataset = json.loads(annotation_file(root, SPLITS["val"]).read_text())
    ids = {Path(image["file_name"]).name: image["id"] for image in dataset["images"]}
    paths = [str(Path(root) / SPLITS["val"] / image["file_name"]) for image in dataset["images"]]
    results: list[dict[str, Any]] = []
    for found in YOLO(str(weights)).predict(
        paths,
        imgsz=args.imgsz,
        conf=SCORE_FLOOR,
        iou=0.7,
        max_det=MAX_DETECTIONS,
        device=yolo_device(args.accelerator),
        stream=True,
        verbose=False,
    ):
        boxes = found.boxes
        results += coco_results(
            ids[Path(found.path).name],
            boxes.xyxy.tolist(),
            boxes.cls.tolist(),
            boxes.conf.tolist(),
            category_ids(dataset),
        )
    return results


def train_on_processes(args: argparse.Namespace, out: Path, extra: Sequence[str]) -> tuple[Path, dict[str, Any]]:
    """vision_tx's side on ``args.processes`` CPU processes of ``args.threads / args.processes`` threads each
    (Lightning's DDP, started by ``tools/train.py`` in processes of its own), each with that share of the
    config's batch (unless ``--data.batch_size`` is among ``extra``): the global batches of one process.
    Returns the run's log folder, with the predictions of its final validation, and its clock."""
    from vision_tx.config_loader import load_config
    from vision_tx.lightning.cli import resolve_config

    if args.threads % args.processes:
        raise SystemExit(f"error: --threads {args.threads} cannot be shared among --processes {args.processes}")
    batch: list[str] = []
    if "--data.batch_size" not in extra:
        config_batch = load_config(resolve_config(args.config))["data"]["init_args"]["batch_size"]
        if config_batch % args.processes:
            raise SystemExit(
                f"error: {args.config}'s batch of {config_batch} cannot be shared among --processes "
                f"{args.processes} (give each process's after --: --data.batch_size B)"
            )
        batch = ["--data.batch_size", str(config_batch // args.processes)]
    ddp = [
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        str(args.processes),
        "--trainer.strategy",
        "ddp",
        *batch,
    ]
    command = [
        sys.executable,
        str(TRAIN_TOOL),
        *training_args(args.config, args.root, out, args.seed, args.workers, args.budget_seconds, [*ddp, *extra]),
    ]
    print(f"vision_tx: OMP_NUM_THREADS={args.threads // args.processes} {shlex.join(command[1:])}", flush=True)
    started = time.time()
    run = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": str(args.threads // args.processes)})
    if run.returncode:
        raise SystemExit(f"error: vision_tx's training failed (exit status {run.returncode})")
    written = [m for m in out.glob("lightning_logs/version_*/metrics.json") if m.stat().st_mtime >= started]
    clock = json.loads(written[0].read_text()).get("training") if len(written) == 1 else None
    if clock is None:
        raise SystemExit(
            f"error: {out}: no metrics.json with the run's clock (a logger is needed: leave --trainer.logger alone)"
        )
    if clock["validated_step"] != clock["steps"]:
        raise SystemExit(
            f"error: the run ended at step {clock['steps']} without validating its final weights "
            f"(last validation at step {clock['validated_step']}): give --budget-seconds"
        )
    return written[0].parent, clock


def run_vision_tx(args: argparse.Namespace, out: Path, extra: Sequence[str]) -> dict[str, Any]:
    """Trains the vision_tx side (in this process, or on ``--processes``) and scores its final weights'
    predictions; returns its clock and scores."""
    if args.processes > 1:
        log_dir, vtx = train_on_processes(args, out / "vision_tx", extra)
    else:
        cli, vtx = train_vision_tx(
            args.config,
            args.root,
            out / "vision_tx",
            args.seed,
            args.workers,
            args.budget_seconds,
            [*accelerator_args(args.accelerator), *extra],
        )
        if vtx["validated_step"] != vtx["steps"]:  # the final weights' predictions, unless the run ended validating
            cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
        log_dir = Path(cli.trainer.log_dir or "")
        del cli
    vtx_file = log_dir / "bbox_results.json"
    if not vtx_file.is_file():
        raise SystemExit(
            f"error: {vtx_file}: vision_tx wrote no results (a logger is needed: leave --trainer.logger alone)"
        )
    vtx.update(scored(annotation_file(args.root, SPLITS["val"]), json.loads(vtx_file.read_text())))
    return vtx


def parser() -> argparse.ArgumentParser:
    p = comparison_parser(
        __doc__,
        "a COCO-layout set: train2017/, val2017/, annotations/instances_*.json (or --suite)",
        "rtdetr_convnext_toy",
        "runs/compare_detection",
        root_optional=True,
    )
    p.add_argument(
        "--suite",
        choices=SUITES,
        help="the sets of ../shared/data compared in turn, one table: "
        + "; ".join(f"{name}: {', '.join(sets)}" for name, sets in SUITES.items()),
    )
    p.add_argument(
        "--yolo-cache",
        type=Path,
        default=Path.home() / ".cache" / "vision_tx" / "compare_detection",
        help="where YOLO's scored runs of a fixed --budget-seconds are kept and reused",
    )
    p.add_argument("--no-yolo-cache", dest="use_yolo_cache", action="store_false", help="train the YOLO models again")
    p.add_argument("--imgsz", type=int, default=192, help="YOLO's image size (the longer side)")
    p.add_argument("--yolo-batch", type=int, default=16, help="YOLO's batch size (its default)")
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="vision_tx's processes (Lightning's DDP on the CPU), --threads shared among them and the config's "
        "batch divided among them: the same global batches (default 1: this process)",
    )
    p.add_argument(
        "--yolo",
        nargs="*",
        choices=YOLO_MODELS,
        default=["yolov8n"],
        metavar="MODEL",
        help=f"the YOLO models trained after vision_tx, each for the same time ({', '.join(YOLO_MODELS)}; "
        "none: vision_tx alone)",
    )
    p.add_argument(
        "--accelerator",
        choices=("cpu", "gpu"),
        default="cpu",
        help=f"where both sides train and predict: the CPU in fp32, or one GPU in mixed precision (vision_tx "
        f"{GPU_PRECISION}, Ultralytics' own AMP)",
    )
    p.add_argument(
        "--vision-tx",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train the vision_tx side (--no-vision-tx: the YOLO models alone, for --budget-seconds, e.g. to "
        "run the two sides at once on one machine)",
    )
    return p


def check_options(args: argparse.Namespace) -> None:
    """Refuses the combinations of options that cannot run."""
    if (args.root is None) == (args.suite is None):
        raise SystemExit("error: give a set's folder or --suite NAME (not both)")
    if args.suite and args.budget_seconds is None:
        raise SystemExit("error: --suite needs --budget-seconds: every set and side trains for the same time")
    if args.processes > 1 and args.accelerator != "cpu":
        raise SystemExit("error: --processes N is vision_tx's DDP on the CPU; on a GPU give --processes 1")
    if not args.vision_tx and (args.budget_seconds is None or not args.yolo):
        raise SystemExit("error: --no-vision-tx needs --budget-seconds (no vision_tx run to time) and a --yolo model")


def yolo_cache_file(args: argparse.Namespace, name: str, budget: float) -> Path:
    """Where the YOLO model ``name``'s scored run on ``args.root`` for ``budget`` seconds is kept: named by the set,
    the model and a digest of everything that decides the run (the annotations' contents, not the folder's path)."""
    key = {
        "annotations": [
            hashlib.sha256(annotation_file(args.root, folder).read_bytes()).hexdigest() for folder in SPLITS.values()
        ],
        "model": name,
        "budget_seconds": budget,
        "seed": args.seed,
        "threads": args.threads,
        "workers": args.workers,
        "imgsz": args.imgsz,
        "batch": args.yolo_batch,
        "accelerator": args.accelerator,
        "device": torch.cuda.get_device_name(0) if args.accelerator == "gpu" else cpu_description()["model"],
        "versions": versions("torch", "ultralytics"),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return args.yolo_cache / f"{Path(args.root).resolve().name}_{name}_{digest}.json"


def run_yolo(name: str, data_yaml: Path, out: Path, budget: float, args: argparse.Namespace) -> dict[str, Any]:
    """The YOLO model ``name`` trained for ``budget`` seconds and scored, or its kept run where one matches."""
    cache = yolo_cache_file(args, name, budget) if args.use_yolo_cache and args.budget_seconds is not None else None
    if cache is not None and cache.is_file():
        print(f"{YOLO_MODELS[name]}: the run kept in {cache}")
        return json.loads(cache.read_text())
    weights, yolo = train_yolo(name, data_yaml, out, budget, args)
    torch.set_num_threads(args.threads)
    yolo.update(scored(annotation_file(args.root, SPLITS["val"]), predict_yolo(weights, args.root, args)))
    run = {"model": f"{name}.yaml", "imgsz": args.imgsz, "batch": args.yolo_batch, "weights": str(weights), **yolo}
    if cache is not None:
        write_report(cache, run)
    return run


def suite_table(reports: dict[str, dict[str, Any]]) -> tuple[str, dict[str, dict[str, float]]]:
    """One row per set of ``reports`` (set -> a comparison's report), one column per side: AP50 / AP / AP75 and images
    per second; then the means over the sets of the sides that ran on all of them. Returns the table and the means."""

    def stats(run: dict[str, Any]) -> dict[str, float]:
        return {**{k: run["coco"][k] for k in SUITE_STATS}, "images_per_second": run["images_per_second"]}

    table: dict[str, dict[str, dict[str, float]]] = {}
    for name, report in reports.items():
        if report["vision_tx"]:
            table.setdefault(report["vision_tx"]["config"], {})[name] = stats(report["vision_tx"])
        for model, run in report["yolo"].items():
            table.setdefault(YOLO_MODELS[model], {})[name] = stats(run)
    means = {
        side: {k: float(np.mean([row[k] for row in rows.values()])) for k in (*SUITE_STATS, "images_per_second")}
        for side, rows in table.items()
        if len(rows) == len(reports)
    }
    width = max(len(side) for side in table) + 2
    lines = [f"{'set':<10}{'side':<{width}}{' / '.join(SUITE_STATS):>22}{'images/s':>10}"]
    for name in [*reports, "mean"]:
        for side, rows in table.items():
            row = means.get(side) if name == "mean" else rows.get(name)
            if row is not None:
                lines.append(
                    f"{name:<10}{side:<{width}}{' / '.join(f'{row[k]:.3f}' for k in SUITE_STATS):>22}"
                    f"{row['images_per_second']:>10.1f}"
                )
    return "\n".join(lines), means


def run_suite(args: argparse.Namespace, extra: Sequence[str]) -> None:
    """The comparison on each set of ``args.suite`` in turn, each into OUT/SET; one table of all; OUT/suite.json."""
    out = args.out.resolve()
    reports = {}
    for name in SUITES[args.suite]:
        root = SHARED_DATA / name
        if not root.is_dir():
            raise SystemExit(
                f"error: {root}: no such folder (the suite's sets are read from ../shared/data beside the checkout)"
            )
        reports[name] = compare(argparse.Namespace(**{**vars(args), "root": root}), out / name, extra)
    table, means = suite_table(reports)
    cpu = cpu_description()
    print(
        f"\nthe {args.suite} suite, training {args.budget_seconds:.0f} s each, seed {args.seed}, "
        f"{machine_line(cpu, args.threads, versions('torch', 'ultralytics'))}\n{table}"
    )
    write_report(
        out / "suite.json",
        {
            "suite": args.suite,
            "budget_seconds": args.budget_seconds,
            "seed": args.seed,
            "threads": args.threads,
            "cpu": cpu,
            "means": means,
            "sets": {name: str(out / name / "comparison.json") for name in reports},
        },
    )


def compare(args: argparse.Namespace, out: Path, extra: Sequence[str]) -> dict[str, Any]:
    """The comparison on the set ``args.root``, into ``out``: trains and scores each side, prints the table, writes
    ``out/comparison.json``; returns its report."""
    for folder in SPLITS.values():
        if not annotation_file(args.root, folder).is_file():
            raise SystemExit(f"error: {annotation_file(args.root, folder)}: no such file (expected a COCO-layout set)")
    torch.set_num_threads(args.threads)
    shutil.rmtree(out / "yolo_data", ignore_errors=True)  # with Ultralytics' label caches of an earlier run
    data_yaml = write_yolo_dataset(args.root, out / "yolo_data")
    errors = check_round_trip(args.root, out / "yolo_data")
    print(f"COCO -> YOLO labels -> COCO: AP 1.0, boxes back to within {max(errors.values()):.1e} px")

    vtx = run_vision_tx(args, out, extra) if args.vision_tx else None
    budget = args.budget_seconds or vtx["train_seconds"]
    yolos = {name: run_yolo(name, data_yaml, out, budget, args) for name in args.yolo}

    report = {
        "data": str(Path(args.root).resolve()),
        "budget_seconds": budget,
        "threads": args.threads,
        "seed": args.seed,
        "workers": args.workers,
        "cpu": cpu_description(),
        "accelerator": args.accelerator,
        "gpu": torch.cuda.get_device_name(0) if args.accelerator == "gpu" else None,
        "versions": versions("torch", "torchvision", "lightning", "pycocotools", "ultralytics"),
        "round_trip_max_error_px": errors,
        "max_detections": MAX_DETECTIONS,
        "score_floor": SCORE_FLOOR,
        "vision_tx": vtx and {"config": args.config, "extra_args": extra, "processes": args.processes, **vtx},
        "yolo": yolos,
    }
    timing = ("train_seconds", "cpu_seconds", "images_seen", "images_per_second")
    merged = ("AP", "AP50")

    def column(run: dict[str, Any], steps: int) -> dict[str, Any]:
        return {
            **run["coco"],
            **{f"{k} classes merged": run["coco_classes_merged"][k] for k in merged},
            **{f"{k} no wrong classes": run["coco_without_wrong_classes"][k] for k in merged},
            "wrong classes >= 0.2": run["wrong_class_detections"],
            **{k: run[k] for k in timing},
            "steps/epochs": steps,
        }

    columns = {args.config: column(vtx, vtx["steps"])} if vtx else {}
    for name, yolo in yolos.items():
        columns[YOLO_MODELS[name]] = {**column(yolo, yolo["epochs"]), **yolo["ultralytics_val"]}
    where = f"{report['gpu']} (vision_tx {GPU_PRECISION}, Ultralytics AMP), " if report["gpu"] else ""
    print(
        side_by_side(
            f"\nbox detection on {args.root} val2017, training {budget:.0f} s each (vision_tx on {args.processes} "
            f"process{'es' * (args.processes > 1)})\n"
            f"{where}{machine_line(report['cpu'], args.threads, report['versions'])}",
            [
                *STAT_NAMES,
                *(f"{k} classes merged" for k in merged),
                *(f"{k} no wrong classes" for k in merged),
                "wrong classes >= 0.2",
                *timing,
                "steps/epochs",
                "own AP50",
                "own AP",
            ],
            columns,
        )
    )
    print(
        "no wrong classes: scored without the detections that overlap an object of another class "
        "and none of their own\n"
        "(IoU 0.5; what the classes cost); wrong classes >= 0.2: how many of those score 0.2 or more\n"
        "own AP50, own AP: Ultralytics' validation of its final weights (its own mAP, not pycocotools'), a cross-check"
    )
    write_report(out / "comparison.json", report)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    args, extra = parse_with_vision_tx_options(parser(), sys.argv[1:] if argv is None else argv)
    check_options(args)
    if args.suite:
        run_suite(args, extra)
    else:
        compare(args, args.out.resolve(), extra)


if __name__ == "__main__":
    main()
