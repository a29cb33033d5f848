"""COCO panoptic loading and writing on the real panopticapi sample and coco128, and on broken copies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torchvision import tv_tensors

from vision_tx.data.coco import CocoFormatError
from vision_tx.data.coco_panoptic import (
    CocoPanoptic,
    coco_panoptic_split_paths,
    id_to_rgb,
    load_panoptic_json,
    read_panoptic_png,
    rgb_to_id,
    write_panoptic_png,
    write_panoptic_predictions,
)
from vision_tx.data.collate import collate_detection
from vision_tx.data.toy_panoptic import CATEGORIES as TOY_CATEGORIES
from vision_tx.data.toy_panoptic import make_toy_coco_panoptic, toy_coco_panoptic_root
from vision_tx.data.transforms import DetrTrainTransform


@pytest.fixture(scope="module")
def sample(shared_data: Path) -> tuple[Path, Path, Path]:
    """``(image_dir, ann_file, png_dir)`` of the panopticapi sample (2 val2017 images, 50 segments)."""
    base = shared_data / "panoptic_sample"
    return base / "input_images", base / "panoptic_examples.json", base / "panoptic_examples"


def test_rgb_id_conversion() -> None:
    # panopticapi's rule: id = R + 256 G + 256^2 B.
    assert rgb_to_id(torch.tensor([7, 2, 1], dtype=torch.uint8).view(3, 1, 1)).item() == 7 + 256 * 2 + 65536 * 1
    ids = torch.randint(0, 256**3, (2, 5, 6))
    rgb = id_to_rgb(ids)
    assert rgb.shape == (2, 3, 5, 6) and rgb.dtype == torch.uint8
    assert torch.equal(rgb_to_id(rgb), ids)


def test_png_roundtrip_keeps_ids_and_segments_info(sample: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, ann_file, png_dir = sample
    raw = json.loads(ann_file.read_text())
    predictions = [
        {
            "image_id": a["image_id"],
            "file_name": a["file_name"],
            "segments_info": a["segments_info"],
            "segment_ids": read_panoptic_png(png_dir / a["file_name"]),
        }
        for a in raw["annotations"]
    ]
    out_json, out_dir = tmp_path / "pred.json", tmp_path / "pred"
    for _ in range(2):  # the second write replaces the first folder
        write_panoptic_predictions(out_json, out_dir, predictions, raw["categories"])
    written = load_panoptic_json(out_json, keys=("annotations", "categories"))
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(a["file_name"] for a in raw["annotations"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind
    assert written["categories"] == raw["categories"]
    for original, again in zip(raw["annotations"], written["annotations"]):
        assert again["image_id"] == original["image_id"]
        assert again["segments_info"] == original["segments_info"]  # area and bbox recomputed from the map
        again_ids = read_panoptic_png(out_dir / again["file_name"])
        assert torch.equal(again_ids, read_panoptic_png(png_dir / original["file_name"]))


def test_write_png_rejects_out_of_range_ids(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"in \[0, 16777215\]"):
        write_panoptic_png(tmp_path / "x.png", torch.tensor([[0, 256**3]]))


def test_sample_targets_match_the_json(sample: tuple[Path, Path, Path]) -> None:
    dataset = CocoPanoptic(*sample)
    raw = json.loads(sample[1].read_text())
    assert len(dataset) == 2 and len(dataset.categories) == 133
    assert sum(c["isthing"] for c in dataset.categories) == 80
    crowd_total = 0
    for index, ann in enumerate(raw["annotations"]):
        image, target = dataset[index]
        info = next(img for img in raw["images"] if img["id"] == ann["image_id"])
        assert isinstance(image, tv_tensors.Image) and image.dtype == torch.uint8
        assert image.shape == (3, info["height"], info["width"])
        segments = [s for s in ann["segments_info"] if not s["iscrowd"]]
        crowd_total += len(ann["segments_info"]) - len(segments)
        ids = read_panoptic_png(sample[2] / ann["file_name"])
        assert isinstance(target["masks"], tv_tensors.Mask) and target["masks"].dtype == torch.bool
        assert target["masks"].shape == (len(segments), info["height"], info["width"])
        for mask, segment in zip(target["masks"], segments):
            assert torch.equal(mask, ids == segment["id"])
            assert int(mask.sum()) == segment["area"]
        assert target["labels"].tolist() == [s["category_id"] for s in segments]
        x, y, w, h = torch.tensor([s["bbox"] for s in segments], dtype=torch.float32).unbind(1)
        assert isinstance(target["boxes"], tv_tensors.BoundingBoxes) and target["boxes"].format.name == "XYXY"
        assert torch.equal(target["boxes"].as_subclass(torch.Tensor), torch.stack([x, y, x + w, y + h], 1))
        assert target["image_id"] == ann["image_id"]
        assert target["orig_size"].tolist() == target["size"].tolist() == [info["height"], info["width"]]
        gt_ids, gt_segments = dataset.ground_truth(ann["image_id"])
        assert torch.equal(gt_ids, ids) and len(gt_segments) == len(ann["segments_info"])
    assert crowd_total == 3  # two crowds of people and one of horses, left out of the targets


def test_coco128_release_layout(shared_data: Path) -> None:
    dataset = CocoPanoptic(*coco_panoptic_split_paths(shared_data / "coco128", "train2017"))
    assert len(dataset) == 100
    image, target = dataset[0]
    assert target["masks"].shape[1:] == image.shape[1:] and len(target["labels"]) == len(target["masks"]) > 0


def test_wrong_root_layout_shows_the_expected_one(shared_data: Path) -> None:
    with pytest.raises(CocoFormatError, match=r"panoptic_val2017\.json") as err:
        coco_panoptic_split_paths(shared_data / "coco128", "val2017")
    assert "Expected the layout" in str(err.value) and "annotations/panoptic_val2017/*.png" in str(err.value)


def test_transforms_and_collate_carry_the_masks(sample: tuple[Path, Path, Path]) -> None:
    transforms = DetrTrainTransform(scales=(96,), max_size=160, crop_scales=(96,), crop_size=(64, 96))
    dataset = CocoPanoptic(*sample, transforms=transforms)
    batch = collate_detection([dataset[0], dataset[1]])
    for _image, target in zip(batch["images"], batch["targets"]):
        h, w = target["size"].tolist()
        assert target["masks"].shape[1:] == (h, w)
        assert len(target["masks"]) == len(target["labels"]) == len(target["boxes"])


@pytest.fixture()
def broken(sample: tuple[Path, Path, Path], tmp_path: Path) -> tuple[Path, Path, Path, dict]:
    """A writable copy of the sample and its JSON, to break."""
    image_dir, png_dir = tmp_path / "images", tmp_path / "pngs"
    shutil.copytree(sample[0], image_dir)
    shutil.copytree(sample[2], png_dir)
    return image_dir, tmp_path / "panoptic.json", png_dir, json.loads(sample[1].read_text())


def _dataset(broken: tuple[Path, Path, Path, dict]) -> CocoPanoptic:
    image_dir, ann_file, png_dir, raw = broken
    ann_file.write_text(json.dumps(raw))
    return CocoPanoptic(image_dir, ann_file, png_dir)


def test_error_missing_png(broken: tuple[Path, Path, Path, dict]) -> None:
    (broken[2] / "000000439180.png").unlink()
    with pytest.raises(CocoFormatError, match=r"pngs/000000439180\.png: panoptic PNG file not found \(image id 439180"):
        _dataset(broken)


def test_error_png_id_missing_from_segments_info(broken: tuple[Path, Path, Path, dict]) -> None:
    del broken[3]["annotations"][1]["segments_info"][0]  # segment 3937500 of image 439180
    dataset = _dataset(broken)
    message = r"000000439180\.png: segment id\(s\) \[3937500\] are not in its segments_info"
    with pytest.raises(CocoFormatError, match=message):
        dataset[1]


def test_warning_segment_absent_from_png(broken: tuple[Path, Path, Path, dict]) -> None:
    broken[3]["annotations"][0]["segments_info"].append({"id": 99, "category_id": 1, "iscrowd": 0})
    dataset = _dataset(broken)
    with pytest.warns(UserWarning, match=r"000000142238\.png: segment id\(s\) \[99\] .* cover no pixel"):
        _, target = dataset[0]
    assert len(target["labels"]) == 17


def test_error_png_size_differs_from_image(broken: tuple[Path, Path, Path, dict]) -> None:
    ids = read_panoptic_png(broken[2] / "000000142238.png")
    write_panoptic_png(broken[2] / "000000142238.png", ids[:-1])
    dataset = _dataset(broken)
    message = r"000000142238\.png: the panoptic PNG is \(426, 640\) .* is \(427, 640\)"
    with pytest.raises(CocoFormatError, match=message):
        dataset[0]


def test_error_unknown_category(broken: tuple[Path, Path, Path, dict]) -> None:
    broken[3]["annotations"][0]["segments_info"][2]["category_id"] = 999
    message = r"panoptic\.json: segment id 2035955 of 000000142238\.png .* unknown category id 999"
    with pytest.raises(CocoFormatError, match=message):
        _dataset(broken)


def test_error_not_an_rgb_png(tmp_path: Path) -> None:
    from PIL import Image

    Image.new("L", (4, 3)).save(tmp_path / "grey.png")
    with pytest.raises(CocoFormatError, match=r"grey\.png: a panoptic PNG is 8-bit RGB .* got PNG mode L"):
        read_panoptic_png(tmp_path / "grey.png")


def test_toy_dataset_is_deterministic_and_loads(tmp_path: Path) -> None:
    first = make_toy_coco_panoptic(tmp_path / "a", num_train=3, num_val=2)
    second = make_toy_coco_panoptic(tmp_path / "b", num_train=3, num_val=2)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    assert all((first / f).read_bytes() == (second / f).read_bytes() for f in files)
    dataset = CocoPanoptic(*coco_panoptic_split_paths(first, "train2017"))
    isthing = {c["id"]: c["isthing"] for c in TOY_CATEGORIES}
    for _image, target in (dataset[i] for i in range(len(dataset))):
        labels = target["labels"].tolist()
        assert sorted(label for label in labels if not isthing[label]) == [4, 5]  # sky and ground
        assert 1 <= sum(isthing[label] for label in labels) <= 3
        assert not (target["masks"].sum(0) > 1).any()  # segments do not overlap
        assert (target["masks"].sum(0) == 0).any()  # unlabelled outlines around the shapes


def test_toy_root_is_built_once(tmp_path: Path) -> None:
    root = toy_coco_panoptic_root(tmp_path / "toy")
    stamp = (root / "annotations" / "panoptic_val2017.json").stat().st_mtime_ns
    assert toy_coco_panoptic_root(tmp_path / "toy") == root
    assert (root / "annotations" / "panoptic_val2017.json").stat().st_mtime_ns == stamp
    assert len(CocoPanoptic(*coco_panoptic_split_paths(root, "val2017"))) == 16
    assert [p.name for p in tmp_path.iterdir()] == ["toy"]
