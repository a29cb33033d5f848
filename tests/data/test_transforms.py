"""DETR augmentation: boxes and masks follow flips, resizes and crops exactly; sizes obey the settings."""

from __future__ import annotations

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from vision_tx.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    DetectionTransform,
    DetrTrainTransform,
    DetrValTransform,
    RandomSizeCrop,
)


def _sample(height: int = 200, width: int = 300) -> tuple[tv_tensors.Image, dict]:
    image = tv_tensors.Image(torch.randint(0, 256, (3, height, width), dtype=torch.uint8))
    boxes = torch.tensor([[10.0, 20.0, 110.0, 60.0], [200.0, 150.0, 290.0, 190.0], [0.0, 0.0, 30.0, 30.0]])
    masks = torch.zeros(3, height, width, dtype=torch.bool)
    for mask, (x1, y1, x2, y2) in zip(masks, boxes.int().tolist()):
        mask[y1:y2, x1:x2] = True
    size = torch.tensor([height, width])
    target = {
        "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(height, width)),
        "labels": torch.tensor([1, 5, 9]),
        "masks": tv_tensors.Mask(masks),
        "image_id": 42,
        "orig_size": size,
        "size": size.clone(),
    }
    return image, target


def _mask_boxes(masks: torch.Tensor) -> list[list[float]]:
    """The xyxy extent of each mask."""
    out = []
    for mask in masks:
        ys, xs = torch.nonzero(mask, as_tuple=True)
        out.append([xs.min().item(), ys.min().item(), xs.max().item() + 1.0, ys.max().item() + 1.0])
    return out


def test_horizontal_flip() -> None:
    image, target = _sample()
    flipped_image, flipped = DetectionTransform(v2.RandomHorizontalFlip(p=1.0))(image, target)
    assert flipped["boxes"].tolist() == [[190, 20, 290, 60], [10, 150, 100, 190], [270, 0, 300, 30]]
    assert torch.equal(flipped_image, image.flip(-1))
    assert torch.equal(flipped["masks"], target["masks"].flip(-1))
    assert flipped["labels"].tolist() == [1, 5, 9] and flipped["image_id"] == 42


@pytest.mark.parametrize(
    ("image_hw", "size", "max_size", "expected_hw"),
    [((200, 300), 100, 1333, (100, 150)), ((200, 300), 100, 120, (80, 120)), ((300, 199), 100, 1333, (150, 100))],
)
def test_val_resize_scales_boxes_and_updates_size(
    image_hw: tuple[int, int], size: int, max_size: int, expected_hw: tuple[int, int]
) -> None:
    image, target = _sample(*image_hw)
    out_image, out = DetrValTransform(size=size, max_size=max_size)(image, target)
    assert tuple(out_image.shape) == (3, *expected_hw)
    assert out["size"].tolist() == list(expected_hw) and out["orig_size"].tolist() == list(image_hw)
    scale = torch.tensor([expected_hw[1] / image_hw[1], expected_hw[0] / image_hw[0]] * 2)
    torch.testing.assert_close(
        out["boxes"].as_subclass(torch.Tensor), target["boxes"].as_subclass(torch.Tensor) * scale
    )
    assert out["masks"].shape == (3, *expected_hw)
    assert out_image.dtype == torch.float32


