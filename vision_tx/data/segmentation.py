"""Semantic-segmentation augmentation (mmsegmentation's ADE20K pipeline), batching and the DataModule.

Transforms act on ``(tv_tensors.Image, tv_tensors.Mask)`` pairs with ``torchvision.transforms.v2``:
geometric steps move the label map with the image (nearest-neighbour), photometric steps and
normalisation touch the image only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from vision_tx.data.ade20k import ADE20K_CLASSES, IGNORE_INDEX, ADE20KDataset
from vision_tx.data.sampling import ResumableLoader, process_share
from vision_tx.data.toy_segmentation import TOY_CLASSES, toy_segmentation_root
from vision_tx.data.transforms import IMAGENET_MEAN, IMAGENET_STD

logger = logging.getLogger(__name__)


def keep_ratio_size(height: int, width: int, scale: Sequence[int]) -> tuple[int, int]:
    """The ``(h, w)`` that fits an image of ``height`` and ``width`` inside ``scale`` = (long, short) edge limits,
    keeping its ratio.

    As mmcv's ``rescale_size``: factor ``min(long / max(h, w), short / min(h, w))``, sizes rounded.
    """
    factor = min(max(scale) / max(height, width), min(scale) / min(height, width))
    return int(height * factor + 0.5), int(width * factor + 0.5)


def _uniform(low: float, high: float) -> float:
    """A uniform float in ``[low, high]`` from torch's generator (seeded per DataLoader worker)."""
    return low + (high - low) * float(torch.rand(()))


def _randint(low: int, high: int) -> int:
    """A uniform integer in ``[low, high]`` from torch's generator."""
    return int(torch.randint(low, high + 1, ()))


def _image_size(flat_inputs: list[Any]) -> tuple[int, int]:
    return tuple(F.get_size(next(x for x in flat_inputs if isinstance(x, tv_tensors.Image))))


class RandomRescale(v2.Transform):
    """Resizes to :func:`keep_ratio_size` of ``scale`` times a ratio drawn uniformly from ``ratio_range``.

    ``ratio_range=(1, 1)`` is a plain keep-ratio resize. Images are resized bilinearly, masks by
    nearest neighbour.
    """

    def __init__(self, scale: Sequence[int], ratio_range: Sequence[float] = (1.0, 1.0)) -> None:
        super().__init__()
        self.scale = tuple(scale)
        self.ratio_range = tuple(ratio_range)

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        ratio = _uniform(*self.ratio_range)
        return {"size": keep_ratio_size(*_image_size(flat_inputs), [s * ratio for s in self.scale])}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.resize, inpt, params["size"], antialias=True)


class RandomCropCatMax(v2.Transform):
    """A random ``size`` crop (the whole side where the image is smaller) in which no class covers more
    than ``cat_max_ratio`` of the labelled pixels.

    As mmsegmentation's ``RandomCrop``: up to ``max_tries`` positions are drawn; a crop passes when it
    holds more than one class and its largest class is under the ratio, else the last draw is kept.
    """

    def __init__(
        self, size: Sequence[int], cat_max_ratio: float = 0.75, ignore_index: int = IGNORE_INDEX, max_tries: int = 10
    ) -> None:
        super().__init__()
        self.size = tuple(size)
        self.cat_max_ratio = cat_max_ratio
        self.ignore_index = ignore_index
        self.max_tries = max_tries

    def _draw(self, height: int, width: int) -> dict[str, int]:
        crop_h, crop_w = min(self.size[0], height), min(self.size[1], width)
        top, left = _randint(0, height - crop_h), _randint(0, width - crop_w)
        return {"top": top, "left": left, "height": crop_h, "width": crop_w}

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = _image_size(flat_inputs)
        masks = [x for x in flat_inputs if isinstance(x, tv_tensors.Mask)]
        params = self._draw(height, width)
        if self.cat_max_ratio >= 1 or not masks:
            return params
        for _ in range(self.max_tries):
            window = masks[0][
                params["top"] : params["top"] + params["height"], params["left"] : params["left"] + params["width"]
            ]
            counts = torch.bincount(window[window != self.ignore_index].flatten())
            counts = counts[counts > 0]
            if len(counts) > 1 and counts.max() / counts.sum() < self.cat_max_ratio:
                break
            params = self._draw(height, width)
        return params

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.crop, inpt, **params)


