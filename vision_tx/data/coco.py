"""COCO detection dataset: images and instance boxes from a COCO annotation file, read with pycocotools.

The annotation file is parsed and checked once, at construction, so a broken file fails before
training starts. Training targets hold the non-crowd boxes clipped to the image; crowd boxes stay
only in the annotation file, where the evaluator reads them.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image, ImageOps
from pycocotools.coco import COCO
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

logger = logging.getLogger(__name__)

# A box may stick out of its image by this fraction of the image side (or 2 px) before it is an
# error rather than a rounding slip; larger overshoots mean a wrong box format or image size.
OUTSIDE_TOLERANCE = 0.05

Target = dict[str, Any]
Transforms = Callable[[tv_tensors.Image, Target], tuple[Any, Target]]


class CocoFormatError(ValueError):
    """A COCO dataset that cannot be used as it is: the message names the file and the problem."""


def load_coco(ann_file: str | os.PathLike) -> COCO:
    """Reads a COCO annotation file into a pycocotools ``COCO`` index; errors name the file."""
    ann_file = Path(ann_file)
    if not ann_file.is_file():
        raise CocoFormatError(f"{ann_file}: annotation file not found")
    try:
        with open(ann_file) as f:
            dataset = json.load(f)
    except json.JSONDecodeError as err:
        raise CocoFormatError(
            f"{ann_file}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno} (char {err.pos})"
        ) from err
    missing = [key for key in ("images", "annotations", "categories") if key not in dataset]
    if not isinstance(dataset, dict) or missing:
        raise CocoFormatError(f"{ann_file}: not a COCO instances file: missing top-level keys {missing}")
    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco.createIndex()
    return coco


def coco_split_paths(root: str | os.PathLike, split: str) -> tuple[Path, Path]:
    """``(ROOT/split, ROOT/annotations/instances_{split}.json)``, checked against the standard layout."""
    root = Path(root)
    image_dir = root / split
    ann_file = root / "annotations" / f"instances_{split}.json"
    missing = [str(p) for p in (image_dir, ann_file) if not p.exists()]
    if missing:
        raise CocoFormatError(
            f"{root}: not a COCO detection root, missing {', '.join(missing)}. Expected the layout\n"
            f"  {root}/{split}/*.jpg\n  {root}/annotations/instances_{split}.json"
        )
    return image_dir, ann_file


class CocoDetection(Dataset):
    """COCO instances as ``(image, target)``.

    ``image`` is a ``tv_tensors.Image`` ``[3, H, W]`` uint8 RGB (EXIF orientation applied); ``target``
    holds ``boxes`` (``tv_tensors.BoundingBoxes`` ``[K, 4]`` xyxy in pixels), ``labels`` (int64
    ``[K]``, COCO category ids), ``image_id`` (int), ``orig_size`` and ``size`` (int64 ``[2]``, h, w).
    ``transforms(image, target)`` is applied last.
    """

    def __init__(self, image_dir: str | os.PathLike, ann_file: str | os.PathLike, transforms: Transforms | None = None):
        self.image_dir = Path(image_dir)
        self.ann_file = Path(ann_file)
        self.transforms = transforms
        if not self.image_dir.is_dir():
            raise CocoFormatError(f"{self.image_dir}: image folder not found (images of {self.ann_file})")
        coco = load_coco(self.ann_file)
        images = coco.dataset["images"]
        # Plain arrays rather than lists of dicts: DataLoader workers share them without copying.
        try:
            self.image_ids = np.array([img["id"] for img in images], dtype=np.int64)
            self.file_names = np.array([img["file_name"] for img in images], dtype=str)
            self.heights = np.array([img["height"] for img in images], dtype=np.int64)
            self.widths = np.array([img["width"] for img in images], dtype=np.int64)
        except (KeyError, TypeError, ValueError) as err:
            raise CocoFormatError(
                f"{self.ann_file}: every entry of 'images' needs an integer 'id', 'height', 'width' "
                f"and a 'file_name' ({err!r})"
            ) from err
        self.category_names = {int(c["id"]): c["name"] for c in coco.dataset["categories"]}
        self._check_image_files()
        self.boxes, self.labels, self.offsets = self._read_boxes(coco.dataset["annotations"])

    def __len__(self) -> int:
        return len(self.image_ids)

    def __getitem__(self, index: int) -> tuple[Any, Target]:
        image_id = int(self.image_ids[index])
        height, width = int(self.heights[index]), int(self.widths[index])
        image = self._read_image(index)
        if tuple(image.shape[-2:]) != (height, width):
            raise CocoFormatError(
                f"{self.image_dir / self.file_names[index]}: the image is {tuple(image.shape[-2:])} (h, w) after "
                f"EXIF orientation but {self.ann_file} says ({height}, {width}) for image id {image_id}"
            )
        start, end = self.offsets[index], self.offsets[index + 1]
        size = torch.tensor([height, width])
        target = {
            "boxes": tv_tensors.BoundingBoxes(
                torch.from_numpy(self.boxes[start:end]), format="XYXY", canvas_size=(height, width)
            ),
            "labels": torch.from_numpy(self.labels[start:end]),
            "image_id": image_id,
            "orig_size": size,
            "size": size.clone(),
        }
        if self.transforms is not None:
            return self.transforms(image, target)
        return image, target

    def _read_image(self, index: int) -> tv_tensors.Image:
        path = self.image_dir / self.file_names[index]
        try:
            with Image.open(path) as pil:
                pil = ImageOps.exif_transpose(pil).convert("RGB")
        except FileNotFoundError as err:
            raise CocoFormatError(self._missing_image_message(index)) from err
        except OSError as err:
            raise CocoFormatError(f"{path}: unreadable image (image id {self.image_ids[index]}): {err}") from err
        return tv_tensors.Image(F.pil_to_tensor(pil))

    def _missing_image_message(self, index: int) -> str:
        return (
            f"{self.image_dir / self.file_names[index]}: image file not found "
            f"(image id {self.image_ids[index]}, file_name {str(self.file_names[index])!r} in {self.ann_file})"
        )

    def _check_image_files(self) -> None:
        present = set(os.listdir(self.image_dir))
        for index, name in enumerate(self.file_names):
            if name not in present and not (self.image_dir / name).is_file():
                raise CocoFormatError(self._missing_image_message(index))

    def _annotation_error(self, ann: dict[str, Any], problem: str) -> CocoFormatError:
        rows = np.flatnonzero(self.image_ids == ann.get("image_id"))
        image = self.file_names[rows[0]] if len(rows) else f"unknown image id {ann.get('image_id')}"
        return CocoFormatError(f"{self.ann_file}: annotation id {ann.get('id')} (image {image}): {problem}")

    def _first_malformed(self, anns: list[dict[str, Any]]) -> CocoFormatError:
        for ann in anns:
            if not all(key in ann for key in ("image_id", "bbox", "category_id")):
                return self._annotation_error(ann, "missing one of the keys 'image_id', 'bbox', 'category_id'")
            if not isinstance(ann["bbox"], list) or len(ann["bbox"]) != 4:
                return self._annotation_error(ann, f"bbox {ann['bbox']} is not [x, y, width, height]")
        return CocoFormatError(f"{self.ann_file}: malformed annotations (bbox or category_id not numbers)")

    def _read_boxes(self, anns: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Checks every annotation and returns the training boxes ``[N, 4]`` xyxy, their labels
        ``[N]`` and per-image offsets ``[num_images + 1]`` (image ``i`` owns rows ``offsets[i]:offsets[i+1]``)."""
        try:
            bbox = np.array([ann["bbox"] for ann in anns], dtype=np.float64).reshape(len(anns), 4)
            category_ids = np.array([ann["category_id"] for ann in anns], dtype=np.int64)
            image_ids = [ann["image_id"] for ann in anns]
        except (KeyError, TypeError, ValueError) as err:
            raise self._first_malformed(anns) from err
        crowd = np.array([bool(ann.get("iscrowd", 0)) for ann in anns], dtype=bool)
        row_of_id = {int(image_id): row for row, image_id in enumerate(self.image_ids)}
        rows = np.array([row_of_id.get(image_id, -1) for image_id in image_ids], dtype=np.int64)

        def fail(bad: np.ndarray, problem: Callable[[dict[str, Any]], str]) -> None:
            if bad.any():
                ann = anns[int(np.flatnonzero(bad)[0])]
                raise self._annotation_error(ann, f"{problem(ann)} ({int(bad.sum())} such annotations)")

        fail(rows < 0, lambda a: f"image_id {a['image_id']} is not in 'images'")
        fail(~np.isin(category_ids, list(self.category_names)),
             lambda a: f"category_id {a['category_id']} is not in 'categories' (ids {sorted(self.category_names)})")
        fail(~np.isfinite(bbox).all(1), lambda a: f"bbox {a['bbox']} is not finite")
        fail((bbox[:, 2:] < 0).any(1), lambda a: f"bbox {a['bbox']} has a negative size")
        width, height = self.widths[rows].astype(np.float64), self.heights[rows].astype(np.float64)
        x1, y1 = bbox[:, 0], bbox[:, 1]
        x2, y2 = x1 + bbox[:, 2], y1 + bbox[:, 3]
        slack_x = np.maximum(2.0, OUTSIDE_TOLERANCE * width)
        slack_y = np.maximum(2.0, OUTSIDE_TOLERANCE * height)
        outside = (x1 < -slack_x) | (y1 < -slack_y) | (x2 > width + slack_x) | (y2 > height + slack_y)

        def outside_problem(ann: dict[str, Any]) -> str:
            row = row_of_id[ann["image_id"]]
            return (f"bbox {ann['bbox']} (x, y, w, h) lies far outside the image, "
                    f"which is {self.widths[row]} wide and {self.heights[row]} high")

        fail(outside, outside_problem)

        xyxy = np.stack([x1.clip(0, width), y1.clip(0, height), x2.clip(0, width), y2.clip(0, height)], axis=1)
        clipped = (xyxy != np.stack([x1, y1, x2, y2], axis=1)).any(1) & ~crowd
        degenerate = ((xyxy[:, 2] <= xyxy[:, 0]) | (xyxy[:, 3] <= xyxy[:, 1])) & ~crowd
        keep = ~crowd & ~degenerate
        logger.info(
            "%s: %d boxes on %d images; left out of the training targets: %d crowd boxes, %d degenerate "
            "(zero width or height); %d clipped to the image",
            self.ann_file, len(anns), len(self.image_ids), int(crowd.sum()), int(degenerate.sum()), int(clipped.sum()),
        )
        order = np.argsort(rows[keep], kind="stable")
        counts = np.bincount(rows[keep], minlength=len(self.image_ids))
        offsets = np.concatenate([[0], np.cumsum(counts)])
        return xyxy[keep][order].astype(np.float32), category_ids[keep][order], offsets
