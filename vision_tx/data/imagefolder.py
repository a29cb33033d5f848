"""Image classification data in torchvision's ImageFolder layout (``ROOT/{train,val}/CLASS/*.jpg``) with
DeiT's augmentation, and its DataModule (the built-in toy set when no root is given)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader
from torchvision import tv_tensors
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes
from torchvision.transforms import v2

from vision_tx.data.image_io import read_rgb_image
from vision_tx.data.invalid import InvalidDataError
from vision_tx.data.sampling import ResumableLoader, process_share
from vision_tx.data.toy_classification import toy_classification_root
from vision_tx.data.transforms import IMAGENET_MEAN, IMAGENET_STD

logger = logging.getLogger(__name__)
MEAN_FILL = [round(255 * m) for m in IMAGENET_MEAN]


class RandAugment(v2.RandAugment):
    """torchvision's RandAugment with timm's magnitude scale and noise (DeiT's ``rand-m9-mstd0.5``):
    each of the ``num_ops`` operations draws its magnitude from ``N(magnitude, magnitude_std)`` on a
    0..10 scale (clipped), 10 being torchvision's largest magnitude of that operation."""

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: float = 9.0,
        magnitude_std: float = 0.5,
        fill: Sequence[int] | None = tuple(MEAN_FILL),
    ) -> None:
        super().__init__(
            num_ops=1,
            magnitude=0,
            num_magnitude_bins=101,
            interpolation=v2.InterpolationMode.BILINEAR,
            fill=None if fill is None else list(fill),
        )
        self.ops = num_ops
        self.mean_magnitude = magnitude
        self.magnitude_std = magnitude_std

    def forward(self, *inputs: Any) -> Any:
        for _ in range(self.ops):
            level = self.mean_magnitude + self.magnitude_std * float(torch.randn(()))
            self.magnitude = round(10 * min(max(level, 0.0), 10.0))  # index into 101 bins over 0..10
            inputs = super().forward(*inputs) if len(inputs) > 1 else (super().forward(*inputs),)
        return inputs if len(inputs) > 1 else inputs[0]


def train_transforms(
    size: int = 224,
    scale: tuple[float, float] = (0.08, 1.0),
    hflip: float = 0.5,
    rand_augment_ops: int = 2,
    rand_augment_magnitude: float = 9.0,
    rand_augment_std: float = 0.5,
    random_erasing: float = 0.25,
) -> v2.Compose:
    """DeiT's training pipeline on a uint8 image: random resized crop to ``size`` (bicubic, area ``scale``), flip with
    probability ``hflip``, RandAugment (``rand_augment_ops`` ops, magnitude ``rand_augment_magnitude`` with noise of
    std ``rand_augment_std``), normalisation, random erasing with per-pixel noise with probability
    ``random_erasing``. ``rand_augment_ops=0`` turns RandAugment off."""
    steps: list[v2.Transform] = [
        v2.RandomResizedCrop(size, scale=scale, interpolation=v2.InterpolationMode.BICUBIC, antialias=True),
        v2.RandomHorizontalFlip(hflip),
    ]
    if rand_augment_ops > 0:
        steps.append(RandAugment(rand_augment_ops, rand_augment_magnitude, rand_augment_std))
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    if random_erasing > 0:
        steps.append(v2.RandomErasing(random_erasing, value="random"))
    return v2.Compose(steps)


