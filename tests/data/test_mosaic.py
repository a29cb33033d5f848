"""Mosaics and mixup: every kept box is where its object's pixels are; cut objects are dropped or clipped; mixup keeps
both images' objects."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision import tv_tensors

from vision_tx.data.mosaic import FILL, MosaicDetection


class RectangleImages(torch.utils.data.Dataset):
    """Images of odd sizes on a black background, each with two solid rectangles of colours no other uses."""

    sizes = [(90, 150), (160, 70), (120, 120), (50, 200), (140, 100)]

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, dict]:
        height, width = self.sizes[index]
        image = torch.zeros(3, height, width, dtype=torch.uint8)
        boxes = torch.tensor([[0.1, 0.1, 0.45, 0.5], [0.5, 0.55, 0.95, 0.9]]) * torch.tensor([width, height] * 2)
        boxes = boxes.round()
        labels = torch.tensor([2 * index + 1, 2 * index + 2])
        for (x1, y1, x2, y2), label in zip(boxes.int().tolist(), labels.tolist()):
            image[:, y1:y2, x1:x2] = torch.tensor([20 * label, 250 - 20 * label, 200]).view(3, 1, 1)
        size = torch.tensor([height, width])
        target = {
            "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(height, width)),
            "labels": labels,
            "image_id": 100 + index,
            "orig_size": size,
            "size": size.clone(),
        }
        return tv_tensors.Image(image), target


def _colour_extent(image: torch.Tensor, label: int, around: list[float] | None = None) -> list[float] | None:
    """The xyxy extent of the pixels within 8 of ``label``'s colour (None when too few), within 3
    pixels of the box ``around`` when given (the same image can appear twice in a mosaic)."""
    colour = torch.tensor([20 * label, 250 - 20 * label, 200]).view(3, 1, 1)
    near = (image.int() - colour).abs().amax(0) < 8
    if around is not None:
        window = torch.zeros_like(near)
        x1, y1, x2, y2 = (int(v) for v in around)
        window[max(y1 - 3, 0) : y2 + 3, max(x1 - 3, 0) : x2 + 3] = True
        near &= window
    if near.sum() < 9:
        return None
    ys, xs = torch.nonzero(near, as_tuple=True)
    return [xs.min().item(), ys.min().item(), xs.max().item() + 1.0, ys.max().item() + 1.0]


@pytest.mark.parametrize("seed", range(6))
def test_boxes_follow_the_pixels_of_their_objects(seed: int) -> None:
    torch.manual_seed(seed)
    dataset = MosaicDetection(RectangleImages(), lambda image, target: (image, target), size=128)
    image, target = dataset[seed % len(dataset)]
    assert image.shape == (3, 128, 128) and target["size"].tolist() == [128, 128]
    assert target["image_id"] == 100 + seed % len(dataset)
    assert target["boxes"].canvas_size == (128, 128)
    for box, label in zip(target["boxes"].tolist(), target["labels"].tolist()):
        extent = _colour_extent(image, label, around=box)
        assert extent is not None, f"label {label} kept but not visible"
        assert box == pytest.approx(extent, abs=2.0), f"label {label}"
    # An object that is visible over most of its pixels keeps its box; the canvas is grey elsewhere.
    kept = set(target["labels"].tolist())
    for label in range(1, 2 * len(RectangleImages.sizes) + 1):
        extent = _colour_extent(image, label)
        if extent is not None and (extent[2] - extent[0]) * (extent[3] - extent[1]) > 0.5 * 128 * 128 / 10:
            assert label in kept or _touches_border(extent, 128)
    assert (image == FILL).all(0).any() or len(kept) > 0


def _touches_border(extent: list[float], size: int) -> bool:
    return extent[0] <= 0 or extent[1] <= 0 or extent[2] >= size or extent[3] >= size


def test_boxes_cut_below_the_visible_fraction_are_dropped() -> None:
    dataset = MosaicDetection(RectangleImages(), lambda image, target: (image, target), size=128, min_visible=0.25)
    for seed in range(20):
        torch.manual_seed(seed)
        _, target = dataset[0]
        boxes = target["boxes"].as_subclass(torch.Tensor)
        assert ((boxes >= 0) & (boxes <= 128)).all()
        assert ((boxes[:, 2:] - boxes[:, :2]) >= 2).all()


def test_probability_zero_is_the_plain_transform_and_draws_nothing() -> None:
    """Also when set to 0 during training: the next transform's random draws stay those of a run without mosaics."""
    plain = RectangleImages()
    dataset = MosaicDetection(
        plain,
        lambda image, target: (image, target),
        size=64,
        probability=1.0,
        mixup_probability=1.0,
        copy_paste_probability=1.0,
    )
    dataset.probability = dataset.mixup_probability = dataset.copy_paste_probability = 0.0
    state = torch.get_rng_state()
    image, target = dataset[3]
    assert torch.equal(image, plain[3][0]) and torch.equal(target["labels"], plain[3][1]["labels"])
    assert torch.equal(torch.get_rng_state(), state)


