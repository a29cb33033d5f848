"""COCO detection dataset: images and instance boxes from a COCO annotation file, read with pycocotools.

The annotation file is parsed and checked once, at construction, so a broken file fails before
training starts (or, with ``skip_invalid=True``, its invalid images are left out with one warning).
Training targets hold the non-crowd boxes clipped to the image; crowd boxes stay only in the
annotation file, where the evaluator reads them.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pycocotools.coco import COCO
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from vision_tx.data.image_io import ImageReadError, decode_rgb_image, orientation_note
from vision_tx.data.invalid import InvalidDataError, SkippingDataset, warn_skipped

logger = logging.getLogger(__name__)

# A box may stick out of its image by this fraction of the image side (or 2 px) before it is an
# error rather than a rounding slip; larger overshoots mean a wrong box format or image size.
OUTSIDE_TOLERANCE = 0.05

Target = dict[str, Any]
Transforms = Callable[[tv_tensors.Image, Target], tuple[Any, Target]]


class CocoFormatError(InvalidDataError):
    """A COCO dataset that cannot be used as it is: the message names the file and the problem."""


def far_outside(x1: Any, y1: Any, x2: Any, y2: Any, height: Any, width: Any) -> Any:
    """Whether a pixel box (corners ``x1``, ``y1``, ``x2``, ``y2``; numbers or arrays ``[N]`` of them) lies outside its
    image of ``height`` and ``width`` by more than the readers accept and clip: ``max(2 px, OUTSIDE_TOLERANCE of the
    side)`` on each side. Numbers or bool ``[N]``."""
    slack_x, slack_y = np.maximum(2.0, OUTSIDE_TOLERANCE * width), np.maximum(2.0, OUTSIDE_TOLERANCE * height)
    return (x1 < -slack_x) | (y1 < -slack_y) | (x2 > width + slack_x) | (y2 > height + slack_y)


def read_coco_json(ann_file: str | os.PathLike) -> dict[str, Any]:
    """The content of the COCO annotation file ``ann_file``, checked to be JSON with its three lists; errors name the
    file."""
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
    missing = [
        key for key in ("images", "annotations", "categories") if not isinstance(dataset, dict) or key not in dataset
    ]
    if missing:
        raise CocoFormatError(f"{ann_file}: not a COCO instances file: missing top-level keys {missing}")
    return dataset


def category_names(categories: list[Any], ann_file: str | os.PathLike) -> dict[int, str]:
    """``{id: name}`` of a COCO file's ``categories``; an entry without an integer ``id`` or a ``name`` is an error that
    names ``ann_file``."""
    try:
        return {int(c["id"]): str(c["name"]) for c in categories}
    except (KeyError, TypeError, ValueError) as err:
        raise CocoFormatError(
            f"{ann_file}: every entry of 'categories' needs an integer 'id' and a 'name' ({err!r})"
        ) from err


def load_coco(ann_file: str | os.PathLike) -> COCO:
    """Reads the COCO annotation file ``ann_file`` into a pycocotools ``COCO`` index; errors name the file."""
    coco = COCO()
    coco.dataset = read_coco_json(ann_file)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
            coco.createIndex()
    except (KeyError, TypeError) as err:
        raise CocoFormatError(
            f"{ann_file}: pycocotools cannot index it: an entry of 'images', 'annotations' or 'categories' "
            f"is not an object with an 'id' (and 'image_id', 'category_id' for annotations) ({err!r})"
        ) from err
    return coco


def coco_split_paths(root: str | os.PathLike, split: str) -> tuple[Path, Path]:
    """``(root/split, root/annotations/instances_{split}.json)`` of the dataset at ``root`` and its ``split``, checked
    against the standard layout."""
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


def read_coco_image(
    path: Path, image_id: int, size: tuple[int, int], ann_file: Path, min_shorter_side: int | None = None
) -> tv_tensors.Image:
    """The image ``[3, H, W]`` uint8 RGB at ``path``, checked against the ``size`` (h, w) that ``ann_file``
    gives it; errors name the file, the ``image_id`` and the problem. With ``min_shorter_side``, a JPEG comes
    reduced (:func:`~vision_tx.data.image_io.decode_rgb_image`): smaller than ``size``."""
    try:
        image, full_size = decode_rgb_image(path, min_shorter_side)
    except ImageReadError as err:
        raise CocoFormatError(f"{err} (image id {image_id} in {ann_file})") from err
    if full_size != size:
        raise CocoFormatError(
            f"{path}: the image is {full_size} (h, w) after EXIF orientation but {ann_file} "
            f"says {size} for image id {image_id}{orientation_note(path)}"
        )
    return tv_tensors.Image(torch.from_numpy(image).permute(2, 0, 1))


class CocoDetection(SkippingDataset[tuple[Any, Target]]):
    """COCO instances as ``(image, target)``.

    ``image`` is a ``tv_tensors.Image`` ``[3, H, W]`` uint8 RGB (see ``vision_tx.data.image_io``);
    ``target`` holds ``boxes`` (``tv_tensors.BoundingBoxes`` ``[K, 4]`` xyxy in pixels), ``labels``
    (int64 ``[K]``, COCO category ids), ``image_id`` (int), ``orig_size`` and ``size`` (int64
    ``[2]``, h, w). ``transforms(image, target)`` is applied last. An image with no annotation is
    valid (all background). Invalid records are errors; with ``skip_invalid=True`` an image with a
    missing file or an invalid annotation is left out, and one that fails to read is replaced by
    the next (``vision_tx.data.invalid``).

    ``decode_shorter_side`` decodes each JPEG reduced by 2, 4 or 8 as far as its shorter side stays at least that
    many pixels (:func:`~vision_tx.data.image_io.decode_rgb_image`): for transforms that never resize an image
    larger (see :meth:`~vision_tx.data.transforms.DetectionTransform.largest_shorter_side`). The boxes are scaled with
    the pixels and ``size`` is the reduced size; ``orig_size`` stays the annotated one, which predictions map back to.
    """

    format_error = CocoFormatError

    def __init__(
        self,
        image_dir: str | os.PathLike,
        ann_file: str | os.PathLike,
        transforms: Transforms | None = None,
        skip_invalid: bool = False,
        decode_shorter_side: int | None = None,
    ):
        self.image_dir = Path(image_dir)
        self.ann_file = Path(ann_file)
        self.transforms = transforms
        self.decode_shorter_side = decode_shorter_side
        super().__init__(skip_invalid)
        if not self.image_dir.is_dir():
            raise CocoFormatError(f"{self.image_dir}: image folder not found (images of {self.ann_file})")
        dataset = read_coco_json(self.ann_file)
        images = dataset["images"]
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
        self.category_names = category_names(dataset["categories"], self.ann_file)
        anns = dataset["annotations"]
        fields = self._annotation_fields(anns)
        invalid_rows = self._invalid_image_rows(anns, fields)
        if invalid_rows:
            warn_skipped(self.ann_file, list(invalid_rows.values()), len(self.image_ids), "images")
            fields = self._drop_images(np.array(sorted(invalid_rows)), fields)
        self.boxes, self.labels, self.offsets = self._training_boxes(*fields)

    def __len__(self) -> int:
        return len(self.image_ids)

    def _load(self, index: int) -> tuple[Any, Target]:
        image_id = int(self.image_ids[index])
        height, width = int(self.heights[index]), int(self.widths[index])
        image = read_coco_image(
            self.image_dir / self.file_names[index],
            image_id,
            (height, width),
            self.ann_file,
            self.decode_shorter_side,
        )
        start, end = self.offsets[index], self.offsets[index + 1]
        boxes = tv_tensors.BoundingBoxes(
            torch.from_numpy(self.boxes[start:end]), format="XYXY", canvas_size=(height, width)
        )
        canvas = tuple(image.shape[-2:])
        if canvas != (height, width):  # decoded reduced: the boxes follow the pixels
            boxes = F.resize(boxes, list(canvas))
        target = {
            "boxes": boxes,
            "labels": torch.from_numpy(self.labels[start:end]),
            "image_id": image_id,
            "orig_size": torch.tensor([height, width]),
            "size": torch.tensor(canvas),
        }
        if self.transforms is not None:
            return self.transforms(image, target)
        return image, target

    def _annotation_error(self, ann: Any, row: int, problem: str) -> str:
        ann = ann if isinstance(ann, dict) else {}
        image = self.file_names[row] if row >= 0 else f"unknown image id {ann.get('image_id')}"
        return f"{self.ann_file}: annotation id {ann.get('id')} (image {image}): {problem}"

    def _annotation_fields(self, anns: list[dict[str, Any]]) -> tuple[np.ndarray, ...]:
        """Per annotation: ``bbox`` ``[N, 4]`` xywh, category ids, image rows (-1 for an unknown image),
        ``iscrowd`` and whether it is well formed (malformed ones hold zeros)."""
        well_formed = np.array([_is_well_formed(ann) for ann in anns], dtype=bool)
        ok = [ann if good else {} for ann, good in zip(anns, well_formed)]
        bbox = np.array([ann.get("bbox", [0, 0, 0, 0]) for ann in ok], dtype=np.float64).reshape(len(anns), 4)
        category_ids = np.array([ann.get("category_id", 0) for ann in ok], dtype=np.int64)
        row_of_id = {int(image_id): row for row, image_id in enumerate(self.image_ids)}
        rows = np.array([row_of_id.get(ann.get("image_id"), -1) for ann in ok], dtype=np.int64)
        crowd = np.array([bool(ann.get("iscrowd", 0)) for ann in ok], dtype=bool)
        return bbox, category_ids, rows, crowd, well_formed

    def _invalid_image_rows(self, anns: list[dict[str, Any]], fields: tuple[np.ndarray, ...]) -> dict[int, str]:
        """Checks every image file and annotation: raises on the first problem, or with ``skip_invalid``
        returns ``{image row: problem}`` of the images to leave out (annotations of unknown images
        are dropped then too)."""
        bbox, category_ids, rows, _, well_formed = fields
        # Row -1 (an unknown image) reads the appended 0: such annotations fail the image_id check first.
        width = np.append(self.widths, 0)[rows].astype(np.float64)
        height = np.append(self.heights, 0)[rows].astype(np.float64)
        outside = far_outside(bbox[:, 0], bbox[:, 1], bbox[:, 0] + bbox[:, 2], bbox[:, 1] + bbox[:, 3], height, width)
        checks: list[tuple[np.ndarray, Callable[[Any, int], str]]] = [
            (~well_formed, _malformed_problem),
            (rows < 0, lambda a, row: f"image_id {a['image_id']} is not in 'images'"),
            (
                ~np.isin(category_ids, list(self.category_names)),
                lambda a, row: (
                    f"category_id {a['category_id']} is not in 'categories' (ids {sorted(self.category_names)})"
                ),
            ),
            (~np.isfinite(bbox).all(1), lambda a, row: f"bbox {a['bbox']} is not finite"),
            ((bbox[:, 2:] < 0).any(1), lambda a, row: f"bbox {a['bbox']} has a negative size"),
            (
                outside,
                lambda a, row: (
                    f"bbox {a['bbox']} (x, y, w, h) lies far outside the image, "
                    f"which is {self.widths[row]} wide and {self.heights[row]} high"
                ),
            ),
        ]
        invalid: dict[int, str] = {}
        orphans: list[str] = []  # annotations of images not in 'images': dropped, there is no image to leave out
        present = set(os.listdir(self.image_dir))
        for row, name in enumerate(self.file_names):
            if name not in present and not (self.image_dir / name).is_file():
                invalid[row] = (
                    f"{self.image_dir / name}: image file not found "
                    f"(image id {self.image_ids[row]}, file_name {str(name)!r} in {self.ann_file})"
                )
                if not self.skip_invalid:
                    raise CocoFormatError(invalid[row])
        unreported = np.ones(len(anns), dtype=bool)  # each annotation is reported with its first problem
        for bad, problem in checks:
            bad = bad & unreported
            for position in np.flatnonzero(bad):
                row = int(rows[position])
                message = self._annotation_error(anns[position], row, problem(anns[position], row))
                if not self.skip_invalid:
                    raise CocoFormatError(f"{message} ({int(bad.sum())} such annotations)")
                if row < 0:
                    orphans.append(message)
                else:
                    invalid.setdefault(row, message)
            unreported &= ~bad
        if orphans:
            warn_skipped(self.ann_file, orphans, len(anns), "annotations")
        return invalid

    def _drop_images(self, rows: np.ndarray, fields: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """Leaves out the images at ``rows`` and their annotations; renumbers the annotations' rows."""
        keep = np.ones(len(self.image_ids), dtype=bool)
        keep[rows] = False
        self.image_ids, self.file_names = self.image_ids[keep], self.file_names[keep]
        self.heights, self.widths = self.heights[keep], self.widths[keep]
        new_row = np.where(keep, np.cumsum(keep) - 1, -1)
        bbox, category_ids, rows_of_anns, crowd, well_formed = fields
        rows_of_anns = np.where(rows_of_anns >= 0, new_row[rows_of_anns], -1)
        return bbox, category_ids, rows_of_anns, crowd, well_formed

    def _training_boxes(
        self, bbox: np.ndarray, category_ids: np.ndarray, rows: np.ndarray, crowd: np.ndarray, valid: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The training boxes ``[N, 4]`` xyxy of the valid annotations, their labels ``[N]`` and per-image
        offsets ``[num_images + 1]`` (image ``i`` owns rows ``offsets[i]:offsets[i+1]``). Also sets
        ``annotation_index`` ``[N]``: each box's position in the file's ``annotations`` list."""
        valid = valid & (rows >= 0)
        bbox, category_ids, rows, crowd = bbox[valid], category_ids[valid], rows[valid], crowd[valid]
        width, height = self.widths[rows].astype(np.float64), self.heights[rows].astype(np.float64)
        x1, y1 = bbox[:, 0], bbox[:, 1]
        x2, y2 = x1 + bbox[:, 2], y1 + bbox[:, 3]
        xyxy = np.stack([x1.clip(0, width), y1.clip(0, height), x2.clip(0, width), y2.clip(0, height)], axis=1)
        clipped = (xyxy != np.stack([x1, y1, x2, y2], axis=1)).any(1) & ~crowd
        degenerate = ((xyxy[:, 2] <= xyxy[:, 0]) | (xyxy[:, 3] <= xyxy[:, 1])) & ~crowd
        keep = ~crowd & ~degenerate
        logger.info(
            "%s: %d boxes on %d images; left out of the training targets: %d crowd boxes, %d degenerate "
            "(zero width or height); %d clipped to the image",
            self.ann_file,
            len(bbox),
            len(self.image_ids),
            int(crowd.sum()),
            int(degenerate.sum()),
            int(clipped.sum()),
        )
        order = np.argsort(rows[keep], kind="stable")
        self.annotation_index = np.flatnonzero(valid)[keep][order]
        counts = np.bincount(rows[keep], minlength=len(self.image_ids))
        offsets = np.concatenate([[0], np.cumsum(counts)])
        return xyxy[keep][order].astype(np.float32), category_ids[keep][order], offsets


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_well_formed(ann: Any) -> bool:
    return (
        isinstance(ann, dict)
        and all(key in ann for key in ("image_id", "bbox", "category_id"))
        and isinstance(ann["bbox"], list)
        and len(ann["bbox"]) == 4
        and all(_is_number(v) for v in ann["bbox"])
        and isinstance(ann["category_id"], int)
        and isinstance(ann["image_id"], int)
    )


def _malformed_problem(ann: Any, row: int) -> str:
    if not isinstance(ann, dict):
        return f"not a JSON object: {ann!r}"
    if not all(key in ann for key in ("image_id", "bbox", "category_id")):
        return "missing one of the keys 'image_id', 'bbox', 'category_id'"
    return f"bbox {ann['bbox']} is not [x, y, width, height] numbers, or image_id/category_id not integers"
