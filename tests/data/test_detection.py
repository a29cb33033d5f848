"""The COCO detection datamodule on the toy dataset and on coco128's layout."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from vision_tx.data.coco import CocoFormatError
from vision_tx.data.coco_instances import CocoInstances
from vision_tx.data.detection import CocoDetectionDataModule, CocoInstanceDataModule
from vision_tx.data.mosaic import MosaicDetection
from vision_tx.data.schedule import LongRun
from vision_tx.data.toy import toy_coco_root
from vision_tx.data.transforms import DetectionTransform, DetrTrainTransform, DetrValTransform


def test_toy_datamodule_batches(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="vision_tx.data.detection"):
        data = CocoDetectionDataModule(
            toy_cache_dir=str(tmp_path / "toy"),
            train_transform=DetrTrainTransform(scales=(96, 128), max_size=160, crop_scales=(96,), crop_size=(64, 96)),
            val_transform=DetrValTransform(size=128, max_size=160),
            batch_size=4,
            num_workers=0,
            size_divisibility=32,
        )
    assert "built-in toy dataset" in caplog.text and "--data.root" in caplog.text
    assert data.num_classes == 4
    assert data.category_names == {1: "circle", 2: "square", 3: "triangle"}
    assert data.val_coco.getImgIds() and data.val_ann_file.name == "instances_val2017.json"
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    images, pixel_mask, targets = batch["images"], batch["pixel_mask"], batch["targets"]
    assert images.shape[0] == 4 and images.shape[-1] % 32 == 0 and images.shape[-2] % 32 == 0
    assert pixel_mask.shape == (4, *images.shape[-2:])
    for mask, target in zip(pixel_mask, targets):
        h, w = target["size"].tolist()
        assert not mask[:h, :w].any() and mask.sum() == mask.numel() - h * w
        assert set(target["labels"].tolist()) <= {1, 2, 3}
    val_batch = next(iter(data.val_dataloader()))
    assert all(min(t["size"].tolist()) == 128 for t in val_batch["targets"])
    assert len(data.train_dataloader()) == 64 // 4 and len(data.val_dataloader()) == 16 // 4


def test_wrong_root_names_the_expected_layout(tmp_path: Path) -> None:
    with pytest.raises(CocoFormatError, match=r"not a COCO detection root.*Expected the layout"):
        CocoDetectionDataModule(root=str(tmp_path))


@pytest.mark.parametrize(("mosaic", "mixup"), [(0.0, 0.0), (0.0, 0.5), (0.25, 0.0)])
def test_mosaics_or_mixup_alone_wrap_the_training_split(tmp_path: Path, mosaic: float, mixup: float) -> None:
    """Either probability above 0 puts the split behind MosaicDetection with both probabilities as given."""
    data = CocoDetectionDataModule(
        toy_cache_dir=str(tmp_path / "toy"), num_workers=0, mosaic_probability=mosaic, mixup_probability=mixup
    )
    data.setup("fit")
    wrapped = isinstance(data.train_dataset, MosaicDetection)
    assert wrapped is (mosaic > 0 or mixup > 0)
    if wrapped:
        assert (data.train_dataset.probability, data.train_dataset.mixup_probability) == (mosaic, mixup)
        assert data.train_dataset.transform is data.train_transform


def test_copy_paste_reads_the_masks_and_cuts_along_the_boxes_when_an_object_has_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = CocoDetectionDataModule(
        toy_cache_dir=str(tmp_path / "toy"), num_workers=0, batch_size=4, copy_paste_probability=0.5
    )
    data.setup("fit")
    assert isinstance(data.train_dataset, MosaicDetection) and isinstance(data.train_dataset.dataset, CocoInstances)
    assert data.train_dataset.copy_paste_probability == 0.5 and data.train_dataset.probability == 0.0
    assert data.train_dataset.masks == data.train_dataset.dataset.instance_masks  # decoded for the pasted images only
    assert "masks" not in data.train_dataset.dataset[0][1]
    batch = next(iter(data.train_dataloader()))
    assert all("masks" not in target for target in batch["targets"])

    boxes_only = tmp_path / "boxes_only"
    (boxes_only / "annotations").mkdir(parents=True)
    for split in ("train2017", "val2017"):
        (boxes_only / split).symlink_to(data.root / split)
        dataset = json.loads((data.root / "annotations" / f"instances_{split}.json").read_text())
        for annotation in dataset["annotations"][::2]:
            del annotation["segmentation"]
        (boxes_only / "annotations" / f"instances_{split}.json").write_text(json.dumps(dataset))
    with caplog.at_level(logging.INFO, logger="vision_tx.data.detection"):
        boxes = CocoDetectionDataModule(
            root=str(boxes_only), num_workers=0, copy_paste_probability=0.5, mixup_probability=0.5
        )
        boxes.setup("fit")
    assert "have no 'segmentation': copy-paste cuts the objects along their boxes" in caplog.text
    assert "instances_train2017.json" in caplog.text
    assert boxes.train_dataset.copy_paste_probability == 0.5 and boxes.train_dataset.mixup_probability == 0.5
    assert boxes.train_dataset.masks is None and "masks" not in boxes.train_dataset.dataset[0][1]
    batch = next(iter(boxes.train_dataloader()))
    assert all("masks" not in target for target in batch["targets"]) and len(batch["targets"]) == boxes.batch_size


def test_copy_paste_is_refused_where_the_targets_are_not_detection_targets(tmp_path: Path) -> None:
    data = CocoInstanceDataModule(toy_cache_dir=str(tmp_path / "toy"), num_workers=0, copy_paste_probability=0.5)
    with pytest.raises(ValueError, match="CocoInstanceDataModule: copy-paste yields detection targets"):
        data.setup("fit")


def test_the_augmentation_schedule_is_declared_beside_the_probabilities_and_read_through_the_datamodule(
    tmp_path: Path,
) -> None:
    """The datamodule's schedule holds its own entries and its training transform's; its probabilities are read and
    set through ``augmentation_probabilities()`` / ``set_augmentation_probabilities()``, in the built split (the
    probabilities loader workers read) and the transform, at values that tell each augmentation apart."""
    transform = DetrTrainTransform(
        scales=[64],
        max_size=96,
        crop_probability=0.0,
        channel_permutation_probability=0.25,
        vertical_flip_probability=0.75,
        augmentation_schedule={"vertical_flip": {"from_epochs": 40}},
    )
    data = CocoDetectionDataModule(
        toy_cache_dir=str(tmp_path / "toy"),
        num_workers=0,
        mixup_probability=0.5,
        copy_paste_probability=0.125,
        train_transform=transform,
        augmentation_schedule={"mixup": {"from_epochs": 30, "close_at_drop": True}},
    )
    assert data.augmentation_schedule == {"mixup": LongRun(30, close_at_drop=True), "vertical_flip": LongRun(40)}
    configured = {
        "mosaic": 0.0,
        "mixup": 0.5,
        "copy_paste": 0.125,
        "affine": 0.0,
        "channel_permutation": 0.25,
        "vertical_flip": 0.75,
        "quarter_turn": 0.0,
    }
    assert data.augmentation_probabilities() == configured
    with pytest.raises(RuntimeError, match="once setup"):
        data.set_augmentation_probabilities({"mixup": 0.0})
    data.setup("fit")
    data.set_augmentation_probabilities({"mixup": 0.0, "copy_paste": 0.375, "vertical_flip": 0.0})
    assert data.augmentation_probabilities() == {**configured, "mixup": 0.0, "copy_paste": 0.375, "vertical_flip": 0.0}
    assert (data.train_dataset.mixup_probability, data.train_dataset.copy_paste_probability) == (0.0, 0.375)
    assert (transform.vertical_flip.p, transform.channel_permutation.p) == (0.0, 0.25)
    assert data.mixup_probability == 0.5  # the configured value stays
    with pytest.raises(KeyError, match="no switchable augmentation 'cutmix'"):
        data.set_augmentation_probabilities({"cutmix": 0.5})


def test_a_schedule_of_an_unknown_augmentation_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="names 'mixup'; its augmentations are"):
        DetrTrainTransform(augmentation_schedule={"mixup": {"from_epochs": 40}})
    with pytest.raises(ValueError, match="names 'vertical_flip'; its augmentations are"):
        CocoDetectionDataModule(
            toy_cache_dir=str(tmp_path / "toy"), augmentation_schedule={"vertical_flip": {"from_epochs": 1}}
        )
    with pytest.raises(ValueError, match="from_epochs must be at least 0"):
        LongRun(-1)
    with pytest.raises(TypeError):
        DetrTrainTransform(vertical_flip_probability=0.5, augmentation_schedule={"vertical_flip": {"from_epoch": 40}})


@pytest.mark.parametrize("copy_paste", [0.0, 1.0])  # the training split read directly, or through its wrapper
def test_batches_of_one_orientation_at_one_scale(tmp_path: Path, copy_paste: float) -> None:
    scales = (96, 112, 128)
    data = CocoDetectionDataModule(
        toy_cache_dir=str(tmp_path / "toy"),
        train_transform=DetrTrainTransform(scales=scales, max_size=400, crop_probability=0.0, scale_per_batch=True),
        batch_size=4,
        num_workers=0,
        copy_paste_probability=copy_paste,
        group_by_orientation=True,
    )
    data.setup("fit")
    shorter_sides, mixed = set(), 0
    for batch in data.train_dataloader():
        heights, widths = zip(*(t["orig_size"].tolist() for t in batch["targets"]))
        mixed += len({h > w for h, w in zip(heights, widths)}) > 1
        sides = {min(t["size"].tolist()) for t in batch["targets"]}
        assert len(sides) == 1  # the whole batch at one scale (max_size never binds here)
        shorter_sides |= sides
    assert mixed <= 1  # the run left over at the end of the epoch may mix them
    assert shorter_sides == set(scales)
    # per image without the option: a batch's images at several scales
    data.train_transform = DetrTrainTransform(scales=scales, max_size=400, crop_probability=0.0)
    data.train_dataset = None
    data.setup("fit")
    assert any(len({min(t["size"].tolist()) for t in b["targets"]}) > 1 for b in data.train_dataloader())


def test_each_split_decodes_at_the_largest_size_its_transform_reads(tmp_path: Path) -> None:
    def sides(**options) -> tuple[int | None, int | None]:
        data = CocoDetectionDataModule(toy_cache_dir=str(tmp_path / "toy"), num_workers=0, **options)
        data.setup("fit")
        train = data.train_dataset
        return getattr(train, "dataset", train).decode_shorter_side, data.val_dataset.decode_shorter_side

    plain = DetrTrainTransform(scales=[64, 96], crop_scales=[128], crop_probability=0.0)
    cropping = DetrTrainTransform(scales=[64, 96], crop_scales=[128, 112], crop_probability=0.5)
    val = DetrValTransform(size=80)
    assert sides(train_transform=plain, val_transform=val) == (96, 80)
    assert sides(train_transform=cropping, val_transform=val) == (128, 80)  # the crop branch resizes to 128 first
    assert sides(train_transform=plain, val_transform=val, mosaic_probability=0.5, mosaic_size=160) == (160, 80)
    assert sides(train_transform=plain, val_transform=val, copy_paste_probability=0.5) == (96, 80)
    assert sides(train_transform=plain, val_transform=val, reduced_decoding=False) == (None, None)
    unknown = DetectionTransform(v2.Compose([v2.Resize(50)]))  # a pipeline that does not say what it reads
    assert sides(train_transform=unknown, val_transform=unknown) == (None, None)


def _jpeg_toy_root(tmp_path: Path) -> Path:
    """The toy set (masks in its annotations) with its images stored as JPEGs twice their size."""
    toy = toy_coco_root(str(tmp_path / "toy"))
    root = tmp_path / "jpeg"
    (root / "annotations").mkdir(parents=True)
    for split in ("train2017", "val2017"):
        (root / split).mkdir()
        dataset = json.loads((toy / "annotations" / f"instances_{split}.json").read_text())
        for image in dataset["images"]:
            name = Path(image["file_name"]).with_suffix(".jpg").name
            with Image.open(toy / split / image["file_name"]) as picture:
                picture.convert("RGB").resize((2 * picture.width, 2 * picture.height)).save(root / split / name)
            image.update(file_name=name, width=2 * image["width"], height=2 * image["height"])
        for annotation in dataset["annotations"]:
            annotation["bbox"] = [2 * v for v in annotation["bbox"]]
            doubled = mask_utils.decode(annotation["segmentation"]).repeat(2, 0).repeat(2, 1)
            rle = mask_utils.encode(np.asfortranarray(doubled))
            annotation["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode()}
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(dataset))
    return root


def test_masks_follow_the_reduced_jpegs_into_copy_paste_and_instance_targets(tmp_path: Path) -> None:
    root = _jpeg_toy_root(tmp_path)
    transform = DetrTrainTransform(scales=[64], max_size=128, crop_probability=0.0)
    data = CocoDetectionDataModule(
        root=str(root), train_transform=transform, num_workers=0, batch_size=4, copy_paste_probability=1.0
    )
    data.setup("fit")
    source = data.train_dataset
    for index in (0, 7):
        image, target = source.paste_source(index)
        height, width = int(source.dataset.heights[index]), int(source.dataset.widths[index])
        assert image.shape[-1] < width and image.shape[-2] < height and min(image.shape[-2:]) >= 64
        assert target["masks"].shape == (len(target["boxes"]), *image.shape[-2:])
    batch = next(iter(data.train_dataloader()))
    assert {min(t["size"].tolist()) for t in batch["targets"]} == {64}

    paths = (root / "train2017", root / "annotations" / "instances_train2017.json")
    reduced, whole = CocoInstances(*paths, decode_shorter_side=64), CocoInstances(*paths)
    for index in (0, 7):
        image, target = reduced[index]
        _, full = whole[index]
        assert target["masks"].shape == (len(target["boxes"]), *image.shape[-2:])
        assert torch.equal(target["masks"], F.resize(full["masks"], list(image.shape[-2:])))