def test_bad_settings_and_masks_are_refused() -> None:
    with pytest.raises(ValueError, match="probability"):
        MosaicDetection(RectangleImages(), lambda i, t: (i, t), probability=1.5)
    image, target = RectangleImages()[0]
    target["masks"] = tv_tensors.Mask(torch.zeros(2, *image.shape[-2:], dtype=torch.bool))
    with pytest.raises(ValueError, match="masks"):
        MosaicDetection(RectangleImages(), lambda i, t: (i, t)).mosaic([(image, target)] * 4)
    with pytest.raises(ValueError, match="mixup of instance masks"):
        MosaicDetection.mixup(*RectangleImages()[1], image, target)
    with pytest.raises(ValueError, match="mixup_probability"):
        MosaicDetection(RectangleImages(), lambda i, t: (i, t), mixup_probability=-0.1)


def _labels_of_colour(difference: torch.Tensor) -> torch.Tensor:
    """[H,W] label of each pixel of a difference ``(1 - w) * [20 L, 250 - 20 L, 200]`` (0 where too faint): the
    first channel over the third is L / 10 whatever the weight and the resizing's blend with black."""
    difference = difference.float()
    labels = (10 * difference[0] / difference[2].clamp(min=1)).round().long()
    return torch.where(difference[2] > 40, labels, 0)


@pytest.mark.parametrize(("first", "second", "seed"), [(0, 1, 0), (2, 3, 1), (4, 0, 2), (1, 2, 3)])
def test_mixup_moves_the_other_images_boxes_with_its_pixels_and_keeps_both(first: int, second: int, seed: int) -> None:
    """The other image's contribution is the blend minus the same blend with that image black (same draws): each
    of its objects must lie where its box was moved to, whatever the two images' shapes."""
    image, target = RectangleImages()[first]
    other, other_target = RectangleImages()[second]
    torch.manual_seed(seed)
    mixed, mixed_target = MosaicDetection.mixup(image, target, other, other_target)
    torch.manual_seed(seed)
    without_other, _ = MosaicDetection.mixup(image, target, tv_tensors.Image(torch.zeros_like(other)), other_target)
    assert mixed.shape == image.shape and mixed_target["image_id"] == target["image_id"]
    assert mixed_target["boxes"].canvas_size == tuple(image.shape[-2:])
    assert mixed_target["labels"].tolist() == target["labels"].tolist() + other_target["labels"].tolist()
    boxes = mixed_target["boxes"].as_subclass(torch.Tensor)
    assert torch.equal(boxes[:2], target["boxes"].as_subclass(torch.Tensor).float())  # the image's own stay put
    labels = _labels_of_colour(mixed.int() - without_other.int())
    for box, label in zip(boxes[2:].tolist(), other_target["labels"].tolist()):
        ys, xs = torch.nonzero(labels == label, as_tuple=True)
        assert len(xs) > 9, f"label {label} not visible"
        extent = [xs.min().item(), ys.min().item(), xs.max().item() + 1.0, ys.max().item() + 1.0]
        assert box == pytest.approx(extent, abs=2.0), f"label {label}"
    # The image's own pixels are kept at the blend's weight: about half (Beta(32, 32)), never all or nothing.
    torch.manual_seed(seed)
    grey_only, _ = MosaicDetection.mixup(
        tv_tensors.Image(torch.zeros_like(image)), target, tv_tensors.Image(torch.zeros_like(other)), other_target
    )
    x1, y1, x2, y2 = (int(v) for v in boxes[0].tolist())
    own = (without_other.float() - grey_only.float())[:, y1:y2, x1:x2]
    share = own.mean() / image[:, y1:y2, x1:x2].float().mean()
    assert 0.3 < share < 0.7


