"""The COCO panoptic datamodule on the toy panoptic set and on coco128's panoptic annotations."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.ops import box_iou, masks_to_boxes

from vision_tx.data.coco import CocoFormatError
from vision_tx.data.coco_panoptic import read_panoptic_png
from vision_tx.data.panoptic import CocoPanopticDataModule
from vision_tx.data.transforms import DetrTrainTransform, DetrValTransform


@pytest.fixture(scope="module")
def toy_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("toy_panoptic"))


def test_toy_datamodule_batches_masks_with_the_images(toy_cache: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="vision_tx.data.detection"):
        data = CocoPanopticDataModule(
            toy_cache_dir=toy_cache,
            train_transform=DetrTrainTransform(scales=(96, 128), max_size=160, crop_scales=(96,), crop_size=(64, 96)),
            val_transform=DetrValTransform(size=64, max_size=96),
            batch_size=4,
            num_workers=0,
        )
    assert "built-in toy dataset" in caplog.text and "annotations/panoptic_*.json" in caplog.text
    assert data.category_names == {1: "circle", 2: "square", 3: "triangle", 4: "sky", 5: "ground"}
    assert data.is_thing == {1: True, 2: True, 3: True, 4: False, 5: False}
    assert data.num_classes == 6
    assert data.val_ann_file.name == "panoptic_val2017.json" and data.val_png_dir.name == "panoptic_val2017"
    assert data.val_ann_file.is_file() and any(data.val_png_dir.glob("*.png"))
    data.setup("fit")
    for loader in (data.train_dataloader(), data.val_dataloader()):
        batch = next(iter(loader))
        for mask, target in zip(batch["pixel_mask"], batch["targets"]):
            h, w = target["size"].tolist()
            masks = target["masks"]
            assert masks.dtype.is_floating_point is False and masks.shape[1:] == (h, w) and not mask[:h, :w].any()
            assert len(masks) == len(target["labels"]) == len(target["boxes"])
            # The masks moved with the boxes: each non-empty mask's own box overlaps its target box
            # (they differ by the pixels that nearest-neighbour resizing adds or drops).
            present = masks.flatten(1).any(1)
            mask_boxes = masks_to_boxes(masks[present]) + torch.tensor([0.0, 0.0, 1.0, 1.0])
            assert (box_iou(mask_boxes, target["boxes"][present]).diagonal() > 0.7).all()


def test_box_ground_truth_holds_the_thing_segments(toy_cache: str) -> None:
    data = CocoPanopticDataModule(toy_cache_dir=toy_cache, num_workers=0)
    raw = json.loads(data.val_ann_file.read_text())
    things = [(a["image_id"], s) for a in raw["annotations"] for s in a["segments_info"] if s["category_id"] <= 3]
    coco = data.val_coco
    assert sorted(coco.getCatIds()) == [1, 2, 3] and sorted(coco.getImgIds()) == sorted(i["id"] for i in raw["images"])
    assert len(coco.anns) == len(things) and sorted(coco.anns) == list(range(1, len(things) + 1))
    for ann, (image_id, segment) in zip(coco.anns.values(), things):
        assert (ann["image_id"], ann["category_id"], ann["bbox"]) == (image_id, segment["category_id"], segment["bbox"])
        # The box is the one around the segment's pixels in the ground-truth PNG.
        png = read_panoptic_png(data.val_png_dir / f"{image_id:012d}.png").numpy()
        ys, xs = np.nonzero(png == segment["id"])
        assert ann["bbox"] == [xs.min(), ys.min(), xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min()]


def test_coco128_panoptic_targets_leave_crowd_out(shared_data: Path) -> None:
    root = shared_data / "coco128"
    data = CocoPanopticDataModule(str(root), train_split="train2017", val_split="train2017", num_workers=0)
    assert data.num_classes == 201 and sum(data.is_thing.values()) == 80 and len(data.categories) == 133
    data.setup("validate")
    raw = json.loads(data.val_ann_file.read_text())
    crowded = next(a for a in raw["annotations"] if any(s["iscrowd"] for s in a["segments_info"]))
    index = [a["image_id"] for a in raw["annotations"]].index(crowded["image_id"])
    _, target = data.val_dataset[index]
    expected = sorted(s["category_id"] for s in crowded["segments_info"] if not s["iscrowd"])
    assert sorted(target["labels"].tolist()) == expected
    assert data.val_coco.getAnnIds(imgIds=[crowded["image_id"]], iscrowd=True)


def test_wrong_root_names_the_panoptic_layout(tmp_path: Path) -> None:
    with pytest.raises(CocoFormatError, match=r"(?s)not a COCO panoptic root.*panoptic_val2017/\*\.png"):
        CocoPanopticDataModule(root=str(tmp_path))
