"""The augmentations that need several training images at once: mosaics (YOLOv4's), mixup (YOLO's) and
copy-paste (Ghiasi et al.'s Simple Copy-Paste).

A mosaic shows four times the objects of one image at about half their size, each image cut at a
random place and seen beside unrelated context, which gives a detector trained for a few hundred
steps more, and more varied, supervision per step. Mixup blends a second image, whole, into the
first at about half strength and keeps the objects of both: every object is seen over another
picture, never cut. Copy-paste puts the objects of another image, cut out along their masks (or their
boxes, where the annotations have no masks), onto free places of the first: more objects an image, each
on a background it never had. torchvision's ``transforms.v2`` has none of them (each needs several
dataset items at once), so they wrap the dataset rather than being transforms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from vision_tx.data.coco_instances import masks_at_size
from vision_tx.data.shared_probability import SharedProbability

Target = dict[str, Any]
Transform = Callable[[tv_tensors.Image, Target], tuple[torch.Tensor, Target]]
FILL = 114  # the grey of the canvas where no image falls (YOLO's letterbox colour)
MIXUP_BETA = 32.0  # the blend's weight is drawn from Beta(32, 32): 0.5 +- 0.06 (YOLO's)
PASTE_ATTEMPTS = 20  # random places tried for each pasted object before it is left out


class MosaicDetection(Dataset):
    """Yields ``transform(mosaic, target)`` with probability ``probability``, else ``transform(image, target)``;
    with probability ``copy_paste_probability`` the objects of another image are first pasted into the image,
    and with probability ``mixup_probability`` that image (or mosaic) is then mixed with another.

    ``dataset`` yields untransformed ``(tv_tensors.Image [3,H,W] uint8, target)`` pairs with
    ``target["boxes"]`` (``tv_tensors.BoundingBoxes`` xyxy pixels) and ``target["labels"]`` [K], as
    :class:`vision_tx.data.coco.CocoDetection` does with ``transforms=None``. A mosaic is ``size x size``:
    item ``index`` and three others drawn at random are each scaled so that their longer side is ``size``
    and placed in the four quadrants around a point drawn uniformly in the canvas's middle half, on a
    ``2 size x 2 size`` canvas whose central ``size x size`` window is kept. Boxes are clipped to the
    window; a box left with less than ``min_visible`` of its area, or under 2 pixels a side, is dropped.
    Mixup (:meth:`mixup`) scales another item drawn at random to fit inside the image, keeping its shape,
    places it at a random position on grey, blends the two with a weight ``w ~ Beta(32, 32)`` (the
    image's share) and keeps the boxes and labels of both. Copy-paste (:meth:`copy_paste`) cuts each object of the
    image it pastes from along its mask where ``masks(index)`` gives that item's masks (``[K, H, W]`` bool in the
    item's pixels, one per box, as :meth:`vision_tx.data.coco_instances.CocoInstances.instance_masks` decodes them:
    only for the images pasted from; resized to an item decoded reduced), and along its box where ``masks`` is None.
    The probabilities may be changed during training (loader workers read them from shared memory); at 0 no random
    number is drawn, so the images are those of the wrapped dataset and transform alone.
    """

    probability = SharedProbability()
    mixup_probability = SharedProbability()
    copy_paste_probability = SharedProbability()

    def __init__(
        self,
        dataset: Dataset,
        transform: Transform,
        size: int = 256,
        probability: float = 1.0,
        min_visible: float = 0.25,
        mixup_probability: float = 0.0,
        copy_paste_probability: float = 0.0,
        masks: Callable[[int], torch.Tensor] | None = None,
    ) -> None:
        if size < 2:
            raise ValueError(f"MosaicDetection: size must be at least 2 pixels, got {size}")
        self.dataset = dataset
        self.transform = transform
        self.size = size
        self.probability = probability
        self.min_visible = min_visible
        self.mixup_probability = mixup_probability
        self.copy_paste_probability = copy_paste_probability
        self.masks = masks

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Target]:
        image, target = self.dataset[index]
        copy_paste_probability = self.copy_paste_probability
        if copy_paste_probability > 0 and float(torch.rand(())) < copy_paste_probability:
            image, target = self.copy_paste(image, target, *self.paste_source(int(torch.randint(len(self), ()))))
        probability = self.probability
        if probability > 0 and float(torch.rand(())) < probability:
            others = torch.randint(len(self), (3,)).tolist()
            image, target = self.mosaic([(image, target)] + [self.dataset[i] for i in others])
        mixup_probability = self.mixup_probability
        if mixup_probability > 0 and float(torch.rand(())) < mixup_probability:
            image, target = self.mixup(image, target, *self.dataset[int(torch.randint(len(self), ()))])
        return self.transform(image, target)

    def paste_source(self, index: int) -> tuple[tv_tensors.Image, Target]:
        """The wrapped dataset's item ``index`` with its ``masks``, where ``masks`` gives them: what copy-paste cuts
        from."""
        image, target = self.dataset[index]
        if self.masks is None:
            return image, target
        return image, {**target, "masks": masks_at_size(self.masks(index), list(image.shape[-2:]))}

    @staticmethod
    def copy_paste(
        image: tv_tensors.Image, target: Target, other: tv_tensors.Image, other_target: Target
    ) -> tuple[tv_tensors.Image, Target]:
        """``image`` [3,H,W] with each object of ``other`` pasted in, flipped left to right half the time, at a
        random place where its box overlaps no box of ``target`` nor of an object pasted before (the boxes
        already there stay the tight boxes of their objects). An object is its pixels under
        ``other_target["masks"]`` ``[K, h, w]`` where the target holds masks (its new box: the tight box of
        those pixels), else the pixels of its box, whole pixels from the floor to the ceiling of each side (its
        new box: its box, moved with them). An object larger than the image, or without a free place in
        ``PASTE_ATTEMPTS`` draws, is left out. The target gains the pasted objects' boxes and labels, and has
        no ``masks``."""
        height, width = image.shape[-2:]
        taken = target["boxes"].as_subclass(torch.Tensor).float()
        image = image.clone()
        pasted_boxes, pasted_labels = [], []
        for patch, shape, local_box, label in MosaicDetection.objects(other, other_target):
            if float(torch.rand(())) < 0.5:
                patch, shape = patch.flip(-1), shape.flip(-1)
                local_box = torch.stack(
                    [shape.shape[1] - local_box[2], local_box[1], shape.shape[1] - local_box[0], local_box[3]]
                )
            patch_h, patch_w = shape.shape
            if patch_h > height or patch_w > width:
                continue
            # All the attempts' places drawn at once, the first free one taken: on a crowded image most are not
            corners = torch.stack(
                [
                    torch.randint(width - patch_w + 1, (PASTE_ATTEMPTS,)),
                    torch.randint(height - patch_h + 1, (PASTE_ATTEMPTS,)),
                ],
                1,
            )  # [A, 2] left, top
            boxes = local_box + corners.repeat(1, 2)  # [A, 4]
            overlaps = (
                (boxes[:, None, 0] < taken[:, 2])
                & (boxes[:, None, 2] > taken[:, 0])
                & (boxes[:, None, 1] < taken[:, 3])
                & (boxes[:, None, 3] > taken[:, 1])
            ).any(1)  # [A]
            free = torch.nonzero(~overlaps).flatten()
            if len(free) == 0:
                continue
            left, top = corners[free[0]].tolist()
            region = image[:, top : top + patch_h, left : left + patch_w]
            region.copy_(torch.where(shape, patch, region))
            taken = torch.cat([taken, boxes[free[0], None]])
            pasted_boxes.append(boxes[free[0]])
            pasted_labels.append(label)
        target = {k: v for k, v in target.items() if k != "masks"}
        if not pasted_boxes:
            return image, target
        return image, {
            **target,
            "boxes": tv_tensors.BoundingBoxes(taken, format="XYXY", canvas_size=(height, width)),
            "labels": torch.cat([target["labels"], torch.tensor(pasted_labels, dtype=target["labels"].dtype)]),
        }

    @staticmethod
    def objects(
        image: tv_tensors.Image, target: Target
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]:
        """Each object of ``image`` as copy-paste cuts it out: its pixels ``patch [3,h,w]``, which of them are the
        object (``shape [h,w]`` bool), its box within the patch (xyxy float) and its label. With ``masks`` in
        ``target`` the patch is the mask's tight box; without, the box's whole pixels (empty or outside: left out)."""
        labels = target["labels"].tolist()
        if "masks" in target:
            for mask, label in zip(target["masks"].as_subclass(torch.Tensor).bool(), labels):
                ys, xs = torch.nonzero(mask, as_tuple=True)
                if len(ys):
                    y0, y1, x0, x1 = int(ys.min()), int(ys.max()) + 1, int(xs.min()), int(xs.max()) + 1
                    shape = mask[y0:y1, x0:x1]
                    yield image[:, y0:y1, x0:x1], shape, torch.tensor([0.0, 0.0, x1 - x0, y1 - y0]), label
            return
        height, width = image.shape[-2:]
        for box, label in zip(target["boxes"].as_subclass(torch.Tensor).float(), labels):
            x0, y0 = max(math.floor(box[0]), 0), max(math.floor(box[1]), 0)
            x1, y1 = min(math.ceil(box[2]), width), min(math.ceil(box[3]), height)
            if x1 > x0 and y1 > y0:
                shape = torch.ones(y1 - y0, x1 - x0, dtype=torch.bool)
                yield image[:, y0:y1, x0:x1], shape, box - torch.tensor([x0, y0, x0, y0], dtype=torch.float32), label

    @staticmethod
    def mixup(
        image: tv_tensors.Image, target: Target, other: tv_tensors.Image, other_target: Target
    ) -> tuple[tv_tensors.Image, Target]:
        """``image`` [3,H,W] blended with ``other`` (scaled to fit inside it, at a random place on grey); the
        target is ``target`` with ``other_target``'s boxes (moved with their pixels) and labels added."""
        if "masks" in target or "masks" in other_target:
            raise ValueError("MosaicDetection: mixup of instance masks is not supported; set mixup_probability to 0")
        height, width = image.shape[-2:]
        other_h, other_w = other.shape[-2:]
        scale = min(height / other_h, width / other_w)
        new_h, new_w = max(1, round(other_h * scale)), max(1, round(other_w * scale))
        canvas = torch.full((3, height, width), FILL, dtype=torch.uint8)
        top, left = int(torch.randint(height - new_h + 1, ())), int(torch.randint(width - new_w + 1, ()))
        canvas[:, top : top + new_h, left : left + new_w] = F.resize(other, [new_h, new_w], antialias=True)
        weight = float(torch.distributions.Beta(MIXUP_BETA, MIXUP_BETA).sample())
        mixed = image.float().mul_(weight).add_(canvas.float().mul_(1 - weight)).round_().to(torch.uint8)
        moved = other_target["boxes"].as_subclass(torch.Tensor).float() * torch.tensor(
            [new_w / other_w, new_h / other_h] * 2
        )
        moved = moved + torch.tensor([left, top, left, top], dtype=torch.float32)
        boxes = torch.cat([target["boxes"].as_subclass(torch.Tensor).float(), moved])
        return tv_tensors.Image(mixed), {
            **{k: v for k, v in target.items() if k not in ("boxes", "labels")},
            "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(height, width)),
            "labels": torch.cat([target["labels"], other_target["labels"]]),
        }

    def mosaic(self, items: list[tuple[tv_tensors.Image, Target]]) -> tuple[tv_tensors.Image, Target]:
        """Four ``(image, target)`` pairs -> one ``size x size`` mosaic and its target (``image_id`` of the first)."""
        if any("masks" in target for _, target in items):
            raise ValueError(
                "MosaicDetection: mosaics of instance masks are not supported; set mosaic_probability to 0"
            )
        size = self.size
        canvas = torch.full((3, 2 * size, 2 * size), FILL, dtype=torch.uint8)
        centre_x, centre_y = (int(v) for v in torch.randint(size // 2, 3 * size // 2 + 1, (2,)))
        boxes, labels = [], []
        for quadrant, (image, target) in enumerate(items):
            height, width = image.shape[-2:]
            scale = size / max(height, width)
            new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
            image = F.resize(image, [new_h, new_w], antialias=True)
            # Quadrants 0-3: top-left, top-right, bottom-left, bottom-right of the centre.
            left = centre_x - new_w if quadrant in (0, 2) else centre_x
            top = centre_y - new_h if quadrant in (0, 1) else centre_y
            x0, y0 = max(left, 0), max(top, 0)
            x1, y1 = min(left + new_w, 2 * size), min(top + new_h, 2 * size)
            canvas[:, y0:y1, x0:x1] = image[:, y0 - top : y1 - top, x0 - left : x1 - left]
            scaled = target["boxes"].as_subclass(torch.Tensor).float() * torch.tensor(
                [new_w / width, new_h / height] * 2
            )
            boxes.append(scaled + torch.tensor([left, top, left, top], dtype=torch.float32))
            labels.append(target["labels"])
        offset = size // 2  # the kept window's top-left corner in the canvas
        boxes_in_canvas = torch.cat(boxes)
        full_area = (boxes_in_canvas[:, 2:] - boxes_in_canvas[:, :2]).prod(1)
        clipped = (boxes_in_canvas - offset).clamp(0, size)
        sides = clipped[:, 2:] - clipped[:, :2]
        keep = (sides >= 2).all(1) & (sides.prod(1) >= self.min_visible * full_area)
        mosaic = tv_tensors.Image(canvas[:, offset : offset + size, offset : offset + size])
        canvas_size = (size, size)
        first = items[0][1]
        return mosaic, {
            **{k: v for k, v in first.items() if k not in ("boxes", "labels", "masks")},
            "boxes": tv_tensors.BoundingBoxes(clipped[keep], format="XYXY", canvas_size=canvas_size),
            "labels": torch.cat(labels)[keep],
            "orig_size": torch.tensor(canvas_size),
            "size": torch.tensor(canvas_size),
        }
