"""The COCO panoptic LightningDataModule (the built-in toy panoptic dataset when no root is given).

Batches are detection batches (``collate_detection``) whose targets also hold ``masks`` (bool
``[K, H, W]``), one per non-crowd segment, moved by the same augmentations as the boxes.
"""

from __future__ import annotations

import contextlib
import functools
import io
from pathlib import Path
from typing import Any

from pycocotools.coco import COCO
from torch.utils.data import Dataset

from vision_tx.data.coco_panoptic import CocoPanoptic, coco_panoptic_split_paths, load_panoptic_json
from vision_tx.data.detection import CocoDetectionDataModule
from vision_tx.data.toy_panoptic import toy_coco_panoptic_root
from vision_tx.data.transforms import DetectionTransform


def panoptic_boxes_as_coco(panoptic: dict[str, Any]) -> COCO:
    """A pycocotools index of the *thing* segments of a COCO ``panoptic`` file (its JSON content), as box ground truth.

    DETR reports the box AP of its panoptic model on the thing categories; each thing segment
    becomes one instance with the ``bbox``, ``area`` and ``iscrowd`` of its ``segments_info`` entry.
    Stuff categories are left out of the index, so COCOeval ignores predictions of stuff classes.
    """
    things = [c for c in panoptic["categories"] if c.get("isthing", 0)]
    thing_ids = {int(c["id"]) for c in things}
    annotations = []
    for ann in panoptic["annotations"]:
        for segment in ann["segments_info"]:
            if int(segment["category_id"]) not in thing_ids:
                continue
            annotations.append(
                {
                    "id": len(annotations) + 1,  # COCOeval needs unique ids above 0
                    "image_id": int(ann["image_id"]),
                    "category_id": int(segment["category_id"]),
                    "bbox": [float(v) for v in segment["bbox"]],
                    "area": float(segment["area"]),
                    "iscrowd": int(segment.get("iscrowd", 0)),
                }
            )
    coco = COCO()
    coco.dataset = {"images": panoptic["images"], "annotations": annotations, "categories": things}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco.createIndex()
    return coco


class CocoPanopticDataModule(CocoDetectionDataModule):
    """COCO panoptic from ``root`` in the release layout (``root/{train_split,val_split}/``,
    ``root/annotations/panoptic_{split}.json`` and ``root/annotations/panoptic_{split}/*.png``).

    The arguments are :class:`CocoDetectionDataModule`'s; ``root=None`` uses the built-in toy
    panoptic dataset (shapes over sky and ground). The validation ground truth files
    (``val_ann_file``, ``val_png_dir``) are what the panoptic evaluation reads.
    """

    annotation_files = "annotations/panoptic_*.json with the PNG folders annotations/panoptic_*/"

    @staticmethod
    def toy_root(cache_dir: str | None) -> Path:
        return toy_coco_panoptic_root(cache_dir)

    def split_paths(self, split: str) -> tuple[Path, Path, Path]:
        """``(image_dir, ann_file, png_dir)`` of ``split``."""
        return coco_panoptic_split_paths(self.root, split)

    def make_dataset(
        self, paths: tuple[Path, ...], transform: DetectionTransform | None, decode_shorter_side: int | None = None
    ) -> Dataset:
        """The panoptic split: its images decoded whole (``decode_shorter_side`` unused: the segment PNGs are read at
        the images' full size)."""
        return CocoPanoptic(*paths, transform, skip_invalid=self.skip_invalid)

    @property
    def val_png_dir(self) -> Path:
        """The folder of the validation ground-truth PNGs."""
        return self.val_paths[2]

    @functools.cached_property
    def val_panoptic(self) -> dict[str, Any]:
        """The validation ground-truth JSON (``images``, ``annotations``, ``categories``)."""
        return load_panoptic_json(self.val_ann_file)

    @functools.cached_property
    def val_coco(self) -> COCO:
        """Box ground truth of the validation things (see :func:`panoptic_boxes_as_coco`)."""
        return panoptic_boxes_as_coco(self.val_panoptic)

    @property
    def categories(self) -> list[dict[str, Any]]:
        """The panoptic categories (``id``, ``name``, ``isthing``, ...), things and stuff."""
        return self.val_panoptic["categories"]

    @property
    def category_names(self) -> dict[int, str]:
        return {int(c["id"]): c["name"] for c in self.categories}

    @property
    def is_thing(self) -> dict[int, bool]:
        """Category id -> whether it is a thing (countable) rather than stuff."""
        return {int(c["id"]): bool(c.get("isthing", 0)) for c in self.categories}
