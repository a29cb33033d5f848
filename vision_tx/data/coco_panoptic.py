"""COCO panoptic segmentation: the release layout, PNG segment ids, and prediction files.

A panoptic annotation is one RGB PNG per image whose pixels hold segment ids
(``id = R + 256 G + 65536 B``, 0 = unlabelled) and a JSON entry per image listing its segments
(``segments_info``: ``id``, ``category_id``, ``iscrowd``, ``bbox`` xywh, ``area``). The release layout:

    ROOT/{train2017,val2017}/*.jpg
    ROOT/annotations/panoptic_{train2017,val2017}.json
    ROOT/annotations/panoptic_{train2017,val2017}/*.png

Training targets hold one binary mask per non-crowd segment; crowd segments stay in the files,
where the evaluator reads them. Invalid records are errors that name the file; with
``skip_invalid=True`` they are skipped with a warning (``vision_tx.data.invalid``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.ops import masks_to_boxes

from vision_tx.data.coco import CocoFormatError, Target, Transforms, category_names, read_coco_image
from vision_tx.data.invalid import SkippingDataset, warn_skipped
from vision_tx.io import write_json_atomic

MAX_SEGMENT_ID = 256**3 - 1

# Pixel-wise work is done in NumPy: its single-threaded loops are many times faster than torch's
# intra-op threads on a CPU that data-loader workers or other processes keep busy.


def rgb_to_id(rgb: torch.Tensor) -> torch.Tensor:
    """Segment ids ``[..., H, W]`` int64 from PNG colours ``rgb [..., 3, H, W]`` (``R + 256 G + 65536 B``)."""
    rgb = rgb.cpu().numpy().astype(np.int64)
    return torch.from_numpy(rgb[..., 0, :, :] + 256 * rgb[..., 1, :, :] + 65536 * rgb[..., 2, :, :])


def id_to_rgb(ids: torch.Tensor) -> torch.Tensor:
    """PNG colours ``[..., 3, H, W]`` uint8 from segment ``ids [..., H, W]`` (inverse of :func:`rgb_to_id`)."""
    ids = ids.cpu().numpy().astype(np.int64)
    return torch.from_numpy(np.stack([ids % 256, ids // 256 % 256, ids // 65536 % 256], axis=-3).astype(np.uint8))


def read_panoptic_png(path: str | os.PathLike) -> torch.Tensor:
    """Segment ids ``[H, W]`` int64 of the COCO panoptic PNG at ``path``; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise CocoFormatError(f"{path}: panoptic PNG not found")
    try:
        with Image.open(path) as png:
            if png.format != "PNG" or png.mode != "RGB":
                raise CocoFormatError(
                    f"{path}: a panoptic PNG is 8-bit RGB (segment id = R + 256 G + 65536 B), "
                    f"got {png.format} mode {png.mode}"
                )
            rgb = np.array(png)
    except OSError as err:
        raise CocoFormatError(f"{path}: not a readable PNG ({err})") from err
    return rgb_to_id(torch.from_numpy(rgb).permute(2, 0, 1))


