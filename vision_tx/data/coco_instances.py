"""COCO instance segmentation: the detection dataset plus each instance's mask, decoded from the polygons
or run-length encodings of ``instances_*.json`` (its LightningDataModule: ``vision_tx.data.detection``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from pycocotools import mask as mask_utils
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from vision_tx.data.coco import CocoDetection, CocoFormatError, Target


def annotation_mask(segmentation: Any, height: int, width: int) -> np.ndarray:
    """A COCO ``segmentation`` (polygon list, uncompressed RLE with a ``counts`` list, or compressed RLE) of an image of
    ``height`` and ``width`` -> bool ``[height, width]``."""
    if isinstance(segmentation, list):  # polygons: one RLE each, merged
        rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width)) if segmentation else None
    elif isinstance(segmentation, dict) and isinstance(segmentation.get("counts"), list):
        rle = mask_utils.frPyObjects(segmentation, height, width)
    elif isinstance(segmentation, dict) and "counts" in segmentation:
        rle = dict(segmentation)
        if isinstance(rle["counts"], str):
            rle["counts"] = rle["counts"].encode("ascii")
    else:
        raise ValueError(f"segmentation must be polygons or an RLE dict, got {type(segmentation).__name__}")
    if rle is None:
        return np.zeros((height, width), dtype=bool)
    return mask_utils.decode(rle).astype(bool)


def masks_at_size(masks: tv_tensors.Mask, size: list[int]) -> tv_tensors.Mask:
    """``masks [K, H, W]`` at ``size`` (h, w): resized (nearest) where an image was decoded reduced, else as given."""
    return masks if list(masks.shape[-2:]) == size else F.resize(masks, size)


class CocoInstances(CocoDetection):
    """COCO instances as ``(image, target)``: :class:`CocoDetection`'s targets plus ``masks``
    (``tv_tensors.Mask`` ``[K, H, W]`` bool, one per training box, in the same order), moved by the
    same ``transforms``. An annotation without a readable ``segmentation`` is an error naming it, when its
    mask is decoded. ``masks_in_targets=False`` yields :class:`CocoDetection`'s targets alone and decodes an
    item's masks only when :meth:`instance_masks` asks for them (copy-paste's source images). With
    ``decode_shorter_side`` (see :class:`CocoDetection`) the targets' masks are resized (nearest) to the reduced
    image."""

    def __init__(
        self,
        image_dir: str | os.PathLike,
        ann_file: str | os.PathLike,
        transforms: Any = None,
        skip_invalid: bool = False,
        masks_in_targets: bool = True,
        decode_shorter_side: int | None = None,
    ) -> None:
        super().__init__(image_dir, ann_file, None, skip_invalid, decode_shorter_side)
        self.segmentations = [self._all_segmentations[i] for i in self.annotation_index]
        del self._all_segmentations
        self.instance_transforms = transforms
        self.masks_in_targets = masks_in_targets

    @property
    def objects_without_masks(self) -> int:
        """How many training objects have no (or an empty) ``segmentation``."""
        return sum(1 for segmentation in self.segmentations if not segmentation)

    def _annotation_fields(self, anns: list[dict[str, Any]]) -> tuple[np.ndarray, ...]:
        self._all_segmentations = [ann.get("segmentation") if isinstance(ann, dict) else None for ann in anns]
        return super()._annotation_fields(anns)

    def instance_masks(self, index: int) -> tv_tensors.Mask:
        """Item ``index``'s masks, untransformed: ``[K, H, W]`` bool in the image's own pixels, one per training box."""
        height, width = int(self.heights[index]), int(self.widths[index])
        start, end = self.offsets[index], self.offsets[index + 1]
        masks = []
        for row in range(start, end):
            try:
                masks.append(annotation_mask(self.segmentations[row], height, width))
            except (ValueError, TypeError, KeyError) as err:
                raise CocoFormatError(
                    f"{self.ann_file}: annotation {int(self.annotation_index[row])} "
                    f"of image {int(self.image_ids[index])}: {err}"
                ) from err
        stacked = np.stack(masks) if masks else np.zeros((0, height, width), dtype=bool)
        return tv_tensors.Mask(torch.from_numpy(stacked))

    def _load(self, index: int) -> tuple[Any, Target]:
        image, target = super()._load(index)
        if self.masks_in_targets:
            target["masks"] = masks_at_size(self.instance_masks(index), target["size"].tolist())
        if self.instance_transforms is not None:
            return self.instance_transforms(image, target)
        return image, target