def test_normalisation_is_imagenet() -> None:
    image = tv_tensors.Image(torch.full((3, 8, 8), 255, dtype=torch.uint8))
    target = {
        "boxes": tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(8, 8)),
        "labels": torch.zeros(0),
    }
    out, _ = DetrValTransform(size=8)(image, target)
    expected = (1 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    torch.testing.assert_close(out[:, 0, 0], expected)


def test_random_size_crop_moves_clips_and_drops_boxes() -> None:
    crop = RandomSizeCrop(60, 120)
    for seed in range(20):
        image, target = _sample()
        torch.manual_seed(seed)
        params = crop.make_params([image])
        torch.manual_seed(seed)
        out_image, out = DetectionTransform(v2.Compose([crop, v2.SanitizeBoundingBoxes()]))(image, target)
        top, left, height, width = params["top"], params["left"], params["height"], params["width"]
        assert 60 <= height <= 120 and 60 <= width <= 120
        assert torch.equal(out_image, image[:, top : top + height, left : left + width])
        expected, labels = [], []
        for (x1, y1, x2, y2), label in zip(target["boxes"].tolist(), target["labels"].tolist()):
            box = [
                min(max(x1 - left, 0), width),
                min(max(y1 - top, 0), height),
                min(max(x2 - left, 0), width),
                min(max(y2 - top, 0), height),
            ]
            if box[2] - box[0] >= 1 and box[3] - box[1] >= 1:
                expected.append(box)
                labels.append(label)
        assert out["boxes"].tolist() == expected
        assert out["labels"].tolist() == labels
        assert out["size"].tolist() == [height, width]
        assert _mask_boxes(out["masks"]) == expected  # the masks left are those of the boxes left


def test_train_transform_sizes_respect_the_settings() -> None:
    scales, max_size = (96, 128, 160), 200
    transform = DetrTrainTransform(scales=scales, max_size=max_size, crop_scales=(100, 120), crop_size=(64, 96))
    seen_sizes = set()
    for _ in range(30):
        image, target = _sample()
        out_image, out = transform(image, target)
        height, width = out_image.shape[-2:]
        assert out["size"].tolist() == [height, width]
        # The shorter side is a scale, unless that made the longer one too long: then it is max_size
        # (to within the rounding of the shorter side; these images' aspect ratios stay under 3).
        assert min(height, width) in scales or max_size - 3 <= max(height, width)
        assert max(height, width) <= max_size
        boxes = out["boxes"]
        assert boxes.canvas_size == (height, width) and len(boxes) == len(out["labels"]) == len(out["masks"])
        assert (
            (boxes[:, 2:] - boxes[:, :2] >= 1).all() and (boxes[:, 2] <= width).all() and (boxes[:, 3] <= height).all()
        )
        assert out["masks"].shape[-2:] == (height, width)
        seen_sizes.add((height, width))
    assert len(seen_sizes) > 2  # multi-scale indeed


def test_empty_targets_pass_through() -> None:
    image = tv_tensors.Image(torch.zeros(3, 50, 70, dtype=torch.uint8))
    target = {
        "boxes": tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(50, 70)),
        "labels": torch.zeros(0, dtype=torch.int64),
    }
    _, out = DetrTrainTransform(scales=(40,), max_size=80, crop_scales=(40,), crop_size=(20, 30))(image, target)
    assert out["boxes"].shape == (0, 4) and out["labels"].shape == (0,)


@pytest.mark.parametrize("crop_probability", [0.0, 0.5, 1.0])
def test_crop_probability_is_the_share_of_cropped_images(crop_probability: float) -> None:
    """Uncropped images keep their aspect ratio and every box (scaled, in order); cropped ones (a 64-96 px window
    of a 100-120 px shorter side) change their aspect ratio, as a crop of 200x300 almost always does."""
    torch.manual_seed(0)
    transform = DetrTrainTransform(
        scales=(96,), max_size=400, crop_scales=(100, 120), crop_size=(64, 96), crop_probability=crop_probability
    )
    cropped = 0
    for _ in range(40):
        image, target = _sample()
        rows = target["boxes"][:, [1, 3]].clone()  # the flip leaves them
        out_image, out = transform(image, target)
        height, width = out_image.shape[-2:]
        if (height, width) == (96, 144):
            assert torch.allclose(out["boxes"][:, [1, 3]], rows * 96 / 200)
        else:
            cropped += 1
    assert cropped == {0.0: 0, 1.0: 40}.get(crop_probability, cropped) and (
        crop_probability != 0.5 or 10 <= cropped <= 30
    )


def test_crop_probability_outside_zero_one_is_refused() -> None:
    with pytest.raises(ValueError, match="crop_probability"):
        DetrTrainTransform(crop_probability=1.5)


