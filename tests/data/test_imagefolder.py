"""ImageFolderDataModule: the class list a validation run scores against."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from vision_tx.data.imagefolder import ImageFolderDataModule


def _write_split(root: Path, split: str, classes: list[str]) -> None:
    for name in classes:
        (root / split / name).mkdir(parents=True)
        Image.new("RGB", (8, 8), (10, 20, 30)).save(root / split / name / "0.png")


def test_validation_alone_keeps_the_training_classes_when_a_class_has_no_validation_folder(tmp_path: Path) -> None:
    _write_split(tmp_path, "train", ["cat", "chair", "dog"])
    _write_split(tmp_path, "val", ["cat", "dog"])  # no chair held out
    datamodule = ImageFolderDataModule(root=str(tmp_path), image_size=8, num_workers=0)
    datamodule.setup("validate")
    assert datamodule.class_names == ("cat", "chair", "dog")
    labels = {Path(path).parent.name: label for path, label in datamodule.val_set.samples}
    assert labels == {"cat": 0, "dog": 2}


def test_validation_without_a_training_split_takes_the_validation_folders(tmp_path: Path) -> None:
    _write_split(tmp_path, "val", ["cat", "dog"])
    datamodule = ImageFolderDataModule(root=str(tmp_path), image_size=8, num_workers=0)
    datamodule.setup("validate")
    assert datamodule.class_names == ("cat", "dog")
