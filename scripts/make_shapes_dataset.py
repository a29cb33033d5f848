"""Writes a held-out detection set of drawn shapes in the COCO layout, independent of vision_tx's toy set.

A learning check: a detector that learned "find the shapes" rather than the toy set's look should
also learn this set, trained with the same command and ``--data.root OUT``. Shapes of several kinds
with non-contiguous category ids, each object in a colour drawn at random (the colour does not give
the class away), over colour gradients with noise and faint stripes (``--background plain``: one
colour with noise); images of varying, non-square size; objects from ``--min-object`` of the
image's shorter side up, allowed to overlap a little;
crowd regions (a cluster of small shapes of one kind, ``iscrowd=1`` with an RLE mask, as COCO);
empty images; JPEG. Boxes are tight around each object's visible pixels.

    python scripts/make_shapes_dataset.py /tmp/shapes_a --seed 1
    python scripts/make_shapes_dataset.py /tmp/shapes_b --seed 2 --kinds 5 --min-side 256 --max-side 400
    python scripts/make_shapes_dataset.py /tmp/shapes_c --seed 3 --kinds 4 --background plain
    python tools/train.py --config rtdetr_convnext_toy --data.root /tmp/shapes_a
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from pycocotools import mask as mask_utils

Polygon = list[tuple[float, float]]


def _regular(corners: int, inner: float | None = None) -> Callable[[np.random.Generator], Polygon]:
    """A regular polygon (or a star when ``inner`` is the inner radius) in the unit box ``[-1, 1]^2``."""

    def outline(rng: np.random.Generator) -> Polygon:
        turn = rng.uniform(0, 2 * math.pi)
        radii = [1.0] if inner is None else [1.0, inner]
        points = corners * len(radii)
        return [
            (
                radii[i % len(radii)] * math.cos(turn + 2 * math.pi * i / points),
                radii[i % len(radii)] * math.sin(turn + 2 * math.pi * i / points),
            )
            for i in range(points)
        ]

    return outline


def _cross(rng: np.random.Generator) -> Polygon:
    arm = rng.uniform(0.25, 0.45)
    return [
        (-arm, -1),
        (arm, -1),
        (arm, -arm),
        (1, -arm),
        (1, arm),
        (arm, arm),
        (arm, 1),
        (-arm, 1),
        (-arm, arm),
        (-1, arm),
        (-1, -arm),
        (-arm, -arm),
    ]


def _diamond(rng: np.random.Generator) -> Polygon:
    squash = rng.uniform(0.45, 0.8)
    return [(0, -1), (squash, 0), (0, 1), (-squash, 0)]


def _arrow(rng: np.random.Generator) -> Polygon:
    shaft = rng.uniform(0.2, 0.35)
    return [(-1, -shaft), (0.1, -shaft), (0.1, -0.8), (1, 0), (0.1, 0.8), (0.1, shaft), (-1, shaft)]


# (category id, name, outline in the unit box, or None for an ellipse); ids deliberately sparse.
KINDS: tuple[tuple[int, str, Callable[[np.random.Generator], Polygon] | None], ...] = (
    (4, "ellipse", None),
    (11, "cross", _cross),
    (23, "star", _regular(5, inner=0.45)),
    (30, "hexagon", _regular(6)),
    (37, "diamond", _diamond),
    (45, "arrow", _arrow),
)


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A two-colour gradient in a random direction, faint stripes and pixel noise: ``[H, W, 3]`` float."""
    start, end = rng.uniform(0, 255, size=(2, 3))
    angle = rng.uniform(0, 2 * math.pi)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    along = x * math.cos(angle) + y * math.sin(angle)
    along = (along - along.min()) / max(np.ptp(along), 1.0)
    image = start + along[..., None] * (end - start)
    period, phase, tilt = rng.uniform(6, 40), rng.uniform(0, 2 * math.pi), rng.uniform(0, math.pi)
    stripes = np.sin((x * math.cos(tilt) + y * math.sin(tilt)) * 2 * math.pi / period + phase)
    image += rng.uniform(0, 20) * stripes[..., None]
    return image + rng.normal(0, rng.uniform(3, 18), size=image.shape)


def _plain_background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """One random colour with pixel noise: ``[H, W, 3]`` float."""
    return rng.uniform(0, 255, size=3) + rng.normal(0, rng.uniform(3, 18), size=(height, width, 3))


