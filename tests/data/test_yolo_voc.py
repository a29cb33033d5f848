"""The detection datamodule on YOLO and Pascal VOC copies of COCO-layout sets: the same targets, the same training;
bad YOLO rows and VOC objects stop with one line naming the file, the row or object and the problem."""

from __future__ import annotations

import json
import logging
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from tests.data.test_coco import _ann, _write_dataset
from tests.lightning.tools import run_tool_in_process
from vision_tx.checkpoint import read_checkpoint
from vision_tx.data.coco import CocoDetection, CocoFormatError
from vision_tx.data.detection import CocoDetectionDataModule
from vision_tx.data.invalid import SkippedRecordsWarning
from vision_tx.data.layouts import LayoutFormatError, write_voc_layout, write_yolo_layout
from vision_tx.data.toy import make_toy_coco

SPLITS = {"train": "train2017", "val": "val2017"}
LAYOUTS = ("coco", "yolo", "voc")


def write_copies(coco_root: Path, out: Path) -> dict[str, Path]:
    """The COCO-layout set at ``coco_root`` and its YOLO and VOC copies under ``out``, by layout."""
    for split, folder in SPLITS.items():
        ann_file = coco_root / "annotations" / f"instances_{folder}.json"
        write_yolo_layout(ann_file, coco_root / folder, out / "yolo", split)
        write_voc_layout(ann_file, coco_root / folder, out / "voc", split)
    return {"coco": coco_root, "yolo": out / "yolo", "voc": out / "voc"}


@pytest.fixture(scope="module")
def toy_copies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("toy_layouts")
    return write_copies(make_toy_coco(out / "coco", num_train=16, num_val=8), out)


