"""DETR's detection augmentation on ``(image, target)`` pairs, with ``torchvision.transforms.v2``.

Boxes (``tv_tensors.BoundingBoxes``) and instance masks (``tv_tensors.Mask`` ``[K, H, W]``) in the
target follow every geometric step together with the image; ``target["size"]`` is set to the
transformed image's ``(h, w)`` at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from vision_tx.data.mosaic import FILL
from vision_tx.data.sampling import batch_draw
from vision_tx.data.schedule import LongRun, read_schedule
from vision_tx.data.shared_probability import SharedProbability

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _image_size(flat_inputs: list[Any]) -> tuple[int, int]:
    images = [x for x in flat_inputs if isinstance(x, tv_tensors.Image)]
    if not images:
        raise TypeError("detection transforms need a tv_tensors.Image among their inputs")
    height, width = F.get_size(images[0])
    return height, width


class RandomShortestSide(v2.Transform):
    """Resizes so that the shorter side is a size drawn from ``sizes``, keeping the aspect ratio;
    when that makes the longer side exceed ``max_size``, the longer side becomes (at most) ``max_size``.
    With ``per_batch`` the size is drawn once per training batch (:func:`~vision_tx.data.sampling.batch_draw`, as
    RT-DETR's and YOLO's multi-scale training do: a batch pads less), per image where no batch draw is given.

    Unlike ``v2.RandomShortestSize`` the shorter side is exactly the size drawn (no truncation).
    """

    def __init__(self, sizes: Sequence[int], max_size: int | None = None, per_batch: bool = False):
        super().__init__()
        self.sizes = list(sizes)
        self.max_size = max_size
        self.per_batch = per_batch

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = _image_size(flat_inputs)
        short, long = min(height, width), max(height, width)
        shared = batch_draw() if self.per_batch else None
        size = self.sizes[_randint(0, len(self.sizes) - 1) if shared is None else shared % len(self.sizes)]
        if self.max_size is not None and size * long / short > self.max_size:
            size = self.max_size * short // long
        new_long = int(size * long / short)
        return {"size": [size, new_long] if height <= width else [new_long, size]}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.resize, inpt, size=params["size"])


class RandomSizeCrop(v2.Transform):
    """Crops a random ``h x w`` window, ``h`` and ``w`` drawn uniformly from ``[min_size, max_size]``
    (bounded by the image), at a random position. Boxes are clipped to the window."""

    def __init__(self, min_size: int, max_size: int):
        super().__init__()
        if not 0 < min_size <= max_size:
            raise ValueError(f"RandomSizeCrop needs 0 < min_size <= max_size, got {min_size}, {max_size}")
        self.min_size = min_size
        self.max_size = max_size

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = _image_size(flat_inputs)
        crop_h = _randint(min(self.min_size, height), min(self.max_size, height))
        crop_w = _randint(min(self.min_size, width), min(self.max_size, width))
        top = _randint(0, height - crop_h)
        left = _randint(0, width - crop_w)
        return {"top": top, "left": left, "height": crop_h, "width": crop_w}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.crop, inpt, **params)


def _randint(low: int, high: int) -> int:
    """A uniform integer in ``[low, high]`` from torch's generator (seeded per DataLoader worker)."""
    return int(torch.randint(low, high + 1, ()))


class DetectionTransform:
    """Runs a v2 pipeline on ``(image, target)`` and records the new image size in ``target["size"]``."""

    def __init__(self, pipeline: v2.Transform):
        self.pipeline = pipeline

    def __call__(self, image: tv_tensors.Image, target: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        image, target = self.pipeline(image, target)
        target["size"] = torch.tensor(tuple(image.shape[-2:]))
        return image, target

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.pipeline})"

    augmentation_schedule: dict[str, LongRun] = {}  # none: what the pipeline draws, it draws throughout

    def largest_shorter_side(self) -> int | None:
        """The largest shorter side (pixels) the pipeline resizes any image to, from which it never reads finer detail:
        the datasets decode JPEGs reduced to it. None (here): not known, the images are decoded whole."""
        return None

    def switches(self) -> dict[str, SwitchableRandomApply]:
        """The augmentations whose probability may change during training, by name (none here)."""
        return {}

    def augmentation_probabilities(self) -> dict[str, float]:
        """The current probability of each switchable augmentation, by name."""
        return {name: switch.p for name, switch in self.switches().items()}

    def set_augmentation_probabilities(self, probabilities: Mapping[str, float]) -> None:
        """Sets the named augmentations' probabilities (loader workers read them at their next sample)."""
        switches = self.switches()
        for name, probability in probabilities.items():
            if name not in switches:
                raise KeyError(f"{type(self).__name__}: no switchable augmentation {name!r}; it has {sorted(switches)}")
            switches[name].p = probability


class SwitchableRandomApply(v2.RandomApply):
    """``v2.RandomApply`` whose probability ``p`` may be changed during training (loader workers read it
    from shared memory) and which draws no random number at ``p = 0``, so that switching it off leaves
    the rest of the pipeline's draws as they would be without it."""

    p = SharedProbability()

    def forward(self, *inputs: Any) -> Any:
        if self.p == 0:
            return inputs if len(inputs) > 1 else inputs[0]
        return super().forward(*inputs)


def _to_normalized_float() -> list[v2.Transform]:
    return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]