def segment_index(ids: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """Where each pixel's segment of ``ids [H, W]`` sits in ``segment_ids`` ``[K]``, plus one: ``[H, W]`` int64 in
    ``[0, K]``, 0 for unlabelled pixels (id 0). Raises ``ValueError`` naming the ids that ``segment_ids`` lacks."""
    ids, segment_ids = ids.cpu().numpy().astype(np.int64), segment_ids.cpu().numpy().astype(np.int64)
    if len(segment_ids) == 0:
        index, found = np.zeros_like(ids), np.zeros(ids.shape, dtype=bool)
    else:
        order = np.argsort(segment_ids, kind="stable")
        index = order[np.searchsorted(segment_ids, ids, sorter=order).clip(max=len(segment_ids) - 1)]
        found = segment_ids[index] == ids
    unlisted = ~found & (ids != 0)
    if unlisted.any():
        raise ValueError(f"segment id(s) {np.unique(ids[unlisted])[:10].tolist()} are not in its segments_info")
    return torch.from_numpy(np.where(found, index + 1, 0))


def write_panoptic_png(path: str | os.PathLike, ids: torch.Tensor) -> None:
    """Writes segment ``ids [H, W]`` (integers in ``[0, 2**24)``) as a COCO panoptic RGB PNG to ``path``."""
    if ids.ndim != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"{path}: segment ids must be an integer [H, W] map, got {tuple(ids.shape)} {ids.dtype}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) > MAX_SEGMENT_ID):
        raise ValueError(
            f"{path}: segment ids must lie in [0, {MAX_SEGMENT_ID}], got [{int(ids.min())}, {int(ids.max())}]"
        )
    Image.fromarray(id_to_rgb(ids).permute(1, 2, 0).numpy()).save(path, format="PNG")


def load_panoptic_json(
    path: str | os.PathLike, keys: tuple[str, ...] = ("images", "annotations", "categories")
) -> dict[str, Any]:
    """Reads the COCO panoptic JSON file at ``path``, which must hold ``keys`` (a prediction file needs only
    ``annotations``); errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise CocoFormatError(f"{path}: panoptic annotation file not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CocoFormatError(f"{path}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from err
    missing = [key for key in keys if not isinstance(data, dict) or key not in data]
    if missing:
        raise CocoFormatError(f"{path}: not a COCO panoptic file: missing top-level keys {missing}")
    for ann in data["annotations"]:
        if not all(key in ann for key in ("image_id", "file_name", "segments_info")):
            raise CocoFormatError(
                f"{path}: annotation of image {ann.get('image_id')} lacks one of "
                "'image_id', 'file_name', 'segments_info'"
            )
    return data


def coco_panoptic_split_paths(root: str | os.PathLike, split: str) -> tuple[Path, Path, Path]:
    """``(image_dir, ann_file, png_dir)`` of ``split`` (e.g. ``"val2017"``) under a COCO panoptic ``root``."""
    root = Path(root)
    image_dir = root / split
    ann_file = root / "annotations" / f"panoptic_{split}.json"
    png_dir = root / "annotations" / f"panoptic_{split}"
    missing = [str(p) for p in (image_dir, ann_file, png_dir) if not p.exists()]
    if missing:
        raise CocoFormatError(
            f"{root}: not a COCO panoptic root, missing {', '.join(missing)}. Expected the layout\n"
            f"  {root}/{split}/*.jpg\n  {root}/annotations/panoptic_{split}.json\n"
            f"  {root}/annotations/panoptic_{split}/*.png"
        )
    return image_dir, ann_file, png_dir


class CocoPanoptic(SkippingDataset[tuple[Any, Target]]):
    """COCO panoptic segments as ``(image, target)``.

    ``image`` is a ``tv_tensors.Image`` ``[3, H, W]`` uint8 RGB (``vision_tx.data.image_io``); ``target``
    holds, per non-crowd segment present in the PNG, ``masks`` (``tv_tensors.Mask`` ``[K, H, W]`` bool),
    ``labels`` (int64 ``[K]``, category ids) and ``boxes`` (``tv_tensors.BoundingBoxes`` ``[K, 4]``
    xyxy around whole pixels: ``x2 = last column + 1``, as COCO's ``bbox`` xywh); and ``image_id``
    (int), ``orig_size``, ``size`` (int64 ``[2]``, h, w). ``transforms(image, target)`` is applied last.
    ``categories`` lists the file's categories (``id``, ``name``, ``isthing``, ...). With
    ``skip_invalid=True`` an image with an invalid record or a missing file is left out, and one
    that fails to read is replaced by the next.
    """

    format_error = CocoFormatError

    def __init__(
        self,
        image_dir: str | os.PathLike,
        ann_file: str | os.PathLike,
        png_dir: str | os.PathLike,
        transforms: Transforms | None = None,
        skip_invalid: bool = False,
    ):
        self.image_dir = Path(image_dir)
        self.ann_file = Path(ann_file)
        self.png_dir = Path(png_dir)
        self.transforms = transforms
        super().__init__(skip_invalid)
        for folder, what in ((self.image_dir, "image"), (self.png_dir, "panoptic PNG")):
            if not folder.is_dir():
                raise CocoFormatError(f"{folder}: {what} folder not found (of {self.ann_file})")
        data = load_panoptic_json(self.ann_file)
        self.categories = data["categories"]
        self._category_ids = set(category_names(self.categories, self.ann_file))
        images = self._index_images(data["images"])
        anns, problems = [], []
        present = (set(os.listdir(self.image_dir)), set(os.listdir(self.png_dir)))
        for ann in data["annotations"]:
            problem = self._annotation_problem(ann, images, present)
            if problem is None:
                anns.append(ann)
            elif not skip_invalid:
                raise CocoFormatError(problem)
            else:
                problems.append(problem)
        if problems:
            warn_skipped(self.ann_file, problems, len(data["annotations"]), "images")
        # Plain arrays rather than lists of dicts: DataLoader workers share them without copying.
        self.image_ids = np.array([ann["image_id"] for ann in anns], dtype=np.int64)
        self.file_names = np.array([images[ann["image_id"]]["file_name"] for ann in anns])
        self.png_names = np.array([ann["file_name"] for ann in anns])
        self.heights = np.array([images[ann["image_id"]]["height"] for ann in anns], dtype=np.int64)
        self.widths = np.array([images[ann["image_id"]]["width"] for ann in anns], dtype=np.int64)
        self.segment_ids, self.segment_labels, self.segment_crowd, self.offsets = self._read_segments(anns)
        self._row_of_image_id = {int(image_id): row for row, image_id in enumerate(self.image_ids)}

    def __len__(self) -> int:
        return len(self.image_ids)

    def _load(self, index: int) -> tuple[Any, Target]:
        size = (int(self.heights[index]), int(self.widths[index]))
        image = read_coco_image(
            self.image_dir / self.file_names[index], int(self.image_ids[index]), size, self.ann_file
        )
        positions, present = self._read_positions(index, tuple(image.shape[-2:]))
        start, end = self.offsets[index], self.offsets[index + 1]
        keep = present & ~self.segment_crowd[start:end]
        masks = torch.from_numpy(positions.numpy()[None] == (np.flatnonzero(keep) + 1)[:, None, None])
        boxes = masks_to_boxes(masks) + torch.tensor([0.0, 0.0, 1.0, 1.0])
        size = torch.tensor(tuple(image.shape[-2:]))
        target = {
            "masks": tv_tensors.Mask(masks),
            "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=tuple(image.shape[-2:])),
            "labels": torch.from_numpy(self.segment_labels[start:end][keep]),
            "image_id": int(self.image_ids[index]),
            "orig_size": size,
            "size": size.clone(),
        }
        if self.transforms is not None:
            return self.transforms(image, target)
        return image, target

    def ground_truth(self, image_id: int) -> tuple[torch.Tensor, list[dict[str, int]]]:
        """The evaluation ground truth of ``image_id``: segment ids ``[H, W]`` int64 and its
        ``segments_info`` (``id``, ``category_id``, ``iscrowd``), crowd segments included."""
        index = self._row_of_image_id[int(image_id)]
        ids = read_panoptic_png(self.png_dir / self.png_names[index])
        start, end = self.offsets[index], self.offsets[index + 1]
        segments = [
            {"id": int(i), "category_id": int(c), "iscrowd": int(k)}
            for i, c, k in zip(
                self.segment_ids[start:end], self.segment_labels[start:end], self.segment_crowd[start:end]
            )
        ]
        return ids, segments

    def _read_positions(self, index: int, size: tuple[int, int]) -> tuple[torch.Tensor, np.ndarray]:
        """The PNG's segments ``[H, W]`` as positions in the image's ``segments_info`` plus one (0 =
        unlabelled), checked against the image size and ``segments_info``, and which of the listed
        segments cover any pixel (bool ``[K]``)."""
        path = self.png_dir / self.png_names[index]
        ids = read_panoptic_png(path)
        if tuple(ids.shape) != size:
            raise CocoFormatError(
                f"{path}: the panoptic PNG is {tuple(ids.shape)} (h, w) but its image "
                f"{self.file_names[index]} is {size} (image id {self.image_ids[index]})"
            )
        start, end = self.offsets[index], self.offsets[index + 1]
        try:
            positions = segment_index(ids, torch.from_numpy(self.segment_ids[start:end]))
        except ValueError as err:
            raise CocoFormatError(f"{path}: {err} (image id {self.image_ids[index]} in {self.ann_file})") from err
        present = np.bincount(positions.numpy().ravel(), minlength=end - start + 1)[1:] > 0
        absent = self.segment_ids[start:end][~present].tolist()
        if absent:
            warnings.warn(
                f"{path}: segment id(s) {absent[:10]} of the segments_info of image id {self.image_ids[index]} "
                f"in {self.ann_file} cover no pixel of the PNG; they are left out of the target",
                stacklevel=3,
            )
        return positions, present

    def _index_images(self, images: list[Any]) -> dict[Any, dict[str, Any]]:
        """``{id: entry}`` of the file's ``images``, each checked for ``id``, ``file_name``, ``height``, ``width``."""
        for image in images:
            if not isinstance(image, dict) or not all(key in image for key in ("id", "file_name", "height", "width")):
                raise CocoFormatError(
                    f"{self.ann_file}: every entry of 'images' needs 'id', 'file_name', 'height' and 'width', "
                    f"got {image!r}"
                )
        return {image["id"]: image for image in images}

    def _annotation_problem(
        self, ann: dict[str, Any], images: dict[Any, dict[str, Any]], present: tuple[set[str], set[str]]
    ) -> str | None:
        """What makes the annotation of one image unusable (naming the file and the record), or None."""
        if ann["image_id"] not in images:
            return f"{self.ann_file}: annotation {ann['file_name']} has image_id {ann['image_id']}, not in 'images'"
        known = self._category_ids
        seen = set()
        for seg in ann["segments_info"]:
            where = f"{self.ann_file}: segment id {seg.get('id')} of {ann['file_name']} (image id {ann['image_id']})"
            if not all(key in seg for key in ("id", "category_id")):
                return f"{where}: missing 'id' or 'category_id'"
            if seg["category_id"] not in known:
                return f"{where}: unknown category id {seg['category_id']} (ids {sorted(known)})"
            if not isinstance(seg["id"], int) or not 0 < seg["id"] <= MAX_SEGMENT_ID or seg["id"] in seen:
                return f"{where}: ids must be unique per image and in [1, {MAX_SEGMENT_ID}]"
            seen.add(seg["id"])
        for folder, name, names, what in (
            (self.image_dir, images[ann["image_id"]]["file_name"], present[0], "image"),
            (self.png_dir, ann["file_name"], present[1], "panoptic PNG"),
        ):
            if name not in names and not (folder / name).is_file():
                return f"{folder / name}: {what} file not found (image id {ann['image_id']} in {self.ann_file})"
        return None

    def _read_segments(self, anns: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Flat per-segment ``ids``, ``category ids``, ``iscrowd`` and per-image ``offsets``
        (``[num_images + 1]``: image ``i`` owns segments ``offsets[i]:offsets[i+1]``)."""
        segments = [seg for ann in anns for seg in ann["segments_info"]]
        offsets = np.concatenate([[0], np.cumsum([len(ann["segments_info"]) for ann in anns], dtype=np.int64)])
        return (
            np.array([seg["id"] for seg in segments], dtype=np.int64),
            np.array([seg["category_id"] for seg in segments], dtype=np.int64),
            np.array([bool(seg.get("iscrowd", 0)) for seg in segments], dtype=bool),
            offsets,
        )


def _segment_record(segment: dict[str, Any], mask: np.ndarray) -> dict[str, Any]:
    ys, xs = np.nonzero(mask)
    x1, y1, x2, y2 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
    return {
        **{key: value for key, value in segment.items() if key not in ("area", "bbox")},
        "id": int(segment["id"]),
        "category_id": int(segment["category_id"]),
        "iscrowd": int(segment.get("iscrowd", 0)),
        "bbox": [x1, y1, x2 - x1, y2 - y1],
        "area": len(xs),
    }


def write_panoptic_predictions(
    json_path: str | os.PathLike,
    png_folder: str | os.PathLike,
    predictions: Iterable[dict[str, Any]],
    categories: list[dict[str, Any]],
) -> Path:
    """Writes ``predictions`` as a COCO panoptic JSON file ``json_path`` and a folder ``png_folder`` of PNGs, both
    atomically; a segment's ``category_id`` must be one of ``categories`` (COCO category dicts, written into the JSON).

    Each prediction is ``{"image_id": int, "segment_ids": [H, W] int (0 = no segment),
    "segments_info": [{"id", "category_id", ...}]}`` with an optional ``"file_name"`` (default
    ``{image_id:012d}.png``). ``area`` and ``bbox`` are recomputed from the map; segments that cover
    no pixel are dropped. The PNGs go to a temporary folder that replaces ``png_folder`` once all are
    written, and the JSON is written last, so a reader never sees a JSON without its PNGs.
    """
    json_path, png_folder = Path(json_path), Path(png_folder)
    known = {int(c["id"]) for c in categories}
    png_folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{png_folder.name}.", dir=png_folder.parent))
    try:
        annotations = []
        for pred in predictions:
            image_id = int(pred["image_id"])
            ids = torch.as_tensor(pred["segment_ids"]).cpu().long()
            file_name = pred.get("file_name", f"{image_id:012d}.png")
            listed = list(pred["segments_info"])
            unknown = sorted({int(seg["category_id"]) for seg in listed} - known)
            if unknown:
                raise ValueError(
                    f"prediction for image id {image_id}: unknown category id(s) {unknown} (ids {sorted(known)})"
                )
            try:
                positions = segment_index(ids, torch.tensor([int(seg["id"]) for seg in listed], dtype=torch.int64))
            except ValueError as err:
                raise ValueError(f"prediction for image id {image_id}: {err}") from err
            positions = positions.numpy()
            areas = np.bincount(positions.ravel(), minlength=len(listed) + 1)[1:].tolist()
            write_panoptic_png(tmp / file_name, ids)
            segments = [_segment_record(seg, positions == k + 1) for k, seg in enumerate(listed) if areas[k]]
            annotations.append({"image_id": image_id, "file_name": file_name, "segments_info": segments})
        if png_folder.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{png_folder.name}.old.", dir=png_folder.parent))
            os.replace(png_folder, old / "pngs")
            os.replace(tmp, png_folder)
            shutil.rmtree(old)
        else:
            os.replace(tmp, png_folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return write_json_atomic({"annotations": annotations, "categories": categories}, json_path)