def test_mixup_through_the_dataset_blends_two_images_on_every_sample_at_probability_one() -> None:
    dataset = MosaicDetection(
        RectangleImages(), lambda image, target: (image, target), probability=0.0, mixup_probability=1.0
    )
    for seed in range(5):
        torch.manual_seed(seed)
        image, target = dataset[seed]
        assert image.shape == RectangleImages()[seed][0].shape and len(target["labels"]) == 4
        assert target["labels"][:2].tolist() == [2 * seed + 1, 2 * seed + 2]


class MaskedShapes(torch.utils.data.Dataset):
    """Images of a grey of their own, each with one L-shaped object (a square missing its top-right quarter, so
    that a flip shows) of a colour no other uses, its mask in the target as CocoInstances gives it."""

    sizes = [(120, 160), (90, 110), (140, 70)]
    sides = [30, 24, 20]

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, dict]:
        height, width = self.sizes[index]
        side, top, left = self.sides[index], 10 + index, 12 + 2 * index
        mask = torch.zeros(height, width, dtype=torch.bool)
        mask[top : top + side, left : left + side] = True
        mask[top : top + side // 2, left + side // 2 : left + side] = False
        image = torch.full((3, height, width), 5 + 10 * index, dtype=torch.uint8)
        image[:, mask] = torch.tensor([60 + 60 * index, 200 - 50 * index, 90], dtype=torch.uint8).view(3, 1)
        box = torch.tensor([[left, top, left + side, top + side]], dtype=torch.float32)
        size = torch.tensor([height, width])
        target = {
            "boxes": tv_tensors.BoundingBoxes(box, format="XYXY", canvas_size=(height, width)),
            "labels": torch.tensor([index + 1]),
            "masks": tv_tensors.Mask(mask[None]),
            "image_id": index,
            "orig_size": size,
            "size": size.clone(),
        }
        return tv_tensors.Image(image), target


@pytest.mark.parametrize("seed", range(8))
def test_copy_paste_puts_only_the_objects_pixels_inside_its_new_box_on_a_free_place(seed: int) -> None:
    torch.manual_seed(seed)
    shapes = MaskedShapes()
    image, target = shapes[0]
    other, other_target = shapes[1 + seed % 2]
    pasted, pasted_target = MosaicDetection.copy_paste(image, target, other, other_target)
    assert "masks" not in pasted_target and pasted_target["boxes"].canvas_size == image.shape[-2:]
    assert pasted_target["labels"].tolist() == [1, other_target["labels"].item()]
    kept, new = pasted_target["boxes"].tolist()
    assert kept == target["boxes"].tolist()[0]
    assert new[2] <= kept[0] or new[0] >= kept[2] or new[3] <= kept[1] or new[1] >= kept[3]  # no overlap
    x1, y1, x2, y2 = (int(v) for v in new)
    changed = (pasted != image).any(0)
    assert changed.sum() == other_target["masks"].sum()  # the mask's pixels, not its box's
    assert changed[y1:y2, x1:x2].sum() == changed.sum()
    shape = changed[y1:y2, x1:x2]
    source = other_target["masks"][0][other_target["masks"][0].any(1)][:, other_target["masks"][0].any(0)]
    assert torch.equal(shape, source) or torch.equal(shape, source.flip(-1))
    colour = other[:, other_target["masks"][0]][:, 0]
    assert (pasted[:, y1:y2, x1:x2][:, shape] == colour.view(3, 1)).all()


def test_copy_paste_flips_about_half_the_objects_and_leaves_out_those_without_room() -> None:
    shapes = MaskedShapes()
    image, target = shapes[0]
    other, other_target = shapes[1]
    flipped = 0
    for seed in range(40):
        torch.manual_seed(seed)
        pasted, pasted_target = MosaicDetection.copy_paste(image, target, other, other_target)
        x1, y1, x2, y2 = (int(v) for v in pasted_target["boxes"][1].tolist())
        flipped += bool((pasted != image).any(0)[y1, x2 - 1])  # the missing quarter moves to the left
    assert 10 <= flipped <= 30
    tiny = tv_tensors.Image(torch.zeros(3, 20, 20, dtype=torch.uint8))
    tiny_target = {
        "boxes": tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(20, 20)),
        "labels": torch.zeros(0, dtype=torch.int64),
    }
    unchanged, unchanged_target = MosaicDetection.copy_paste(tiny, tiny_target, other, other_target)  # 24 px: too large
    assert torch.equal(unchanged, tiny) and len(unchanged_target["labels"]) == 0
    full = {
        "boxes": tv_tensors.BoundingBoxes(
            torch.tensor([[0.0, 0.0, 160.0, 120.0]]), format="XYXY", canvas_size=(120, 160)
        ),
        "labels": torch.tensor([1]),
    }
    covered, covered_target = MosaicDetection.copy_paste(image, full, other, other_target)  # no free place
    assert torch.equal(covered, image) and covered_target["labels"].tolist() == [1]


