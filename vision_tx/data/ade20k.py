"""ADE20K (SceneParsing, 150 classes) in its release layout, as ``(image, label map)`` pairs.

    ROOT/ADEChallengeData2016/images/{training,validation}/*.jpg
    ROOT/ADEChallengeData2016/annotations/{training,validation}/*.png

Annotation PNGs hold 0 for "unlabelled" and 1..150 for the classes; with ``reduce_zero_label``
(the benchmark's convention) 0 becomes the ignore value 255 and class ``k`` becomes ``k - 1``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision import tv_tensors

from vision_tx.data.image_io import ImageReadError, orientation_note, read_rgb_image
from vision_tx.data.invalid import InvalidDataError, SkippingDataset, warn_skipped

IGNORE_INDEX = 255

# The first name of each class in objectInfo150 (the release's class list), in label order 1..150, ten a row.
ADE20K_CLASSES = (
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass",
    "cabinet", "sidewalk", "person", "earth", "door", "table", "mountain", "plant", "curtain", "chair",
    "car", "water", "painting", "sofa", "shelf", "house", "sea", "mirror", "rug", "field",
    "armchair", "seat", "fence", "desk", "rock", "wardrobe", "lamp", "bathtub", "railing", "cushion",
    "base", "box", "column", "signboard", "chest of drawers", "counter", "sand", "sink", "skyscraper", "fireplace",
    "refrigerator", "grandstand", "path", "stairs", "runway", "case", "pool table", "pillow", "screen door", "stairway",
    "river", "bridge", "bookcase", "blind", "coffee table", "toilet", "flower", "book", "hill", "bench",
    "countertop", "stove", "palm", "kitchen island", "computer", "swivel chair", "boat", "bar", "arcade machine", "hovel",  # noqa: E501
    "bus", "towel", "light", "truck", "tower", "chandelier", "awning", "streetlight", "booth", "television",
    "airplane", "dirt track", "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle", "buffet",
    "poster", "stage", "van", "ship", "fountain", "conveyer belt", "canopy", "washer", "plaything", "swimming pool",
    "stool", "barrel", "basket", "waterfall", "tent", "bag", "minibike", "cradle", "oven", "ball",
    "food", "step", "tank", "trade name", "microwave", "pot", "animal", "bicycle", "lake", "dishwasher",
    "screen", "blanket", "sculpture", "hood", "sconce", "vase", "traffic light", "tray", "ashcan", "fan",
    "pier", "crt screen", "plate", "monitor", "bulletin board", "shower", "radiator", "glass", "clock", "flag",
)  # fmt: skip

Transforms = Callable[[tv_tensors.Image, tv_tensors.Mask], tuple[Any, Any]]


class ADE20KFormatError(InvalidDataError):
    """An ADE20K-layout dataset that cannot be used as it is: the message names the file and the problem."""


class ADE20KDataset(SkippingDataset[tuple[Any, Any]]):
    """One split of an ADE20K-layout dataset.

    Item ``i`` is ``transforms(image, label)`` where ``image`` is a ``tv_tensors.Image`` ``[3, H, W]``
    uint8 RGB (see ``vision_tx.data.image_io``) and ``label`` a ``tv_tensors.Mask`` ``[H, W]`` int64
    with values in ``0..len(class_names)-1`` or ``IGNORE_INDEX``. The layout and the
    image/annotation pairing are checked at construction; each annotation's values and size are
    checked when it is read. Invalid records are errors; with ``skip_invalid=True`` an image
    without annotation is left out, and an item that fails to read is replaced by the next
    (``vision_tx.data.invalid``).
    """

    format_error = ADE20KFormatError

    def __init__(
        self,
        root: str | os.PathLike,
        split: str = "training",
        transforms: Transforms | None = None,
        class_names: Sequence[str] = ADE20K_CLASSES,
        reduce_zero_label: bool = True,
        skip_invalid: bool = False,
    ) -> None:
        self.root = Path(root)
        self.split = split
        self.transforms = transforms
        self.class_names = tuple(class_names)
        self.reduce_zero_label = reduce_zero_label
        super().__init__(skip_invalid)
        base = self.root / "ADEChallengeData2016"
        image_dir, ann_dir = base / "images" / split, base / "annotations" / split
        missing = [str(d) for d in (image_dir, ann_dir) if not d.is_dir()]
        if missing:
            raise ADE20KFormatError(
                f"{self.root}: not an ADE20K root, missing {', '.join(missing)}. Expected the layout\n"
                f"  {base}/images/{split}/*.jpg\n  {base}/annotations/{split}/*.png"
            )
        images = sorted(image_dir.glob("*.jpg"))
        if not images:
            raise ADE20KFormatError(f"{image_dir}: no .jpg images")
        paired = [(ann_dir / f"{p.stem}.png").is_file() for p in images]
        unpaired = [f"{ann_dir / p.stem}.png is missing (image {p.name})" for p, ok in zip(images, paired) if not ok]
        if unpaired and not skip_invalid:
            raise ADE20KFormatError(
                f"{ann_dir}: {len(unpaired)} image(s) of {image_dir} have no annotation, e.g. {unpaired[0]}"
            )
        if unpaired:
            warn_skipped(ann_dir, unpaired, len(images), "images")
        self.images = [p for p, ok in zip(images, paired) if ok]
        self.annotations = [ann_dir / f"{p.stem}.png" for p in self.images]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return len(self.images)

    def read_label(self, index: int) -> np.ndarray:
        """The annotation of item ``index`` as ``[H, W]`` uint8, checked, with ``reduce_zero_label`` applied."""
        path = self.annotations[index]
        try:
            with Image.open(path) as png:
                if png.mode not in ("L", "P"):
                    raise ADE20KFormatError(
                        f"{path}: annotation must be an 8-bit single-channel PNG, got mode {png.mode}"
                    )
                label = np.asarray(png, dtype=np.uint8)
        except (OSError, SyntaxError) as err:
            raise ADE20KFormatError(f"{path}: unreadable annotation PNG, corrupt or truncated ({err})") from err
        # Raw values are 0 (unlabelled) and 1..num_classes with reduce_zero_label, else 0..num_classes-1.
        largest = self.num_classes if self.reduce_zero_label else self.num_classes - 1
        if label.max() > largest:
            raise ADE20KFormatError(
                f"{path}: label {int(label.max())} above {largest}, "
                f"the largest of this dataset's {self.num_classes} classes"
            )
        if self.reduce_zero_label:
            label = np.where(label == 0, IGNORE_INDEX, label - 1).astype(np.uint8)
        return label

    def _load(self, index: int) -> tuple[Any, Any]:
        try:
            image = read_rgb_image(self.images[index])
        except ImageReadError as err:
            raise ADE20KFormatError(str(err)) from err
        label = self.read_label(index)
        if label.shape != image.shape[:2]:
            raise ADE20KFormatError(
                f"{self.annotations[index]}: annotation size {label.shape[1]}x{label.shape[0]} differs from its image "
                f"{self.images[index].name} ({image.shape[1]}x{image.shape[0]}){orientation_note(self.images[index])}"
            )
        image_t = tv_tensors.Image(torch.from_numpy(image).permute(2, 0, 1))
        label_t = tv_tensors.Mask(torch.from_numpy(label.astype(np.int64)))
        if self.transforms is not None:
            return self.transforms(image_t, label_t)
        return image_t, label_t
