"""The COCO detection and instance-segmentation LightningDataModules (the built-in toy dataset when no root is given);
detection also reads the YOLO and Pascal VOC layouts, converted to COCO (``vision_tx.data.layouts``)."""

from __future__ import annotations

import functools
import json
import logging
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from pycocotools.coco import COCO
from torch.utils.data import DataLoader, Dataset

from vision_tx.data.coco import CocoDetection, CocoFormatError, coco_split_paths, load_coco
from vision_tx.data.coco_instances import CocoInstances
from vision_tx.data.collate import collate_detection
from vision_tx.data.layouts import VocLayout, YoloLayout, find_layout
from vision_tx.data.mosaic import MosaicDetection
from vision_tx.data.sampling import ResumableLoader, portrait_images
from vision_tx.data.schedule import LongRun, read_schedule
from vision_tx.data.toy import toy_coco_root
from vision_tx.data.transforms import DetectionTransform, DetrTrainTransform, DetrValTransform

logger = logging.getLogger(__name__)


class CocoDetectionDataModule(LightningDataModule):
    """COCO detection from ``root`` (``root/{train_split,val_split}`` and ``root/annotations/instances_*.json``),
    or from a YOLO (``root/data.yaml``, or ``root`` that file) or Pascal VOC layout (``root/Annotations/``,
    ``root/ImageSets/Main/``), converted into COCO annotation files in a temporary folder that lives as long as
    this object (:mod:`vision_tx.data.layouts`: their rules; ``train2017``, ``val2017`` read as ``train``, ``val``
    there). One log line says which layout was found.

    ``root=None`` uses the built-in toy dataset (cached under ``toy_cache_dir``). Transforms default
    to DETR's recipe (``DetrTrainTransform()``, ``DetrValTransform()``); pass smaller ones to train
    at low resolution. ``mosaic_probability`` > 0 tiles that fraction of the training images into
    ``mosaic_size`` mosaics of four (:class:`vision_tx.data.mosaic.MosaicDetection`) before the
    training transform; ``mixup_probability`` > 0 blends that fraction with another training image, and
    ``copy_paste_probability`` > 0 pastes the objects of another training image into that fraction, cut out
    along their masks (along their boxes when an annotation has no ``segmentation``).
    ``augmentation_schedule`` (:mod:`vision_tx.data.schedule`) says from which run length each of ``mosaic``,
    ``mixup`` and ``copy_paste`` runs and whether it closes at the learning-rate drop; the datamodule's
    ``augmentation_schedule`` attribute holds these and the training transform's, which
    :class:`vision_tx.lightning.augmentation.LongRunAugmentation` applies through ``augmentation_probabilities()``
    and ``set_augmentation_probabilities()``.
    Batches come from ``collate_detection``; with ``group_by_orientation`` each training batch holds images of one
    orientation (portrait or landscape, from the annotation file's sizes: less padding; see
    :class:`~vision_tx.data.sampling.EpochSampler`). With ``reduced_decoding`` each split's JPEGs are decoded
    reduced by 2, 4 or 8 as far as their shorter side stays at least the largest its transform resizes to (and the
    mosaic size while mosaics run): photographs far larger than the training size load several times faster
    (:class:`~vision_tx.data.coco.CocoDetection`). Another annotation format reuses this class by overriding
    ``toy_root``, ``split_paths``, ``make_dataset`` and ``val_coco``.
    """

    annotation_files = "annotations/instances_*.json"  # named in the log line of the toy fallback

    def __init__(
        self,
        root: str | None = None,
        train_split: str = "train2017",
        val_split: str = "val2017",
        train_transform: DetectionTransform | None = None,
        val_transform: DetectionTransform | None = None,
        batch_size: int = 2,
        num_workers: int = 2,
        size_divisibility: int = 0,
        toy_cache_dir: str | None = None,
        skip_invalid: bool = False,
        mosaic_probability: float = 0.0,
        mosaic_size: int = 256,
        mixup_probability: float = 0.0,
        copy_paste_probability: float = 0.0,
        augmentation_schedule: Mapping[str, LongRun | Mapping[str, Any]] | None = None,
        group_by_orientation: bool = False,
        reduced_decoding: bool = True,
    ):
        super().__init__()
        self.given_root = root is not None
        if root is None:
            root = str(self.toy_root(toy_cache_dir))
            logger.info(
                "Using the built-in toy dataset (%s); pass --data.root /path/to/coco (with %s/, %s/ and %s) "
                "to train on COCO.",
                root,
                train_split,
                val_split,
                self.annotation_files,
            )
        self.root = Path(root)
        self.train_split = train_split
        self.val_split = val_split
        self.train_transform = train_transform if train_transform is not None else DetrTrainTransform()
        self.val_transform = val_transform if val_transform is not None else DetrValTransform()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.skip_invalid = skip_invalid  # invalid images skipped with a warning instead of an error
        self.mosaic_probability = mosaic_probability
        self.mosaic_size = mosaic_size
        self.mixup_probability = mixup_probability
        self.copy_paste_probability = copy_paste_probability
        self.group_by_orientation = group_by_orientation
        self.reduced_decoding = reduced_decoding
        own = read_schedule(type(self).__name__, augmentation_schedule, self._configured_probabilities())
        self.augmentation_schedule: dict[str, LongRun] = {**own, **self.train_transform.augmentation_schedule}
        self.collate_fn = functools.partial(collate_detection, size_divisibility=size_divisibility)
        self._converted: dict[str, tuple[Path, Path]] = {}  # split -> its YOLO or VOC annotations as a COCO file
        self.val_paths = self.split_paths(val_split)  # checks the layout before training starts
        self.val_image_dir, self.val_ann_file = self.val_paths[:2]
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None

    def _configured_probabilities(self) -> dict[str, float]:
        return {
            "mosaic": self.mosaic_probability,
            "mixup": self.mixup_probability,
            "copy_paste": self.copy_paste_probability,
        }

    def augmentation_probabilities(self) -> dict[str, float]:
        """The current probability of each augmentation that may change during training, by name: the mosaics,
        mixup and copy-paste (as configured until the training split is built) and the training transform's."""
        own = self._configured_probabilities()
        if isinstance(self.train_dataset, MosaicDetection):
            own = {
                "mosaic": self.train_dataset.probability,
                "mixup": self.train_dataset.mixup_probability,
                "copy_paste": self.train_dataset.copy_paste_probability,
            }
        return {**own, **self.train_transform.augmentation_probabilities()}

    def set_augmentation_probabilities(self, probabilities: Mapping[str, float]) -> None:
        """Sets the named augmentations' probabilities in the built training split and its transform (loader
        workers, persistent ones too, read them at their next sample)."""
        own = {name: p for name, p in probabilities.items() if name in self._configured_probabilities()}
        if own and not isinstance(self.train_dataset, MosaicDetection):
            raise RuntimeError(
                f"{type(self).__name__}: {sorted(own)} can be set once setup() has built a training "
                "split of mosaics, mixup or copy-paste"
            )
        for name, probability in own.items():
            setattr(self.train_dataset, "probability" if name == "mosaic" else f"{name}_probability", probability)
        self.train_transform.set_augmentation_probabilities({k: v for k, v in probabilities.items() if k not in own})

    @staticmethod
    def toy_root(cache_dir: str | None) -> Path:
        """The built-in toy dataset's root (generated on first use)."""
        return toy_coco_root(cache_dir)

    @functools.cached_property
    def layout(self) -> YoloLayout | VocLayout | None:
        """The YOLO or VOC layout at ``root``; None for COCO. Said in one log line."""
        layout = find_layout(self.root, self.train_split)
        if self.given_root:
            logger.info(
                "%s: %s", self.root, layout.description if layout else "a COCO layout (annotations/instances_*.json)"
            )
        return layout

    def split_paths(self, split: str) -> tuple[Path, ...]:
        """The files of ``split`` under ``root``, image folder and annotation file first; checks the layout.
        A YOLO or VOC split is converted once into a COCO file."""
        if self.layout is None:
            try:
                return coco_split_paths(self.root, split)
            except CocoFormatError as err:
                raise CocoFormatError(
                    f"{err}\n  or a YOLO layout: {self.root}/data.yaml\n  or a Pascal VOC layout: "
                    f"{self.root}/{{Annotations,JPEGImages,ImageSets/Main}}/"
                ) from err
        if split not in self._converted:
            image_dir, dataset = self.layout.coco_dataset(split, self.skip_invalid)
            ann_file = self._converted_dir / f"instances_{split}.json"
            ann_file.write_text(json.dumps(dataset))
            self._converted[split] = (image_dir, ann_file)
        return self._converted[split]

    @functools.cached_property
    def _converted_dir(self) -> Path:
        """Where the converted annotation files go: a temporary folder, removed with this object."""
        folder = tempfile.mkdtemp(prefix="vision_tx_layout_")
        weakref.finalize(self, shutil.rmtree, folder, True)
        return Path(folder)

    def make_dataset(
        self, paths: tuple[Path, ...], transform: DetectionTransform | None, decode_shorter_side: int | None = None
    ) -> Dataset:
        """The dataset of one split from its ``split_paths``, its JPEGs decoded reduced to ``decode_shorter_side``."""
        return CocoDetection(*paths, transform, skip_invalid=self.skip_invalid, decode_shorter_side=decode_shorter_side)

    def decode_shorter_side(self, transform: DetectionTransform, mosaics: bool = False) -> int | None:
        """The shorter side a split read through ``transform`` (after ``mosaics``, when they run) needs its images
        decoded at, at least: None (decoded whole) without ``reduced_decoding`` or where the transform does not say."""
        side = transform.largest_shorter_side() if self.reduced_decoding else None
        return None if side is None else max(side, self.mosaic_size if mosaics else 0)

    @functools.cached_property
    def val_coco(self) -> COCO:
        """The validation ground truth as a pycocotools index (for the evaluator)."""
        return load_coco(self.val_ann_file)

    @property
    def category_names(self) -> dict[int, str]:
        """COCO category id -> name."""
        return {int(c["id"]): c["name"] for c in self.val_coco.dataset["categories"]}

    @property
    def num_classes(self) -> int:
        """Largest category id + 1: the class head's real classes (DETR convention)."""
        return max(self.category_names) + 1

    def make_train_dataset(self) -> Dataset:
        """The training split, through mosaics, mixup and copy-paste when their probabilities are above 0."""
        paths = self.split_paths(self.train_split)
        side = self.decode_shorter_side(self.train_transform, mosaics=self.mosaic_probability > 0)
        if self.mosaic_probability == 0 and self.mixup_probability == 0 and self.copy_paste_probability == 0:
            return self.make_dataset(paths, self.train_transform, side)
        if self.copy_paste_probability > 0:
            dataset, masks = self.copy_paste_source(paths, side)
        else:
            dataset, masks = self.make_dataset(paths, None, side), None
        return MosaicDetection(
            dataset,
            self.train_transform,
            self.mosaic_size,
            self.mosaic_probability,
            mixup_probability=self.mixup_probability,
            copy_paste_probability=self.copy_paste_probability,
            masks=masks,
        )

    def copy_paste_source(
        self, paths: tuple[Path, ...], decode_shorter_side: int | None = None
    ) -> tuple[Dataset, Callable[[int], torch.Tensor] | None]:
        """The training split, its annotation file read once (its JPEGs decoded reduced to ``decode_shorter_side``):
        its detection items, and what gives an item's masks for copy-paste to cut the objects along; None when an
        annotation has no ``segmentation`` (copy-paste then cuts the objects along their boxes)."""
        if type(self).make_dataset is not CocoDetectionDataModule.make_dataset:
            raise ValueError(
                f"{type(self).__name__}: copy-paste yields detection targets and reads COCO instance "
                "masks; it is not supported for this data (set copy_paste_probability to 0)"
            )
        instances = CocoInstances(
            *paths, skip_invalid=self.skip_invalid, masks_in_targets=False, decode_shorter_side=decode_shorter_side
        )
        missing = instances.objects_without_masks
        if missing:
            logger.info(
                "%s: %d of %d objects have no 'segmentation': copy-paste cuts the objects along their boxes",
                instances.ann_file,
                missing,
                len(instances.segmentations),
            )
            return instances, None
        return instances, instances.instance_masks

    def label_extent(self) -> tuple[str, int, str]:
        """The annotation file with the largest category id (of the validation file and, once built,
        the training one), that id and its name: a model must predict ids up to it."""
        files = [(self.val_ann_file, self.category_names)]
        train_names = getattr(self.train_dataset, "category_names", None)
        if train_names:
            files.append((self.train_dataset.ann_file, train_names))
        source, names = max(files, key=lambda file: max(file[1]))
        largest = max(names)
        if self._converted:  # converted from a YOLO or VOC layout: its names' file
            source = self.layout.names_source
        return str(source), largest, names[largest]

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit") and self.train_dataset is None:
            self.train_dataset = self.make_train_dataset()
        if self.val_dataset is None:
            self.val_dataset = self.make_dataset(
                self.val_paths, self.val_transform, self.decode_shorter_side(self.val_transform)
            )

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() before asking for a dataloader")
        options = dict(
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            collate_fn=self.collate_fn,
        )
        if not train:
            return DataLoader(dataset, **options)
        portrait = portrait_images(dataset) if self.group_by_orientation else None
        return ResumableLoader(dataset, portrait=portrait, **options)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, train=False)


class CocoInstanceDataModule(CocoDetectionDataModule):
    """COCO instance segmentation from ``root`` (the layout of :class:`CocoDetectionDataModule`); ``root=None``
    uses the built-in toy detection set, whose annotations carry RLE masks. Batches are detection batches
    whose targets also hold ``masks``."""

    def make_dataset(
        self, paths: tuple[Path, ...], transform: DetectionTransform | None, decode_shorter_side: int | None = None
    ) -> Dataset:
        return CocoInstances(*paths, transform, skip_invalid=self.skip_invalid, decode_shorter_side=decode_shorter_side)