BACKGROUNDS = {"textured": _background, "plain": _plain_background}


def _colour(rng: np.random.Generator) -> np.ndarray:
    """A random saturated or dark/light colour: any hue, so that colour tells nothing of the kind."""
    return (
        rng.uniform(0, 255, size=3)
        if rng.random() < 0.3
        else np.array(
            Image.new("HSV", (1, 1), (int(rng.integers(256)), int(rng.integers(120, 256)), int(rng.integers(90, 256))))
            .convert("RGB")
            .getpixel((0, 0)),
            dtype=np.float64,
        )
    )


def _shape_mask(
    rng: np.random.Generator,
    kind: int,
    height: int,
    width: int,
    box: tuple[float, ...],
    kinds: Sequence[tuple[Any, str, Callable[[np.random.Generator], Polygon] | None]] = KINDS,
) -> np.ndarray:
    """The filled mask ``[H, W]`` bool of ``kinds[kind]`` drawn to fill the box ``(x0, y0, x1, y1)``."""
    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    x0, y0, x1, y1 = box
    outline = kinds[kind][2]
    if outline is None:
        draw.ellipse(box, fill=1)
    else:
        points = np.array(outline(rng), dtype=np.float64)
        points = (points - points.min(0)) / np.maximum(np.ptp(points, 0), 1e-6)  # fill the box
        points = points * [x1 - x0, y1 - y0] + [x0, y0]
        draw.polygon([tuple(p) for p in points], fill=1)
    return np.asarray(canvas, dtype=bool)


def _random_box(rng: np.random.Generator, height: int, width: int, low: float, high: float) -> tuple[float, ...]:
    """A box whose longer side is ``low..high`` of the shorter image side, aspect 0.6..1.6, inside the image."""
    short = min(height, width)
    side = rng.uniform(low, high) * short
    aspect = rng.uniform(0.6, 1.6)
    box_w, box_h = min(side * min(aspect, 1), width - 1), min(side / max(aspect, 1), height - 1)
    x0, y0 = rng.uniform(0, width - box_w), rng.uniform(0, height - box_h)
    return x0, y0, x0 + box_w, y0 + box_h


