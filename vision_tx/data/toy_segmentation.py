"""A built-in toy semantic-segmentation dataset in the ADE20K layout: coloured shapes on textured ground.

Small enough to train a UperNet to a high mIoU on a CPU in minutes; generated deterministically on
first use and cached as ``ROOT/ADEChallengeData2016/{images,annotations}/{training,validation}``.
As in ADE20K, annotation value 0 is "unlabelled" (a one-pixel outline around each shape, ignored
with ``reduce_zero_label``) and ``k >= 1`` is class ``k - 1`` of :data:`TOY_CLASSES`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from scipy import ndimage

from vision_tx.data.toy import cached_build, shape_mask

# Bump when the drawing changes, so that old caches are regenerated.
TOY_VERSION = 1
TOY_CLASSES = ("background", "circle", "square", "triangle")
_COLOURS = {"circle": (220, 40, 40), "square": (40, 200, 60), "triangle": (50, 80, 230)}


def _draw(rng: np.random.Generator, min_side: int, max_side: int) -> tuple[np.ndarray, np.ndarray]:
    """One image ``[H, W, 3]`` uint8 and its raw annotation ``[H, W]`` uint8 (0 unlabelled, 1 background, ...)."""
    height, width = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
    base = rng.integers(70, 180) + rng.integers(-15, 16, size=3)  # greyish, unlike any shape colour
    image = np.clip(base + rng.normal(0, 18, size=(height, width, 3)), 0, 255)
    label = np.ones((height, width), dtype=np.uint8)
    for _ in range(int(rng.integers(1, 5))):  # later shapes may cover earlier ones
        label_value = int(rng.integers(1, len(TOY_CLASSES)))
        name = TOY_CLASSES[label_value]
        size = int(rng.integers(min(height, width) // 5, min(height, width) // 2 + 1))
        top, left = int(rng.integers(0, height - size + 1)), int(rng.integers(0, width - size + 1))
        mask = np.zeros((height, width), dtype=bool)
        mask[top : top + size, left : left + size] = shape_mask(name, size)
        image[mask] = np.clip(np.array(_COLOURS[name]) + rng.normal(0, 8, size=(int(mask.sum()), 3)), 0, 255)
        label[mask] = label_value + 1
        outline = ndimage.binary_dilation(mask) & ~ndimage.binary_erosion(mask)
        label[outline] = 0
    return image.astype(np.uint8), label


def make_toy_segmentation(
    out_dir: str | os.PathLike,
    num_train: int = 48,
    num_val: int = 16,
    min_side: int = 96,
    max_side: int = 160,
    seed: int = 0,
) -> Path:
    """Writes the toy dataset into ``out_dir`` (which must not exist yet): ``num_train`` and ``num_val`` images with
    sides from ``min_side`` to ``max_side``, drawn from ``seed``; same arguments, same bytes."""
    out_dir = Path(out_dir)
    rng = np.random.default_rng(seed)
    base = out_dir / "ADEChallengeData2016"
    for split, count in (("training", num_train), ("validation", num_val)):
        (base / "images" / split).mkdir(parents=True)
        (base / "annotations" / split).mkdir(parents=True)
        for index in range(count):
            image, label = _draw(rng, min_side, max_side)
            stem = f"TOY_{split[:5]}_{index + 1:08d}"
            Image.fromarray(image).save(base / "images" / split / f"{stem}.jpg", quality=95)
            Image.fromarray(label).save(base / "annotations" / split / f"{stem}.png")
    info = {
        "description": "vision_tx toy segmentation shapes",
        "version": TOY_VERSION,
        "seed": seed,
        "classes": TOY_CLASSES,
    }
    (out_dir / "info.json").write_text(json.dumps(info))
    return out_dir


def _version(root: Path) -> Any:
    return json.loads((root / "info.json").read_text())["version"]


def toy_segmentation_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The toy dataset's root ``cache_dir``, generated on first use (default
    ``~/.cache/vision_tx/toy_segmentation``)."""
    return cached_build(cache_dir, "toy_segmentation", TOY_VERSION, make_toy_segmentation, _version)
