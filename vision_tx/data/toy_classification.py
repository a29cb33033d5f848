"""A built-in toy image-classification set in torchvision's ImageFolder layout: one shape per image.

Six classes (three shapes in two colours) on noisy grey ground, the shape's size and place drawn at
random: a small model learns it on a CPU in a couple of minutes. Generated deterministically on
first use and cached as ``ROOT/{train,val}/CLASS/*.png``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vision_tx.data.toy import cached_build, shape_mask

# Bump when the drawing changes, so that old caches are regenerated.
TOY_VERSION = 1
_SHAPES = ("circle", "square", "triangle")
_COLOURS = {"red": (210, 50, 40), "blue": (50, 80, 220)}
TOY_CLASSES = tuple(f"{colour}_{shape}" for colour in _COLOURS for shape in _SHAPES)


def _draw(rng: np.random.Generator, class_name: str, side: int) -> np.ndarray:
    """One ``[side, side, 3]`` uint8 image holding one shape of ``class_name``."""
    colour, shape = class_name.split("_")
    base = rng.integers(80, 170) + rng.integers(-15, 16, size=3)
    image = np.clip(base + rng.normal(0, 20, size=(side, side, 3)), 0, 255)
    size = int(rng.integers(side // 4, side * 3 // 4 + 1))
    top, left = (int(v) for v in rng.integers(0, side - size + 1, size=2))
    mask = np.zeros((side, side), dtype=bool)
    mask[top : top + size, left : left + size] = shape_mask(shape, size)
    image[mask] = np.clip(np.array(_COLOURS[colour]) + rng.normal(0, 12, size=(int(mask.sum()), 3)), 0, 255)
    return image.astype(np.uint8)


def make_toy_classification(
    out_dir: str | os.PathLike,
    num_train_per_class: int = 40,
    num_val_per_class: int = 10,
    side: int = 64,
    seed: int = 0,
) -> Path:
    """Writes the toy set into ``out_dir`` (which must not exist yet): ``num_train_per_class`` and
    ``num_val_per_class`` images of ``side`` pixels per class, drawn from ``seed``; same arguments, same bytes."""
    out_dir = Path(out_dir)
    rng = np.random.default_rng(seed)
    for split, count in (("train", num_train_per_class), ("val", num_val_per_class)):
        for class_name in TOY_CLASSES:
            folder = out_dir / split / class_name
            folder.mkdir(parents=True)
            for index in range(count):
                Image.fromarray(_draw(rng, class_name, side)).save(folder / f"{index:05d}.png")
    info = {
        "description": "vision_tx toy classification shapes",
        "version": TOY_VERSION,
        "seed": seed,
        "classes": TOY_CLASSES,
    }
    (out_dir / "info.json").write_text(json.dumps(info))
    return out_dir


def _version(root: Path) -> Any:
    return json.loads((root / "info.json").read_text())["version"]


def toy_classification_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The toy set's root ``cache_dir``, generated on first use (default ``~/.cache/vision_tx/toy_classification``)."""
    return cached_build(cache_dir, "toy_classification", TOY_VERSION, make_toy_classification, _version)