def val_transforms(size: int = 224, crop_fraction: float = 0.875) -> v2.Compose:
    """Resize the short side to ``size / crop_fraction`` (bicubic, ``crop_fraction`` the share kept), centre crop
    ``size``, normalise."""
    return v2.Compose(
        [
            v2.Resize(int(size / crop_fraction), interpolation=v2.InterpolationMode.BICUBIC, antialias=True),
            v2.CenterCrop(size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def _read_image(path: str) -> tv_tensors.Image:
    return tv_tensors.Image(torch.from_numpy(read_rgb_image(path)).permute(2, 0, 1))


class ClassificationFolder(ImageFolder):
    """``ROOT/SPLIT/CLASS/*`` images (any format PIL reads) as ``(image [3,H,W] float, label)``.

    ``class_names`` fixes the classes and their order (validation must use the training split's);
    a class folder missing from the split is allowed, an unknown one is an error.
    """

    def __init__(
        self, root: str | os.PathLike, split: str, transform: Any, class_names: Sequence[str] | None = None
    ) -> None:
        self.split_dir = Path(root) / split
        if not self.split_dir.is_dir():
            raise InvalidDataError(f"{self.split_dir}: no such folder (expected ROOT/{split}/CLASS/images)")
        self._fixed_classes = None if class_names is None else list(class_names)
        super().__init__(
            str(self.split_dir), transform=transform, loader=_read_image, allow_empty=class_names is not None
        )
        if not self.samples:
            raise InvalidDataError(f"{self.split_dir}: no images ({', '.join(IMG_EXTENSIONS)}) in its class folders")

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        found, _ = super().find_classes(directory)
        if self._fixed_classes is None:
            return found, {name: i for i, name in enumerate(found)}
        unknown = sorted(set(found) - set(self._fixed_classes))
        if unknown:
            raise InvalidDataError(f"{directory}: class folders {unknown} are not among the training classes")
        return self._fixed_classes, {name: i for i, name in enumerate(self._fixed_classes)}


class ImageFolderDataModule(pl.LightningDataModule):
    """Classification data in the ImageFolder layout under ``root`` (the built-in toy set when None).

    ``batch_size`` is per process (DeiT's 1024 = 8 GPUs x 128). The training pipeline is
    :func:`train_transforms` with the arguments in ``train_transform_kwargs``; ``repeats`` is DeiT's
    repeated augmentation (each image ``repeats`` times per global batch, the epoch kept at the
    dataset's length). Mixup and CutMix act on whole batches, in the LightningModule. Under DDP each
    validation image is scored by exactly one process.
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        train_split: str = "train",
        val_split: str = "val",
        image_size: int = 224,
        crop_fraction: float = 0.875,
        train_transform_kwargs: dict[str, Any] | None = None,
        repeats: int = 3,
        batch_size: int = 128,
        val_batch_size: int = 128,
        num_workers: int = 8,
        toy_cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.root = root
        self.class_names: tuple[str, ...] | None = None

    def _data_root(self) -> str | os.PathLike:
        if self.root is not None:
            return self.root
        root = toy_classification_root(self.hparams.toy_cache_dir)
        logger.warning("no data.root given: using the built-in toy classification dataset at %s", root)
        return root

    @property
    def num_classes(self) -> int:
        if self.class_names is None:
            self.setup("validate")
        return len(self.class_names)

    def label_extent(self) -> tuple[str, int, str]:
        """The folder whose class folders are the classes, the last class's index and its name."""
        if self.class_names is None:
            self.setup("validate")
        return str(self.class_folder), len(self.class_names) - 1, self.class_names[-1]

    def prepare_data(self) -> None:
        if self.root is None:
            toy_classification_root(self.hparams.toy_cache_dir)

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        root = self._data_root()
        self.class_folder = Path(root) / hp.train_split
        if stage in (None, "fit"):
            pipeline = train_transforms(hp.image_size, **(hp.train_transform_kwargs or {}))
            self.train_set = ClassificationFolder(root, hp.train_split, pipeline)
            self.class_names = tuple(self.train_set.classes)
        elif self.class_names is None and self.class_folder.is_dir():
            # Validating a trained model: its classes are the training split's folders, also when
            # the validation split lacks some of them.
            self.class_names = tuple(find_classes(str(self.class_folder))[0])
        self.val_set = ClassificationFolder(root, hp.val_split, self.val_transform, self.class_names)
        if self.class_names is None:  # no training split: the classes are the validation folders
            self.class_names, self.class_folder = tuple(self.val_set.classes), self.val_set.split_dir

    @property
    def val_transform(self) -> v2.Compose:
        return val_transforms(self.hparams.image_size, self.hparams.crop_fraction)

    def _loader_options(self) -> dict[str, Any]:
        workers = self.hparams.num_workers
        return {"num_workers": workers, "persistent_workers": workers > 0, "pin_memory": torch.cuda.is_available()}

    def train_dataloader(self) -> DataLoader:
        return ResumableLoader(
            self.train_set, self.hparams.batch_size, repeats=self.hparams.repeats, **self._loader_options()
        )

    def val_dataloader(self) -> DataLoader:
        world_size, rank = process_share()
        sampler = UnrepeatedDistributedSampler(self.val_set, num_replicas=world_size, rank=rank, shuffle=False)
        return DataLoader(self.val_set, self.hparams.val_batch_size, sampler=sampler, **self._loader_options())
