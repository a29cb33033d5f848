"""Writes a held-out classification set of drawn shapes in torchvision's ImageFolder layout
(``OUT/{train,val}/CLASS/*.jpg``), independent of vision_tx's toy classification set.

Eight shape classes: the six outlines of ``make_shapes_dataset.py`` (ellipse, cross, star, hexagon,
diamond, arrow) plus a triangle and a four-pointed star, one shape an image, each in a colour drawn
at random (the colour does not give the class away), turned at random, from ``--min-object`` to
``--max-object`` of the image side, anywhere in the image, over ``make_shapes_dataset.py``'s
backgrounds (colour gradients with stripes and noise; ``--background plain``: one colour with
noise); JPEG. A model has to learn the shapes, where the toy set's classes differ in colour too.

    python scripts/make_shapes_classification.py /tmp/shapes_cls --seed 0
    python tools/train.py --config classification_toy --data.root /tmp/shapes_cls
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from make_shapes_dataset import BACKGROUNDS, KINDS, _paint, _random_box, _regular, _shape_mask
from PIL import Image

# make_shapes_dataset's (category id, name, outline) rows; the two added have no COCO id.
CLASSES = (*KINDS, (None, "triangle", _regular(3)), (None, "four_point_star", _regular(4, inner=0.4)))


def draw_image(rng: np.random.Generator, kind: int, args: argparse.Namespace) -> np.ndarray:
    """One ``[size, size, 3]`` uint8 image holding one shape of ``CLASSES[kind]``."""
    side = args.size
    image = BACKGROUNDS[args.background](rng, side, side)
    box = _random_box(rng, side, side, args.min_object, args.max_object)
    _paint(image, _shape_mask(rng, kind, side, side, box, CLASSES), rng)
    return np.clip(image, 0, 255).astype(np.uint8)


def make_dataset(args: argparse.Namespace) -> Path:
    """Writes ``args.out/{train,val}/CLASS/NNNNN.jpg``; the same arguments give the same files."""
    out = Path(args.out)
    rng = np.random.default_rng(args.seed)
    for split, count in (("train", args.num_train), ("val", args.num_val)):
        for kind, (_, name, _) in enumerate(CLASSES):
            folder = out / split / name
            folder.mkdir(parents=True, exist_ok=False)
            for index in range(count):
                Image.fromarray(draw_image(rng, kind, args)).save(
                    folder / f"{index:05d}.jpg", quality=int(rng.integers(70, 96))
                )
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the dataset's root folder (must not exist)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-train", type=int, default=60, help="training images per class")
    p.add_argument("--num-val", type=int, default=20, help="validation images per class")
    p.add_argument("--size", type=int, default=64, help="image side, pixels")
    p.add_argument("--min-object", type=float, default=0.4, help="smallest shape side, fraction of the image side")
    p.add_argument("--max-object", type=float, default=0.9, help="largest shape side, fraction of the image side")
    p.add_argument(
        "--background",
        choices=sorted(BACKGROUNDS),
        default="textured",
        help="textured: a gradient with stripes and noise; plain: one colour with noise",
    )
    return p


def main() -> None:
    args = parser().parse_args()
    if not 0 < args.min_object <= args.max_object < 1:
        parser().error(f"need 0 < --min-object <= --max-object < 1, got {args.min_object}, {args.max_object}")
    if args.size < 16:
        parser().error(f"need --size >= 16, got {args.size}")
    print(f"wrote {make_dataset(args)}")


if __name__ == "__main__":
    main()