@pytest.fixture(scope="module")
def bccd_copies(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> dict[str, Path]:
    return write_copies(shared_data / "bccd", tmp_path_factory.mktemp("bccd_layouts"))


def dataset_fields(dataset: CocoDetection) -> dict[str, np.ndarray]:
    """What a COCO dataset yields, read from its arrays (no image decoded): the images' file names and sizes,
    and each image's training boxes and labels."""
    return {
        "names": np.array([Path(str(n)).name for n in dataset.file_names]),
        "heights": dataset.heights,
        "widths": dataset.widths,
        "boxes": dataset.boxes,
        "labels": dataset.labels,
        "offsets": dataset.offsets,
    }


def assert_same_targets(reference: CocoDetectionDataModule, other: CocoDetectionDataModule) -> None:
    assert (other.num_classes, other.category_names) == (reference.num_classes, reference.category_names)
    for split in SPLITS.values():
        expected, found = (dataset_fields(CocoDetection(*data.split_paths(split))) for data in (reference, other))
        assert len(expected["names"]) and expected["names"].tolist() == found["names"].tolist()
        for key in ("heights", "widths", "labels", "offsets"):
            assert np.array_equal(expected[key], found[key]), key
        np.testing.assert_allclose(found["boxes"], expected["boxes"], rtol=0, atol=1e-3)


@pytest.mark.parametrize("layout", ["yolo", "voc"])
def test_toy_copies_give_the_coco_targets(
    toy_copies: dict[str, Path], layout: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="vision_tx.data.detection"):
        reference = CocoDetectionDataModule(root=str(toy_copies["coco"]), num_workers=0)
        data = CocoDetectionDataModule(root=str(toy_copies[layout]), num_workers=0)
    said = [r.getMessage() for r in caplog.records if r.name == "vision_tx.data.detection"]
    assert said == [f"{toy_copies['coco']}: a COCO layout (annotations/instances_*.json)", said[1]]
    assert said[1].startswith(f"{toy_copies[layout]}: a {'YOLO' if layout == 'yolo' else 'Pascal VOC'} layout (")
    assert_same_targets(reference, data)
    data.setup("fit")
    reference.setup("fit")
    for dataset in ("train_dataset", "val_dataset"):  # through the transforms: the same image and target
        torch.manual_seed(0)
        image, target = getattr(reference, dataset)[3]
        torch.manual_seed(0)
        other_image, other_target = getattr(data, dataset)[3]
        assert torch.equal(image, other_image) and torch.equal(target["labels"], other_target["labels"])
        torch.testing.assert_close(other_target["boxes"], target["boxes"], rtol=0, atol=1e-3)


@pytest.mark.parametrize("layout", ["yolo", "voc"])
def test_bccd_copies_give_the_coco_targets(bccd_copies: dict[str, Path], layout: str) -> None:
    reference = CocoDetectionDataModule(root=str(bccd_copies["coco"]), num_workers=0)
    assert_same_targets(reference, CocoDetectionDataModule(root=str(bccd_copies[layout]), num_workers=0))
    # The validation ground truth pycocotools scores: the same boxes, classes and areas.
    expected = reference.val_coco.dataset["annotations"]
    found = CocoDetectionDataModule(root=str(bccd_copies[layout]), num_workers=0).val_coco.dataset["annotations"]
    assert [(a["category_id"], a["iscrowd"]) for a in found] == [(a["category_id"], a["iscrowd"]) for a in expected]
    np.testing.assert_allclose(
        [a["bbox"] + [a["area"]] for a in found], [a["bbox"] + [a["area"]] for a in expected], atol=1e-3
    )


# rtdetr_convnext_toy, at batch 2 and 96 px: 4 steps and a validation from each layout in seconds.
SMALL = [
    "--config",
    "rtdetr_convnext_toy",
    "--data.batch_size",
    "2",
    "--data.train_transform.init_args.scales",
    "[96]",
    "--data.train_transform.init_args.max_size",
    "128",
    "--data.val_transform.init_args.size",
    "96",
    "--data.val_transform.init_args.max_size",
    "128",
    "--trainer.logger",
    "false",
    "--trainer.enable_progress_bar",
    "false",
]


def train_four_steps(root: Path, out: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """``rtdetr_convnext_toy`` trained 4 steps on ``root`` and validated: its weights and its ``metrics.json``."""
    out.mkdir()
    run_tool_in_process(
        "train.py",
        *SMALL,
        "--data.root",
        str(root),
        "--trainer.max_steps",
        "4",
        "--trainer.val_check_interval",
        "4",
        "--trainer.limit_val_batches",
        "4",
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.default_root_dir",
        str(out),
        cwd=out,
    )
    checkpoint = read_checkpoint(next(out.rglob("last.ckpt")))
    return checkpoint["state_dict"], json.loads(next(out.rglob("metrics.json")).read_text())["bbox"]


@pytest.mark.parametrize("copies", ["toy_copies", "bccd_copies"])
def test_training_from_each_layout_gives_the_same_weights_and_metrics(
    copies: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    roots = request.getfixturevalue(copies)
    runs = {layout: train_four_steps(roots[layout], tmp_path / layout) for layout in LAYOUTS}
    weights, metrics = runs["coco"]
    assert weights and "AP" in metrics
    # The toy set's 'area' is the mask's, a copy's the box's: there the small/medium/large ranges may differ.
    same = [k for k, v in metrics.items() if isinstance(v, float) and (copies == "bccd_copies" or k[-1] not in "sml")]
    assert {"AP", "AP50", "best_f1", "best_f1_threshold"} <= set(same)
    for layout in ("yolo", "voc"):
        other_weights, other_metrics = runs[layout]
        assert other_weights.keys() == weights.keys()
        for name, tensor in weights.items():
            torch.testing.assert_close(other_weights[name], tensor, rtol=0, atol=1e-6, msg=f"{layout}: {name}")
        for key in same:
            assert other_metrics[key] == pytest.approx(metrics[key], abs=1e-9), (layout, key)
        assert other_metrics["confusion_matrix"] == metrics["confusion_matrix"], layout  # the report's counts too


# ------------------------------------------------------------------------------------------------ YOLO: bad input


@pytest.fixture()
def yolo_root(tmp_path: Path) -> Path:
    """A YOLO set of two 40x30 images per split, one box each (``labels/train/a.txt``, ...)."""
    for split in ("train", "val"):
        (tmp_path / "images" / split).mkdir(parents=True)
        (tmp_path / "labels" / split).mkdir(parents=True)
        for name in ("a", "b"):
            Image.new("RGB", (40, 30)).save(tmp_path / "images" / split / f"{name}.png")
            (tmp_path / "labels" / split / f"{name}.txt").write_text("0 0.5 0.5 0.25 0.5\n")
    (tmp_path / "data.yaml").write_text("train: images/train\nval: images/val\nnames: [thing, other]\n")
    return tmp_path


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("0 0.5 0.5 0.25", "4 fields, a detection row has 5: class cx cy w h"),
        ("0 0.5 0.5 0.25 0.5 0.1", "6 fields, a detection row has 5"),
        ("0 0.5 1.5 0.25 0.5", "cy outside [0, 1]: a YOLO box is fractions of the image's width and height"),
        ("1 0.5 0.5 -0.1 0.5", "w outside [0, 1]"),
        ("2 0.5 0.5 0.25 0.5", "class 2 is not in 'names' of"),
        ("0.5 0.5 0.5 0.25 0.5", "class 0.5 is not in 'names'"),
        ("0 0.5 x 0.25 0.5", "not a number"),
        (
            "0 0.95 0.5 0.5 0.5",
            "the box reaches x 28.0 to 48.0, y 7.5 to 22.5: outside the image, which is 40 wide and 30 high",
        ),
    ],
)
def test_bad_yolo_row_names_the_label_file_and_the_row(yolo_root: Path, row: str, problem: str) -> None:
    label = yolo_root / "labels" / "val" / "b.txt"
    label.write_text(f"0 0.5 0.5 0.25 0.5\n\n{row}\n")
    with pytest.raises(LayoutFormatError) as err:
        CocoDetectionDataModule(root=str(yolo_root), num_workers=0)
    assert str(err.value).startswith(f"{label}: row 3: {problem}") and "\n" not in str(err.value)
    assert str(err.value).endswith(f"(the row: {row!r})")


def test_yolo_skip_invalid_leaves_the_image_out_with_one_warning(yolo_root: Path) -> None:
    (yolo_root / "labels" / "train" / "b.txt").write_text("0 0.5 0.5 0.25 0.5\n7 0.5 0.5 0.25 0.5\n")
    data = CocoDetectionDataModule(root=str(yolo_root), num_workers=0, skip_invalid=True)
    with pytest.warns(SkippedRecordsWarning) as caught:
        data.setup("fit")
    assert len(caught) == 1 and str(caught[0].message).startswith(
        f"{yolo_root / 'data.yaml'} (train2017): skipped 1 of 2 images with invalid data (skip_invalid=True):\n"
        f"  {yolo_root / 'labels/train/b.txt'}: row 2: class 7 is not in 'names'"
    )
    assert [Path(str(n)).name for n in data.train_dataset.file_names] == ["a.png"] and len(data.val_dataset) == 2


def test_yolo_missing_label_file_is_no_objects_said_once(yolo_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    for name in ("a", "b"):
        (yolo_root / "labels" / "val" / f"{name}.txt").unlink()
    with caplog.at_level(logging.INFO, logger="vision_tx.data.layouts"):
        data = CocoDetectionDataModule(root=str(yolo_root), num_workers=0)
    said = [r.getMessage() for r in caplog.records if r.name == "vision_tx.data.layouts"]
    assert said == [
        f"{yolo_root / 'data.yaml'} (val2017): 2 of 2 images have no label file "
        f"({yolo_root / 'labels/val/a.txt'}, ...): no objects on them"
    ]
    data.setup("validate")
    assert data.val_dataset[1][1]["boxes"].shape == (0, 4) and not data.val_coco.dataset["annotations"]


def test_yolo_image_list_missing_image_names_the_line(yolo_root: Path) -> None:
    """A split given as a list of images (relative to the list's folder), the root as the yaml file itself."""
    (yolo_root / "val.txt").write_text("images/val/a.png\n\nimages/val/gone.png\n")
    (yolo_root / "data.yaml").write_text("train: images/train\nval: val.txt\nnames: {0: thing, 1: other}\n")
    with pytest.raises(
        LayoutFormatError,
        match=re.escape(
            f"{yolo_root / 'images/val/gone.png'}: image file not found (line 3 of {yolo_root / 'val.txt'})"
        ),
    ):
        CocoDetectionDataModule(root=str(yolo_root / "data.yaml"), num_workers=0)
    (yolo_root / "val.txt").write_text("images/val/b.png\nimages/val/a.png\n")
    data = CocoDetectionDataModule(root=str(yolo_root / "data.yaml"), num_workers=0)
    assert [img["file_name"] for img in data.val_coco.dataset["images"]] == ["images/val/b.png", "images/val/a.png"]
    assert data.val_coco.dataset["annotations"][0]["bbox"] == [15.0, 7.5, 10.0, 15.0]
    assert data.category_names == {1: "thing", 2: "other"} and data.num_classes == 3
    # What a model too small for the labels is told: the names' file, not the converted annotations.
    assert data.label_extent() == (f"{yolo_root / 'data.yaml'} (YOLO class k read as category id k + 1)", 2, "other")


def test_wrong_root_names_the_three_layouts(tmp_path: Path) -> None:
    with pytest.raises(
        CocoFormatError,
        match=r"(?s)not a COCO detection root.*or a YOLO layout: .*/data\.yaml\n"
        r"  or a Pascal VOC layout: .*\{Annotations,JPEGImages,ImageSets/Main\}/$",
    ):
        CocoDetectionDataModule(root=str(tmp_path))


# ------------------------------------------------------------------------------------------------- VOC: bad input


@pytest.fixture()
def voc_root(tmp_path: Path) -> Path:
    """A VOC copy (train and val: the same two 40x30 images) of a COCO set with category ids 1 and 7."""
    images = [("a.png", Image.new("RGB", (40, 30))), ("b.png", Image.new("RGB", (40, 30)))]
    (tmp_path / "coco").mkdir()
    anns = [_ann(1, [1, 2, 10, 10]), _ann(2, [30, 20, 10, 10], 7, iscrowd=1, image_id=2)]
    image_dir, ann_file = _write_dataset(tmp_path / "coco", anns, images)
    write_voc_layout(ann_file, image_dir, tmp_path / "voc", "train")
    (tmp_path / "voc" / "ImageSets" / "Main" / "val.txt").write_text("a\nb\n")
    return tmp_path / "voc"


def _object(root: Path, image: str = "b") -> ET.Element:
    return ET.parse(root / "Annotations" / f"{image}.xml").getroot().find("object")


def test_voc_difficult_objects_are_crowd_regions_and_labels_txt_keeps_the_ids(voc_root: Path) -> None:
    assert (voc_root / "labels.txt").read_text() == "thing\n\n\n\n\n\nother\n"
    assert _object(voc_root).findtext("difficult") == "1" and _object(voc_root).findtext("bndbox/xmin") == "31"
    data = CocoDetectionDataModule(root=str(voc_root), num_workers=0)
    assert data.category_names == {1: "thing", 7: "other"} and data.num_classes == 8
    assert data.label_extent() == (f"{voc_root / 'labels.txt'} (line k: category id k)", 7, "other")
    assert [(a["bbox"], a["category_id"], a["iscrowd"]) for a in data.val_coco.dataset["annotations"]] == [
        ([1.0, 2.0, 10.0, 10.0], 1, 0),
        ([30.0, 20.0, 10.0, 10.0], 7, 1),
    ]
    data.setup("validate")
    assert data.val_dataset[1][1]["labels"].tolist() == []  # a crowd region: no training target
    (voc_root / "labels.txt").unlink()  # then the training annotations' names, sorted
    data = CocoDetectionDataModule(root=str(voc_root), num_workers=0)
    assert data.category_names == {1: "other", 2: "thing"}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"name": "dog"}, "b.xml: object 1: class 'dog' is not one of the classes ['other', 'thing'] (from "),
        (
            {"bndbox/xmax": "45"},
            "b.xml: object 1: box xmin 31, ymin 21, xmax 45, ymax 30 lies outside the image, "
            "which is 40 wide and 30 high",
        ),
        ({"bndbox/xmax": "20"}, "b.xml: object 1: box xmin 31, ymin 21, xmax 20, ymax 30 has a negative size"),
        ({"bndbox/ymin": "top"}, "b.xml: object 1: <bndbox> needs numbers xmin, ymin, xmax, ymax"),
    ],
)
def test_bad_voc_object_names_the_file_and_the_object(voc_root: Path, change: dict[str, str], problem: str) -> None:
    tree = ET.parse(voc_root / "Annotations" / "b.xml")
    for path, value in change.items():
        tree.getroot().find(f"object/{path}").text = value
    tree.write(voc_root / "Annotations" / "b.xml")
    with pytest.raises(LayoutFormatError) as err:
        CocoDetectionDataModule(root=str(voc_root), num_workers=0, val_split="val")
    assert str(err.value).startswith(f"{voc_root / 'Annotations' / problem}") and "\n" not in str(err.value)