class PhotometricDistortion(v2.Transform):
    """mmsegmentation's photometric distortion of a float ``[0, 1]`` image, each step with probability 1/2.

    Brightness adds a delta in ``±brightness_delta``, contrast multiplies by a factor in
    ``contrast_range`` (before or after the colour steps, at random), saturation blends with the
    greyscale image by a factor in ``saturation_range`` (torchvision's definition; mmseg scales
    the HSV saturation) and hue shifts by a fraction of the colour circle in ``±hue_delta``.
    """

    def __init__(
        self,
        brightness_delta: float = 32 / 255,
        contrast_range: Sequence[float] = (0.5, 1.5),
        saturation_range: Sequence[float] = (0.5, 1.5),
        hue_delta: float = 18 / 180,
    ) -> None:
        super().__init__()
        self.brightness_delta = brightness_delta
        self.contrast_range = tuple(contrast_range)
        self.saturation_range = tuple(saturation_range)
        self.hue_delta = hue_delta

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        def maybe(low: float, high: float, neutral: float) -> float:
            return _uniform(low, high) if _uniform(0, 1) < 0.5 else neutral

        return {
            "brightness": maybe(-self.brightness_delta, self.brightness_delta, 0.0),
            "contrast": maybe(*self.contrast_range, 1.0),
            "contrast_first": _uniform(0, 1) < 0.5,
            "saturation": maybe(*self.saturation_range, 1.0),
            "hue": maybe(-self.hue_delta, self.hue_delta, 0.0),
        }

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if not isinstance(inpt, tv_tensors.Image):
            return inpt
        if not inpt.is_floating_point():
            raise TypeError(
                "PhotometricDistortion needs a float image in [0, 1]; put ToDtype(float32, scale=True) first"
            )
        image = (inpt + params["brightness"]).clamp(0, 1)
        if params["contrast_first"]:
            image = (image * params["contrast"]).clamp(0, 1)
        image = F.adjust_saturation(image, params["saturation"])
        image = F.adjust_hue(image, params["hue"])
        if not params["contrast_first"]:
            image = (image * params["contrast"]).clamp(0, 1)
        return tv_tensors.wrap(image, like=inpt)


class PadTo(v2.Transform):
    """Pads on the bottom and right up to ``size``: images with ``0`` (the mean, after normalisation),
    masks with ``ignore_index``."""

    def __init__(self, size: Sequence[int], ignore_index: int = IGNORE_INDEX) -> None:
        super().__init__()
        self.size = tuple(size)
        self.ignore_index = ignore_index

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = _image_size(flat_inputs)
        return {"padding": [0, 0, max(self.size[1] - width, 0), max(self.size[0] - height, 0)]}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        fill = self.ignore_index if isinstance(inpt, tv_tensors.Mask) else 0
        return self._call_kernel(F.pad, inpt, params["padding"], fill=fill)


def train_transforms(
    scale: Sequence[int] = (2048, 512),
    ratio_range: Sequence[float] = (0.5, 2.0),
    crop_size: Sequence[int] = (512, 512),
    cat_max_ratio: float = 0.75,
    ignore_index: int = IGNORE_INDEX,
) -> v2.Compose:
    """The training pipeline: random rescale (``scale`` (long, short) edge limits times a factor in ``ratio_range``),
    cat-max crop to ``crop_size`` (no class over ``cat_max_ratio`` of it, ``ignore_index`` pixels not counted),
    flip, photometric distortion, normalise, pad to ``crop_size`` (labels with ``ignore_index``)."""
    return v2.Compose(
        [
            RandomRescale(scale, ratio_range),
            RandomCropCatMax(crop_size, cat_max_ratio, ignore_index),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            PhotometricDistortion(),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            PadTo(crop_size, ignore_index),
        ]
    )


class ValTransform:
    """Keep-ratio resize of the image into ``scale`` and normalisation; the label keeps its original size,
    as predictions are scored at the original resolution."""

    def __init__(self, scale: Sequence[int] = (2048, 512)) -> None:
        self.image_pipeline = v2.Compose(
            [RandomRescale(scale), v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        )

    def __call__(self, image: tv_tensors.Image, label: tv_tensors.Mask) -> tuple[torch.Tensor, torch.Tensor]:
        return self.image_pipeline(image), label

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.image_pipeline})"