def test_copy_paste_tries_several_places_before_leaving_an_object_out() -> None:
    """Only a 30-pixel strip at the right of the 160-pixel image is free: 7 of the 137 places of a 24-pixel object.
    One draw finds it 5% of the time, ``PASTE_ATTEMPTS`` (20) draws 65%."""
    image, _ = MaskedShapes()[0]
    other, other_target = MaskedShapes()[1]
    strip = {
        "boxes": tv_tensors.BoundingBoxes(
            torch.tensor([[0.0, 0.0, 130.0, 120.0]]), format="XYXY", canvas_size=(120, 160)
        ),
        "labels": torch.tensor([1]),
    }
    pasted = 0
    for seed in range(60):
        torch.manual_seed(seed)
        _, pasted_target = MosaicDetection.copy_paste(image, strip, other, other_target)
        if len(pasted_target["labels"]) == 2:
            pasted += 1
            assert pasted_target["boxes"][1, 0] >= 130  # in the strip
    assert 25 <= pasted <= 52


@pytest.mark.parametrize("seed", range(8))
def test_copy_paste_without_masks_cuts_each_object_along_its_box(seed: int) -> None:
    """Box-only annotations: an object is its box's whole pixels (floor to ceiling), and its new box is its box
    moved with them, fractions and all (mirrored in a flipped patch)."""
    torch.manual_seed(seed)
    image, target = RectangleImages()[2]
    other, other_target = RectangleImages()[4]
    boxes = other_target["boxes"].as_subclass(torch.Tensor) + torch.tensor([0.3, 0.6, -0.2, -0.4])
    other_target = {
        **other_target,
        "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=other.shape[-2:]),
    }
    pasted, pasted_target = MosaicDetection.copy_paste(image, target, other, other_target)
    kept, new = (
        pasted_target["boxes"].as_subclass(torch.Tensor)[:2],
        pasted_target["boxes"].as_subclass(torch.Tensor)[2:],
    )
    assert torch.equal(kept, target["boxes"].as_subclass(torch.Tensor)) and len(new) >= 1
    changed = (pasted != image).any(0)
    area = 0
    for box, label in zip(new.tolist(), pasted_target["labels"][2:].tolist()):
        source = boxes[other_target["labels"].tolist().index(label)].tolist()
        assert box[2] - box[0] == pytest.approx(source[2] - source[0]) and box[3] - box[1] == pytest.approx(
            source[3] - source[1]
        )
        whole = [math.floor(box[0]), math.floor(box[1]), math.ceil(box[2]), math.ceil(box[3])]
        assert _colour_extent(pasted, label, around=box) == whole  # the object's pixels, exactly under its box
        area += (whole[2] - whole[0]) * (whole[3] - whole[1])
        for other_box in kept.tolist():
            assert box[2] <= other_box[0] or box[0] >= other_box[2] or box[3] <= other_box[1] or box[1] >= other_box[3]
    assert changed.sum() == area  # nothing outside the pasted boxes' pixels


def test_copy_paste_without_masks_mirrors_the_box_in_a_flipped_patch() -> None:
    """The L-shaped object of ``MaskedShapes`` shows a flip; its box, a quarter pixel inside the patch on the left and
    0.6 on the right, must then be 0.6 inside on the left."""
    image, target = MaskedShapes()[0]
    other, other_target = MaskedShapes()[1]
    boxes = other_target["boxes"].as_subclass(torch.Tensor) + torch.tensor([0.25, 0.0, -0.6, 0.0])
    other_target = {
        "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=other.shape[-2:]),
        "labels": other_target["labels"],
    }
    seen = set()
    for seed in range(12):
        torch.manual_seed(seed)
        pasted, pasted_target = MosaicDetection.copy_paste(
            image, {k: v for k, v in target.items() if k != "masks"}, other, other_target
        )
        box = pasted_target["boxes"].as_subclass(torch.Tensor)[1].tolist()
        x0, y0, x1 = math.floor(box[0]), math.floor(box[1]), math.ceil(box[2])
        flipped = bool(
            (pasted[:, y0, x0] == 15).all()
        )  # the source's grey, in its missing top-right quarter, now top-left
        assert bool((pasted[:, y0, x1 - 1] == 15).all()) is not flipped
        assert box[0] - x0 == pytest.approx(0.6 if flipped else 0.25, abs=1e-4)
        seen.add(flipped)
    assert seen == {True, False}


