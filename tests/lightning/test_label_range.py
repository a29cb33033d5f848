"""A checkpoint (or a ``num_classes``) meeting data with labels it cannot predict: one line naming the
file, the label and the model's class count, in every task, before training and before validation."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.lightning.test_detection import SMALL
from tests.lightning.tools import run_tool_in_process
from vision_tx.data.detection import CocoDetectionDataModule
from vision_tx.data.imagefolder import ImageFolderDataModule
from vision_tx.data.invalid import InvalidDataError
from vision_tx.data.panoptic import CocoPanopticDataModule
from vision_tx.data.segmentation import SegmentationDataModule
from vision_tx.data.toy_classification import make_toy_classification
from vision_tx.lightning.classification import ClassificationModule
from vision_tx.lightning.detection import DetectionModule
from vision_tx.lightning.panoptic import PanopticModule
from vision_tx.lightning.segmentation import SegmentationModule


def check(module, datamodule, num_classes: int) -> None:
    """``module.check_labels_fit()`` for a model of ``num_classes`` classes attached to ``datamodule``."""
    module.hparams.num_classes = num_classes
    module._trainer = SimpleNamespace(datamodule=datamodule)
    module.check_labels_fit()


def test_detection_names_the_annotation_file_and_the_category(shared_data: Path) -> None:
    data = CocoDetectionDataModule(root=str(shared_data / "coco128"), val_split="train2017", num_workers=0)
    check(DetectionModule(), data, 91)  # COCO's ids go up to 90: just enough classes
    with pytest.raises(InvalidDataError) as caught:
        check(DetectionModule(), data, 90)  # one too few
    message = str(caught.value)
    assert message == (
        f"{data.val_ann_file}: label 90 (toothbrush) is beyond this model's 90 classes (0-89): "
        "the checkpoint or num_classes was made for other data"
    )


def test_panoptic_names_the_panoptic_json(shared_data: Path) -> None:
    data = CocoPanopticDataModule(root=str(shared_data / "coco128"), val_split="train2017", num_workers=0)
    check(PanopticModule(), data, 201)
    with pytest.raises(
        InvalidDataError, match=r"panoptic_train2017\.json: label 200 \(rug-merged\) is beyond this model's 200 classes"
    ):
        check(PanopticModule(), data, 200)


def test_segmentation_names_the_dataset(shared_data: Path) -> None:
    data = SegmentationDataModule(root=str(shared_data / "ade20k_sample"), num_workers=0)
    check(SegmentationModule(), data, 150)
    with pytest.raises(
        InvalidDataError, match=r"ade20k_sample: label 149 \(flag\) is beyond this model's 149 classes \(0-148\)"
    ):
        check(SegmentationModule(), data, 149)


def test_classification_names_the_class_folder(tmp_path: Path) -> None:
    root = make_toy_classification(tmp_path / "cls", num_train_per_class=1, num_val_per_class=1, side=16)
    data = ImageFolderDataModule(root=str(root), num_workers=0)
    check(ClassificationModule(), data, 6)
    with pytest.raises(
        InvalidDataError, match=r"cls/train: label 5 \(red_triangle\) is beyond this model's 5 classes \(0-4\)"
    ):
        check(ClassificationModule(), data, 5)


def test_evaluating_a_checkpoint_on_other_data_is_one_line(
    detr_checkpoint: Path, shared_data: Path, tmp_path: Path
) -> None:
    """``tools/eval.py`` with a toy checkpoint (4 classes) on COCO images: one ``error:`` line, exit status 1,
    before any image is drawn (the crash this replaces came from the preview pictures)."""
    with pytest.raises(SystemExit) as caught:
        run_tool_in_process(
            "eval.py",
            *SMALL,
            "--ckpt",
            str(detr_checkpoint),
            "--data.root",
            str(shared_data / "coco128"),
            "--data.val_split",
            "train2017",
            "--trainer.default_root_dir",
            str(tmp_path),
            cwd=tmp_path,
        )
    message = str(caught.value.code)
    assert message.startswith("error: ") and "\n" not in message
    assert "instances_train2017.json: label 90 (toothbrush) is beyond this model's 4 classes" in message


def test_training_on_labels_beyond_num_classes_is_one_line(detr_toy_cache: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        run_tool_in_process(
            "train.py",
            *SMALL,
            "--data.toy_cache_dir",
            str(detr_toy_cache),
            "--model.num_classes",
            "3",
            "--trainer.max_steps",
            "1",
            "--trainer.default_root_dir",
            str(tmp_path),
            cwd=tmp_path,
        )
    message = str(caught.value.code)
    assert message.startswith("error: ") and "\n" not in message
    assert "instances_val2017.json: label 3 (" in message and "beyond this model's 3 classes (0-2)" in message