def collate_segmentation(
    batch: Sequence[tuple[torch.Tensor, torch.Tensor]], ignore_index: int = IGNORE_INDEX
) -> dict[str, Any]:
    """Pads the images (with 0) and labels (with ``ignore_index``) of a ``batch`` of ``(image [3,H,W], label [H,W])``
    pairs to the largest in the batch, bottom and right.

    Returns ``images`` ``[B, 3, H, W]`` float, ``labels`` ``[B, H', W']`` int64, ``image_sizes`` and
    ``label_sizes`` ``[B, 2]`` int64: the unpadded ``(h, w)`` of each.
    """
    images = [image.as_subclass(torch.Tensor) for image, _ in batch]
    labels = [label.as_subclass(torch.Tensor) for _, label in batch]

    def pad(tensors: list[torch.Tensor], value: float) -> torch.Tensor:
        height = max(t.shape[-2] for t in tensors)
        width = max(t.shape[-1] for t in tensors)
        out = tensors[0].new_full((len(tensors), *tensors[0].shape[:-2], height, width), value)
        for i, t in enumerate(tensors):
            out[i, ..., : t.shape[-2], : t.shape[-1]] = t
        return out

    return {
        "images": pad(images, 0.0),
        "labels": pad(labels, ignore_index),
        "image_sizes": torch.tensor([tuple(t.shape[-2:]) for t in images]),
        "label_sizes": torch.tensor([tuple(t.shape[-2:]) for t in labels]),
    }


class SegmentationDataModule(pl.LightningDataModule):
    """ADE20K-layout data (ADE20K itself under ``root``, or the built-in toy set when ``root`` is None).

    ``batch_size`` is per process (the papers' 16 images are 8 GPUs x 2). Sizes follow
    mmsegmentation's ADE20K recipe: ``scale`` is the (long, short) edge limit of the keep-ratio
    resize, scaled by a ratio in ``ratio_range`` for training, then cropped to ``crop_size``.
    Under DDP each validation image is scored by exactly one process (no padding duplicates).
    ``toy_cache_dir`` is the folder the toy set is generated in (default ``~/.cache/vision_tx/toy_segmentation``).
    ``skip_invalid=True`` skips invalid images with a warning instead of stopping (``ADE20KDataset``).
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        train_split: str = "training",
        val_split: str = "validation",
        scale: tuple[int, int] = (2048, 512),
        ratio_range: tuple[float, float] = (0.5, 2.0),
        crop_size: tuple[int, int] = (512, 512),
        cat_max_ratio: float = 0.75,
        batch_size: int = 2,
        val_batch_size: int = 1,
        num_workers: int = 4,
        toy_cache_dir: str | None = None,
        skip_invalid: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.root = root
        self.class_names: tuple[str, ...] = ADE20K_CLASSES if root is not None else TOY_CLASSES
        self.ignore_index = IGNORE_INDEX

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def label_extent(self) -> tuple[str, int, str]:
        """The dataset's root, its largest class index and that class's name: a model must predict up to it."""
        root = self.root if self.root is not None else toy_segmentation_root(self.hparams.toy_cache_dir)
        return str(root), self.num_classes - 1, self.class_names[-1]

    def _data_root(self) -> str | os.PathLike:
        if self.root is not None:
            return self.root
        root = toy_segmentation_root(self.hparams.toy_cache_dir)
        logger.warning("no data.root given: using the built-in toy segmentation dataset at %s", root)
        return root

    def prepare_data(self) -> None:
        if self.root is None:
            toy_segmentation_root(self.hparams.toy_cache_dir)

    def setup(self, stage: str | None = None) -> None:
        root = self._data_root()
        hp = self.hparams
        if stage in (None, "fit"):
            pipeline = train_transforms(hp.scale, hp.ratio_range, hp.crop_size, hp.cat_max_ratio, self.ignore_index)
            self.train_set = ADE20KDataset(
                root, hp.train_split, pipeline, self.class_names, skip_invalid=hp.skip_invalid
            )
        self.val_set = ADE20KDataset(
            root, hp.val_split, ValTransform(hp.scale), self.class_names, skip_invalid=hp.skip_invalid
        )

    def _loader_options(self) -> dict[str, Any]:
        workers = self.hparams.num_workers
        return {
            "num_workers": workers,
            "persistent_workers": workers > 0,
            "pin_memory": torch.cuda.is_available(),
            "collate_fn": collate_segmentation,
        }

    def train_dataloader(self) -> DataLoader:
        return ResumableLoader(self.train_set, self.hparams.batch_size, **self._loader_options())

    def val_dataloader(self) -> DataLoader:
        world_size, rank = process_share()
        sampler = UnrepeatedDistributedSampler(self.val_set, num_replicas=world_size, rank=rank, shuffle=False)
        return DataLoader(self.val_set, self.hparams.val_batch_size, sampler=sampler, **self._loader_options())