def test_voc_missing_image_or_annotation_names_the_image_set_line(voc_root: Path) -> None:
    (voc_root / "JPEGImages" / "b.png").unlink()
    with pytest.raises(
        LayoutFormatError,
        match=re.escape(
            f"{voc_root / 'JPEGImages/b.png'}: image file not found (the image of {voc_root / 'Annotations/b.xml'}, "
            f"line 2 of {voc_root / 'ImageSets/Main/val.txt'})"
        ),
    ):
        CocoDetectionDataModule(root=str(voc_root), num_workers=0)
    (voc_root / "ImageSets" / "Main" / "val.txt").write_text("a\nc\nb\n")
    with pytest.warns(
        SkippedRecordsWarning,
        match=re.escape(
            f"{voc_root / 'ImageSets/Main/val.txt'}: skipped 2 of 3 images with invalid data (skip_invalid=True):\n"
            f"  {voc_root / 'Annotations/c.xml'}: annotation file not found (line 2 of "
        ),
    ):
        data = CocoDetectionDataModule(root=str(voc_root), num_workers=0, skip_invalid=True)
    assert [img["file_name"] for img in data.val_coco.dataset["images"]] == ["a.png"]


def test_writers_refuse_a_category_id_0(tmp_path: Path) -> None:
    image_dir, ann_file = _write_dataset(tmp_path, [])
    dataset = json.loads(ann_file.read_text())
    dataset["categories"][0]["id"] = 0
    ann_file.write_text(json.dumps(dataset))
    with pytest.raises(LayoutFormatError, match=r"category id 0 has no YOLO class \(class k is category id k \+ 1\)"):
        write_yolo_layout(ann_file, image_dir, tmp_path / "yolo")
    with pytest.raises(LayoutFormatError, match=r"category id 0 has no line in labels\.txt"):
        write_voc_layout(ann_file, image_dir, tmp_path / "voc")


def test_yolo_names_with_gaps_keep_the_category_ids(tmp_path: Path) -> None:
    image_dir, ann_file = _write_dataset(tmp_path, [_ann(1, [0, 0, 8, 6], 7)])
    for split in ("train", "val"):
        write_yolo_layout(ann_file, image_dir, tmp_path / "yolo", split)
    assert yaml.safe_load((tmp_path / "yolo" / "data.yaml").read_text())["names"] == {0: "thing", 6: "other"}
    assert (tmp_path / "yolo" / "labels" / "val" / "a.txt").read_text() == "6 0.1 0.1 0.2 0.2\n"
    data = CocoDetectionDataModule(root=str(tmp_path / "yolo"), num_workers=0)
    assert data.category_names == {1: "thing", 7: "other"} and data.num_classes == 8