def test_copy_paste_leaves_out_boxes_without_pixels() -> None:
    image, target = MaskedShapes()[0]
    other, other_target = RectangleImages()[4]
    outside = torch.tensor([[-30.0, 10.0, -2.0, 40.0], [50.0, 20.0, 50.0, 60.0]])  # left of the image; no width
    other_target = {
        **other_target,
        "boxes": tv_tensors.BoundingBoxes(outside, format="XYXY", canvas_size=other.shape[-2:]),
    }
    pasted, pasted_target = MosaicDetection.copy_paste(
        image, {k: v for k, v in target.items() if k != "masks"}, other, other_target
    )
    assert torch.equal(pasted, image) and pasted_target["labels"].tolist() == [1]


class ShapesWithoutMasks(MaskedShapes):
    """MaskedShapes' items without their masks, which :meth:`masks` gives on demand, noting each index asked for."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def __getitem__(self, index: int) -> tuple[tv_tensors.Image, dict]:
        image, target = super().__getitem__(index)
        return image, {k: v for k, v in target.items() if k != "masks"}

    def masks(self, index: int) -> torch.Tensor:
        self.asked.append(index)
        return super().__getitem__(index)[1]["masks"]


def test_copy_paste_asks_for_the_masks_of_the_pasted_image_only_and_cuts_along_the_boxes_without() -> None:
    shapes = ShapesWithoutMasks()
    with pytest.raises(ValueError, match="copy_paste_probability"):
        MosaicDetection(shapes, lambda i, t: (i, t), copy_paste_probability=1.5)
    pasting = MosaicDetection(
        shapes, lambda i, t: (i, t), probability=0.0, copy_paste_probability=1.0, masks=shapes.masks
    )
    boxes_only = MosaicDetection(shapes, lambda i, t: (i, t), probability=0.0, copy_paste_probability=1.0)
    plain_image = MaskedShapes()[0][0]
    for seed in range(8):
        torch.manual_seed(seed)
        image, target = pasting[0]
        source = shapes.asked[-1]
        assert len(shapes.asked) == seed + 1 and "masks" not in target
        assert target["labels"].tolist() == [1, source + 1]  # room for the other image's object in the 120x160 image
        assert (image != plain_image).any(0).sum() == MaskedShapes()[source][1]["masks"].sum()  # the L, not its box
        torch.manual_seed(seed)
        image, target = boxes_only[0]
        side = MaskedShapes.sides[source]
        assert target["labels"].tolist() == [1, source + 1] and len(shapes.asked) == seed + 1
        if source:  # another image's grey: every pixel of the box shows
            assert (image != plain_image).any(0).sum() == side * side
    assert len(set(shapes.asked)) == 3
    pasting.copy_paste_probability = 0.0  # switched off (the long-run callback): the plain item, no masks asked for
    image, target = pasting[0]
    assert torch.equal(image, plain_image) and target["labels"].tolist() == [1] and len(shapes.asked) == 8


def test_copy_paste_leaves_out_an_object_too_large_on_one_side_only() -> None:
    """A 10-wide, 30-tall object: left out of a 25x40 image (too tall, though narrow enough), pasted into a 40x25 one
    (both sides fit), whichever way it is flipped."""
    other = tv_tensors.Image(torch.full((3, 50, 50), 200, dtype=torch.uint8))
    other_target = {
        "boxes": tv_tensors.BoundingBoxes(torch.tensor([[5.0, 5.0, 15.0, 35.0]]), format="XYXY", canvas_size=(50, 50)),
        "labels": torch.tensor([2]),
    }
    for seed in range(4):
        for (height, width), fits in (((25, 40), False), ((40, 25), True)):
            torch.manual_seed(seed)
            image = tv_tensors.Image(torch.zeros(3, height, width, dtype=torch.uint8))
            empty = {
                "boxes": tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(height, width)),
                "labels": torch.zeros(0, dtype=torch.int64),
            }
            pasted, pasted_target = MosaicDetection.copy_paste(image, empty, other, other_target)
            assert pasted_target["labels"].tolist() == ([2] if fits else [])
            assert int((pasted != image).any(0).sum()) == (10 * 30 if fits else 0)