class DetrTrainTransform(DetectionTransform):
    """Horizontal flip, then a vertical flip on a ``vertical_flip_probability`` share of the images and a
    quarter turn (90 degrees, the canvas turned with it) on a ``quarter_turn_probability`` share (0: none,
    the defaults; for images without an up, such as smears, top views or shapes), then either a
    multi-scale resize (shorter side from ``scales``, longer side at most ``max_size``) or, for a
    ``crop_probability`` share of the images (DETR's 0.5), [shorter
    side from ``crop_scales``, random crop of ``crop_size`` = (min, max) side, multi-scale resize] (with
    ``scale_per_batch`` the multi-scale size is drawn once per training batch: less padding);
    then, for an ``affine_probability`` share of the images (0: none, the default), YOLO's random
    affine at the same canvas size: zoomed by a factor drawn from ``affine_scale`` and shifted by up
    to ``translate`` of each side, the uncovered area grey (YOLO's letterbox colour; ``self.affine.p``
    may be changed during training, as :class:`SwitchableRandomApply`'s); then, for a
    ``channel_permutation_probability`` share of the images (0: none, the default), the colour channels
    in a random order (each object's colour changes, its shape and box do not: a colour the model
    has learnt an object by no longer gives it away); then float, ImageNet normalisation, and removal
    of the boxes (with their labels and masks) that the crop or the shift left smaller than a pixel.
    ``augmentation_schedule`` (:mod:`vision_tx.data.schedule`) says from which run length each of ``affine``,
    ``channel_permutation``, ``vertical_flip`` and ``quarter_turn`` runs, and whether it closes at the
    learning-rate drop; those it leaves out run at their probability throughout."""

    def __init__(
        self,
        scales: Sequence[int] = tuple(range(480, 801, 32)),
        max_size: int = 1333,
        crop_scales: Sequence[int] = (400, 500, 600),
        crop_size: tuple[int, int] = (384, 600),
        crop_probability: float = 0.5,
        affine_probability: float = 0.0,
        translate: float = 0.1,
        affine_scale: tuple[float, float] = (0.75, 1.25),
        channel_permutation_probability: float = 0.0,
        vertical_flip_probability: float = 0.0,
        quarter_turn_probability: float = 0.0,
        augmentation_schedule: Mapping[str, LongRun | Mapping[str, Any]] | None = None,
        scale_per_batch: bool = False,
    ):
        for name, probability in (
            ("crop_probability", crop_probability),
            ("affine_probability", affine_probability),
            ("channel_permutation_probability", channel_permutation_probability),
            ("vertical_flip_probability", vertical_flip_probability),
            ("quarter_turn_probability", quarter_turn_probability),
        ):
            if not 0.0 <= probability <= 1.0:
                raise ValueError(f"{__name__}: {name} must be in [0, 1], got {probability}")
        multi_scale = RandomShortestSide(scales, max_size=max_size, per_batch=scale_per_batch)
        # The crop branch resizes to a crop scale first: the finest it reads.
        self._largest_shorter_side = max(max(scales), max(crop_scales) if crop_probability > 0 else 0)
        zoom_and_shift = v2.RandomAffine(
            0, (translate, translate), tuple(affine_scale), fill={tv_tensors.Image: FILL, "others": 0}
        )
        self.affine = SwitchableRandomApply([zoom_and_shift], p=affine_probability)
        self.channel_permutation = SwitchableRandomApply(
            [v2.RandomChannelPermutation()], p=channel_permutation_probability
        )
        self.vertical_flip = SwitchableRandomApply([v2.RandomVerticalFlip(p=1.0)], p=vertical_flip_probability)
        quarter_turn = v2.RandomRotation(degrees=(90, 90), expand=True)
        self.quarter_turn = SwitchableRandomApply([quarter_turn], p=quarter_turn_probability)
        self.augmentation_schedule = read_schedule(
            type(self).__name__, augmentation_schedule, self.augmentation_probabilities()
        )
        super().__init__(
            v2.Compose(
                [
                    v2.RandomHorizontalFlip(),
                    self.vertical_flip,
                    self.quarter_turn,
                    v2.RandomChoice(
                        [
                            multi_scale,
                            v2.Compose(
                                [
                                    RandomShortestSide(crop_scales),
                                    RandomSizeCrop(*crop_size),
                                    multi_scale,
                                ]
                            ),
                        ],
                        p=[1.0 - crop_probability, crop_probability],
                    ),
                    self.affine,
                    self.channel_permutation,
                    *_to_normalized_float(),
                    v2.SanitizeBoundingBoxes(),
                ]
            )
        )

    def largest_shorter_side(self) -> int | None:
        """The largest multi-scale size, or crop scale where the crop branch runs."""
        return self._largest_shorter_side

    def switches(self) -> dict[str, SwitchableRandomApply]:
        """The affine, the channel permutation, the vertical flip and the quarter turn, by name."""
        return {
            "affine": self.affine,
            "channel_permutation": self.channel_permutation,
            "vertical_flip": self.vertical_flip,
            "quarter_turn": self.quarter_turn,
        }


class DetrValTransform(DetectionTransform):
    """Resize to shorter side ``size`` (longer side at most ``max_size``), float, ImageNet normalisation."""

    def __init__(self, size: int = 800, max_size: int = 1333):
        super().__init__(v2.Compose([RandomShortestSide([size], max_size=max_size), *_to_normalized_float()]))
        self.size = size

    def largest_shorter_side(self) -> int | None:
        """``size``."""
        return self.size