def test_affine_moves_boxes_and_masks_with_the_pixels_and_fills_grey() -> None:
    """A white rectangle on black, zoomed and shifted: its box and mask are where its pixels went, the canvas keeps
    the resized size, and what the shift uncovers is YOLO's grey (not black, not white)."""
    transform = DetrTrainTransform(
        scales=(100,),
        max_size=400,
        crop_probability=0.0,
        affine_probability=1.0,
        translate=0.2,
        affine_scale=(0.6, 1.4),
    )
    moved = grey_seen = 0
    for seed in range(10):
        torch.manual_seed(seed)
        image = tv_tensors.Image(torch.zeros(3, 200, 300, dtype=torch.uint8))
        image[:, 60:140, 100:220] = 255
        target = {
            "boxes": tv_tensors.BoundingBoxes(
                torch.tensor([[100.0, 60.0, 220.0, 140.0]]), format="XYXY", canvas_size=(200, 300)
            ),
            "labels": torch.tensor([3]),
            "masks": tv_tensors.Mask(image[:1].bool()),
        }
        out_image, out = transform(image, target)
        assert tuple(out_image.shape[-2:]) == (100, 150) and out["size"].tolist() == [100, 150]
        pixels = out_image * torch.tensor(IMAGENET_STD)[:, None, None] + torch.tensor(IMAGENET_MEAN)[:, None, None]
        is_white = (pixels > 0.5).all(0)  # brighter than halfway: the rectangle's edges to within a pixel
        box = _mask_boxes(is_white[None])[0]
        torch.testing.assert_close(out["boxes"][0], torch.tensor(box), atol=1.5, rtol=0)
        torch.testing.assert_close(torch.tensor(_mask_boxes(out["masks"])[0]), torch.tensor(box), atol=1.5, rtol=0)
        uncovered = ((pixels - 114 / 255).abs() < 0.02).all(0)
        moved += int(box != [50.0, 30.0, 110.0, 70.0])
        grey_seen += int(uncovered.sum() > 100)
    assert moved >= 8 and grey_seen >= 5  # the affine is applied, not skipped, and fills grey


def test_no_affine_by_default_none_drawn_when_off_and_its_probability_is_checked() -> None:
    """Off (the default, or switched off during training), the affine returns its inputs and draws no random
    number: the images are those of the pipeline without it."""
    transform = DetrTrainTransform()
    assert transform.affine.p == 0.0
    image = tv_tensors.Image(torch.randint(0, 255, (3, 20, 30), dtype=torch.uint8))
    target = {
        "boxes": tv_tensors.BoundingBoxes(torch.tensor([[1.0, 2.0, 10.0, 12.0]]), format="XYXY", canvas_size=(20, 30))
    }
    state = torch.get_rng_state()
    out_image, out = transform.affine(image, target)
    assert out_image is image and out is target and torch.equal(torch.get_rng_state(), state)
    transform.affine.p = 1.0
    assert not torch.equal(transform.affine(image, target)[0], image) and not torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match="affine_probability"):
        DetrTrainTransform(affine_probability=-0.1)