def _paint(image: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> None:
    """Fills ``mask`` in ``image`` with a random colour, shaded along a random direction, plus noise."""
    colour = _colour(rng)
    ys, xs = np.nonzero(mask)
    shade = rng.uniform(-30, 30) * (xs - xs.mean()) / max(np.ptp(xs), 1)
    image[ys, xs] = colour + shade[:, None] + rng.normal(0, 6, size=(len(ys), 3))


def draw_image(rng: np.random.Generator, args: argparse.Namespace) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """One image ``[H, W, 3]`` uint8 and its objects (``category_id``, visible ``mask`` ``[H, W]``, ``iscrowd``)."""
    height, width = (int(v) for v in rng.integers(args.min_side, args.max_side + 1, size=2))
    image = BACKGROUNDS[args.background](rng, height, width)
    if rng.random() < args.empty:
        return np.clip(image, 0, 255).astype(np.uint8), []
    objects: list[dict[str, Any]] = []
    visible_so_far = np.zeros((height, width), dtype=bool)
    if rng.random() < args.crowd:
        kind = int(rng.integers(args.kinds))
        region = _random_box(rng, height, width, 0.3, 0.5)
        crowd = np.zeros((height, width), dtype=bool)
        for _ in range(int(rng.integers(5, 12))):
            x, y = rng.uniform(region[0], region[2]), rng.uniform(region[1], region[3])
            side = rng.uniform(0.05, 0.09) * min(height, width)
            part = _shape_mask(rng, kind, height, width, (x, y, min(x + side, width - 1), min(y + side, height - 1)))
            _paint(image, part, rng)
            crowd |= part
        objects.append({"category_id": KINDS[kind][0], "mask": crowd, "iscrowd": 1})
        visible_so_far |= crowd
    for _ in range(int(rng.integers(args.min_objects, args.max_objects + 1))):
        kind = int(rng.integers(args.kinds))
        for _attempt in range(30):  # overlap with what is drawn is allowed, up to a quarter of the new shape
            mask = _shape_mask(
                rng, kind, height, width, _random_box(rng, height, width, args.min_object, args.max_object)
            )
            if mask.sum() >= 16 and (mask & visible_so_far).sum() <= 0.25 * mask.sum():
                break
        else:
            continue
        _paint(image, mask, rng)
        for earlier in objects:  # what the new shape covers is no longer visible
            earlier["mask"] &= ~mask
        objects.append({"category_id": KINDS[kind][0], "mask": mask, "iscrowd": 0})
        visible_so_far |= mask
    return np.clip(image, 0, 255).astype(np.uint8), [o for o in objects if o["mask"].sum() >= 16]


def annotation(obj: dict[str, Any], ann_id: int, image_id: int) -> dict[str, Any]:
    """The COCO annotation of one object: tight box of its visible pixels, RLE segmentation."""
    ys, xs = np.nonzero(obj["mask"])
    x0, y0 = int(xs.min()), int(ys.min())
    rle = mask_utils.encode(np.asfortranarray(obj["mask"].astype(np.uint8)))
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": obj["category_id"],
        "bbox": [x0, y0, int(xs.max()) + 1 - x0, int(ys.max()) + 1 - y0],
        "area": int(obj["mask"].sum()),
        "iscrowd": obj["iscrowd"],
        "segmentation": {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")},
    }


def make_dataset(args: argparse.Namespace) -> Path:
    """Writes ``args.out/{train2017,val2017}/*.jpg`` and ``args.out/annotations/instances_*.json``."""
    out = Path(args.out)
    rng = np.random.default_rng(args.seed)
    categories = [{"id": cid, "name": name, "supercategory": "shape"} for cid, name, _ in KINDS[: args.kinds]]
    image_id = ann_id = 0
    for split, count in (("train2017", args.num_train), ("val2017", args.num_val)):
        (out / split).mkdir(parents=True, exist_ok=False)
        images, annotations = [], []
        for _ in range(count):
            image_id += 1
            pixels, objects = draw_image(rng, args)
            file_name = f"{image_id:012d}.jpg"
            Image.fromarray(pixels).save(out / split / file_name, quality=int(rng.integers(70, 96)))
            images.append({"id": image_id, "file_name": file_name, "height": pixels.shape[0], "width": pixels.shape[1]})
            for obj in objects:
                ann_id += 1
                annotations.append(annotation(obj, ann_id, image_id))
        (out / "annotations").mkdir(exist_ok=True)
        dataset = {
            "info": {"description": "held-out shapes", "seed": args.seed},
            "images": images,
            "annotations": annotations,
            "categories": categories,
        }
        (out / "annotations" / f"instances_{split}.json").write_text(json.dumps(dataset))
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the dataset's root folder (must not exist)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-train", type=int, default=160)
    p.add_argument("--num-val", type=int, default=40)
    p.add_argument("--kinds", type=int, default=3, choices=range(1, len(KINDS) + 1), help="number of shape kinds")
    p.add_argument("--min-side", type=int, default=160, help="smallest image side, pixels")
    p.add_argument("--max-side", type=int, default=320, help="largest image side, pixels")
    p.add_argument("--min-objects", type=int, default=1)
    p.add_argument("--max-objects", type=int, default=4)
    p.add_argument(
        "--min-object", type=float, default=1 / 7, help="smallest object side, fraction of the shorter image side"
    )
    p.add_argument(
        "--max-object", type=float, default=0.5, help="largest object side, fraction of the shorter image side"
    )
    p.add_argument("--empty", type=float, default=0.12, help="fraction of images without objects")
    p.add_argument(
        "--background",
        choices=sorted(BACKGROUNDS),
        default="textured",
        help="textured: a gradient with stripes and noise; plain: one colour with noise",
    )
    p.add_argument("--crowd", type=float, default=0.15, help="fraction of images with a crowd region")
    return p


def main() -> None:
    args = parser().parse_args()
    if not 0 < args.min_object <= args.max_object < 1:
        parser().error(f"need 0 < --min-object <= --max-object < 1, got {args.min_object}, {args.max_object}")
    if not 16 <= args.min_side <= args.max_side:
        parser().error(f"need 16 <= --min-side <= --max-side, got {args.min_side}, {args.max_side}")
    print(f"wrote {make_dataset(args)}")


if __name__ == "__main__":
    main()
