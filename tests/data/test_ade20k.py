"""ADE20K loader on the real sample, its error messages, the segmentation transforms and the toy set."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors

from vision_tx.data.ade20k import ADE20K_CLASSES, ADE20KDataset, ADE20KFormatError
from vision_tx.data.segmentation import (
    PadTo,
    RandomCropCatMax,
    SegmentationDataModule,
    ValTransform,
    collate_segmentation,
    keep_ratio_size,
    train_transforms,
)
from vision_tx.data.toy_segmentation import TOY_CLASSES, make_toy_segmentation, toy_segmentation_root


@pytest.fixture
def sample(shared_data) -> Path:
    return shared_data / "ade20k_sample"


@pytest.fixture
def sample_copy(sample, tmp_path) -> Path:
    shutil.copytree(sample / "ADEChallengeData2016", tmp_path / "ADEChallengeData2016")
    return tmp_path


def test_class_names_match_object_info(sample) -> None:
    rows = (sample / "objectInfo150.txt").read_text().strip().splitlines()[1:]
    assert ADE20K_CLASSES == tuple(row.split("\t")[-1].split(",")[0].strip() for row in rows)


def test_reads_sample_with_reduce_zero_label(sample) -> None:
    dataset = ADE20KDataset(sample, "validation")
    assert len(dataset) == 3 and dataset.num_classes == 150
    image, label = dataset[0]
    assert isinstance(image, tv_tensors.Image) and image.shape == (3, 512, 683) and image.dtype == torch.uint8
    assert isinstance(label, tv_tensors.Mask) and label.shape == (512, 683) and label.dtype == torch.int64
    raw = torch.from_numpy(np.array(Image.open(dataset.annotations[0])).astype(np.int64))
    assert torch.equal(label == 255, raw == 0)
    assert torch.equal(label[raw > 0], raw[raw > 0] - 1)


def test_wrong_layout_shows_the_expected_one(tmp_path) -> None:
    with pytest.raises(
        ADE20KFormatError, match=r"(?s)not an ADE20K root.*ADEChallengeData2016/images/training/\*\.jpg"
    ):
        ADE20KDataset(tmp_path, "training")


def test_missing_annotation_names_the_file(sample_copy) -> None:
    (sample_copy / "ADEChallengeData2016/annotations/validation/ADE_val_00000002.png").unlink()
    with pytest.raises(ADE20KFormatError, match=r"no annotation.*ADE_val_00000002\.png is missing"):
        ADE20KDataset(sample_copy, "validation")


def test_label_above_150_names_the_file(sample_copy) -> None:
    path = sample_copy / "ADEChallengeData2016/annotations/validation/ADE_val_00000003.png"
    label = np.array(Image.open(path))
    label[0, 0] = 151
    Image.fromarray(label).save(path)
    dataset = ADE20KDataset(sample_copy, "validation")
    with pytest.raises(ADE20KFormatError, match=r"ADE_val_00000003\.png: label 151 above 150"):
        dataset[2]


def test_size_mismatch_names_the_file(sample_copy) -> None:
    path = sample_copy / "ADEChallengeData2016/annotations/validation/ADE_val_00000001.png"
    Image.open(path).resize((100, 80), Image.NEAREST).save(path)
    with pytest.raises(
        ADE20KFormatError, match=r"ADE_val_00000001\.png: annotation size 100x80 differs from its image"
    ):
        ADE20KDataset(sample_copy, "validation")[0]


def test_keep_ratio_size_as_mmcv() -> None:
    assert keep_ratio_size(512, 683, (2048, 512)) == (512, 683)
    assert keep_ratio_size(300, 400, (2048, 512)) == (512, 683)  # short side to 512
    assert keep_ratio_size(300, 2400, (2048, 512)) == (256, 2048)  # long side capped at 2048


def test_train_pipeline_shapes_and_pad_values(sample) -> None:
    dataset = ADE20KDataset(sample, "validation", train_transforms(scale=(1024, 256), crop_size=(320, 320)))
    for index in range(3):
        image, label = dataset[index]
        assert image.shape == (3, 320, 320) and image.dtype == torch.float32
        assert label.shape == (320, 320) and label.dtype == torch.int64
        assert set(label.unique().tolist()) <= set(range(150)) | {255}
    # ratio 0.5 of (1024, 256) makes the image shorter than the crop: padded with 0 / 255.
    image, label = ADE20KDataset(sample, "validation", train_transforms((512, 128), (1.0, 1.0), (200, 200)))[0]
    assert (image[:, 128:] == 0).all() and (label[128:] == 255).all()


def test_cat_max_crop_avoids_one_class_crops() -> None:
    torch.manual_seed(0)
    label = torch.zeros(100, 100, dtype=torch.int64)
    label[:, 80:] = 1  # only windows reaching x >= 80 hold two classes, and those are below 75% class 0
    crop = RandomCropCatMax((40, 40), cat_max_ratio=0.75)
    image = tv_tensors.Image(torch.zeros(3, 100, 100))
    passed = 0
    for _ in range(50):
        _, window = crop(image, tv_tensors.Mask(label))
        counts = torch.bincount(window.flatten(), minlength=2)
        passed += int(counts.min() > 0 and counts.max() / counts.sum() < 0.75)
    # One random crop passes with probability 10/61 (left edge 51..60); ten tries give ~83%, one try ~16%.
    assert passed >= 30


def test_pad_only_grows() -> None:
    image, label = PadTo((8, 8))(
        tv_tensors.Image(torch.ones(3, 10, 6)), tv_tensors.Mask(torch.ones(10, 6, dtype=torch.long))
    )
    assert image.shape == (3, 10, 8) and (image[:, :, 6:] == 0).all() and (label[:, 6:] == 255).all()


def test_val_keeps_label_at_original_size_and_collate_pads(sample) -> None:
    dataset = ADE20KDataset(sample, "validation", ValTransform(scale=(1024, 256)))
    batch = collate_segmentation([dataset[0], dataset[2]])
    assert batch["images"].shape == (2, 3, 256, 342)
    assert batch["image_sizes"].tolist() == [[256, 342], [256, 341]]
    assert batch["label_sizes"].tolist() == [[512, 683], [300, 400]]
    assert (batch["labels"][1, 300:] == 255).all() and (batch["images"][1, :, :, 341:] == 0).all()


def test_toy_set_is_deterministic_and_in_the_ade_layout(tmp_path) -> None:
    a = make_toy_segmentation(tmp_path / "a", num_train=3, num_val=2)
    b = make_toy_segmentation(tmp_path / "b", num_train=3, num_val=2)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    dataset = ADE20KDataset(a, "training", class_names=TOY_CLASSES)
    labels = torch.cat([dataset[i][1].flatten() for i in range(len(dataset))])
    assert 255 in labels and 0 in labels and labels[labels != 255].max() < len(TOY_CLASSES)


def test_toy_root_is_cached(tmp_path) -> None:
    root = toy_segmentation_root(tmp_path / "toy")
    stamp = (root / "info.json").stat().st_mtime_ns
    assert toy_segmentation_root(tmp_path / "toy") == root and (root / "info.json").stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_datamodule_uses_toy_set_without_root(caplog, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    datamodule = SegmentationDataModule(scale=(256, 128), crop_size=(96, 96), batch_size=2, num_workers=0)
    assert datamodule.class_names == TOY_CLASSES and datamodule.num_classes == 4 and datamodule.ignore_index == 255
    with caplog.at_level(logging.WARNING):
        datamodule.setup("fit")
    assert "toy segmentation dataset" in caplog.text
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["images"].shape == (2, 3, 96, 96) and batch["labels"].shape == (2, 96, 96)


def test_datamodule_on_ade20k_root(sample) -> None:
    datamodule = SegmentationDataModule(root=str(sample), num_workers=0)
    assert datamodule.num_classes == 150 and datamodule.class_names == ADE20K_CLASSES
    datamodule.setup("validate")
    assert len(datamodule.val_set) == 3