def test_channel_permutation_reorders_the_colours_and_leaves_the_boxes() -> None:
    """A one-colour image (red 10, green 100, blue 200): each output is one of the six orders of those three
    values, all six are drawn, and the boxes are those of the same draw without the permutation (which
    comes after the flip and the resize). Off (the default), it returns its inputs and draws no number."""
    colour = torch.tensor([10, 100, 200], dtype=torch.uint8)
    image = tv_tensors.Image(colour[:, None, None].expand(3, 40, 60).clone())
    target = {
        "boxes": tv_tensors.BoundingBoxes(torch.tensor([[5.0, 4.0, 25.0, 30.0]]), format="XYXY", canvas_size=(40, 60)),
        "labels": torch.tensor([2]),
    }
    permuting = DetrTrainTransform(
        scales=(40,), max_size=400, crop_probability=0.0, channel_permutation_probability=1.0
    )
    plain = DetrTrainTransform(scales=(40,), max_size=400, crop_probability=0.0)
    orders = set()
    for seed in range(40):
        torch.manual_seed(seed)
        out_image, out = permuting(image.clone(), {k: v.clone() for k, v in target.items()})
        torch.manual_seed(seed)
        _, unpermuted = plain(image.clone(), {k: v.clone() for k, v in target.items()})
        torch.testing.assert_close(out["boxes"], unpermuted["boxes"], rtol=0, atol=0)
        pixels = out_image * torch.tensor(IMAGENET_STD)[:, None, None] + torch.tensor(IMAGENET_MEAN)[:, None, None]
        values = (pixels.flatten(1).mean(1) * 255).round().to(torch.uint8)
        assert sorted(values.tolist()) == [10, 100, 200] and (pixels.flatten(1).std(1) < 1e-5).all()
        orders.add(tuple(values.tolist()))
    assert len(orders) == 6
    state = torch.get_rng_state()
    out_image, out = plain.channel_permutation(image, target)
    assert out_image is image and out is target and torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match="channel_permutation_probability"):
        DetrTrainTransform(channel_permutation_probability=2.0)


# An outcome: (the image's size, the box, its bright pixels as a function of row and column indices).
UNMOVED = ((40, 60), [20.0, 4.0, 40.0, 30.0], lambda rows, columns: rows < 10)
MOVED = {
    "vertical_flip": ((40, 60), [20.0, 10.0, 40.0, 36.0], lambda rows, columns: rows >= 30),
    "quarter_turn": ((60, 40), [4.0, 20.0, 30.0, 40.0], lambda rows, columns: columns < 10),
}


@pytest.mark.parametrize("option", list(MOVED))
def test_flip_and_turn_move_the_image_its_canvas_and_the_boxes_together(option: str) -> None:
    """A 40 x 60 image bright in its top 10 rows and a box that the horizontal flip maps onto itself. Flipped
    top to bottom, the bright rows are the bottom 10 and the box runs from 40 - 30 to 40 - 4; turned a quarter
    counter-clockwise, the image is 60 x 40, the bright rows are its left 10 columns and (x, y) goes to
    (y, 60 - x). At 0.5 both outcomes occur; off (the default), it returns its inputs and draws no number."""
    image = tv_tensors.Image(torch.full((3, 40, 60), 10, dtype=torch.uint8))
    image[:, :10] = 200
    target = {
        "boxes": tv_tensors.BoundingBoxes(torch.tensor([[20.0, 4.0, 40.0, 30.0]]), format="XYXY", canvas_size=(40, 60)),
        "labels": torch.tensor([2]),
    }
    moving = DetrTrainTransform(scales=(40,), max_size=400, crop_probability=0.0, **{f"{option}_probability": 0.5})
    seen = set()
    for seed in range(20):
        torch.manual_seed(seed)
        out_image, out = moving(image.clone(), {k: v.clone() for k, v in target.items()})
        bright = out_image[0] > out_image[0].mean()
        rows, columns = torch.arange(bright.shape[0])[:, None], torch.arange(bright.shape[1])[None, :]
        ((size, box, _),) = [
            outcome
            for outcome in (UNMOVED, MOVED[option])
            if outcome[0] == tuple(bright.shape) and torch.equal(bright, outcome[2](rows, columns).expand_as(bright))
        ]
        torch.testing.assert_close(out["boxes"].as_subclass(torch.Tensor), torch.tensor([box]), rtol=0, atol=1e-5)
        assert tuple(out["boxes"].canvas_size) == size
        seen.add(tuple(box))
    assert len(seen) == 2
    plain = DetrTrainTransform(scales=(40,), max_size=400, crop_probability=0.0)
    state = torch.get_rng_state()
    out_image, out = getattr(plain, option)(image, target)
    assert out_image is image and out is target and torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match=f"{option}_probability"):
        DetrTrainTransform(**{f"{option}_probability": 1.5})
