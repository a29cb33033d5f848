"""A built-in toy detection dataset in COCO format: coloured shapes on noisy backgrounds.

Small enough to train a DETR to a visible mAP on a CPU in minutes; generated deterministically on
first use and cached with the standard layout ``ROOT/{train2017,val2017}`` and
``ROOT/annotations/instances_{train,val}2017.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

# Bump when the drawing changes, so that old caches are regenerated.
TOY_VERSION = 1
CATEGORIES = (
    {"id": 1, "name": "circle", "colour": (220, 40, 40)},
    {"id": 2, "name": "square", "colour": (40, 200, 60)},
    {"id": 3, "name": "triangle", "colour": (50, 80, 230)},
)


def shape_mask(name: str, size: int) -> np.ndarray:
    """A filled ``size x size`` bool mask of the shape ``name`` (circle, square or triangle), touching all four sides of
    its square."""
    centres = np.arange(size) + 0.5
    y, x = np.meshgrid(centres, centres, indexing="ij")
    if name == "circle":
        return (x - size / 2) ** 2 + (y - size / 2) ** 2 <= (size / 2) ** 2
    if name == "square":
        return np.ones((size, size), dtype=bool)
    # Triangle pointing up: at height y the row is y / size of the full width, about the centre.
    return np.abs(x - size / 2) <= y / 2 + 0.5


def _draw_image(rng: np.random.Generator, min_side: int, max_side: int) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """One image ``[H, W, 3]`` uint8 and its objects (``category_id``, ``mask`` ``[H, W]`` bool)."""
    height, width = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
    base = rng.integers(70, 180) + rng.integers(-15, 16, size=3)  # greyish, unlike any shape colour
    image = np.clip(base + rng.normal(0, 18, size=(height, width, 3)), 0, 255)
    occupied = np.zeros((height, width), dtype=bool)
    objects = []
    for _ in range(int(rng.integers(1, 4))):
        category = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
        for _attempt in range(20):  # objects do not overlap, so every box is tight around visible pixels
            size = int(rng.integers(min(height, width) // 4, min(height, width) // 2 + 1))
            top, left = int(rng.integers(0, height - size + 1)), int(rng.integers(0, width - size + 1))
            if not occupied[top : top + size, left : left + size].any():
                break
        else:
            continue
        occupied[top : top + size, left : left + size] = True
        mask = np.zeros((height, width), dtype=bool)
        mask[top : top + size, left : left + size] = shape_mask(category["name"], size)
        image[mask] = np.clip(np.array(category["colour"]) + rng.normal(0, 8, size=(int(mask.sum()), 3)), 0, 255)
        objects.append({"category_id": category["id"], "mask": mask})
    return image.astype(np.uint8), objects


def _annotation(obj: dict[str, Any], ann_id: int, image_id: int) -> dict[str, Any]:
    ys, xs = np.nonzero(obj["mask"])
    x1, y1, x2, y2 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
    rle = mask_utils.encode(np.asfortranarray(obj["mask"].astype(np.uint8)))
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": obj["category_id"],
        "bbox": [x1, y1, x2 - x1, y2 - y1],
        "area": int(obj["mask"].sum()),
        "iscrowd": 0,
        "segmentation": {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")},
    }


def make_toy_coco(
    out_dir: str | os.PathLike,
    num_train: int = 64,
    num_val: int = 16,
    min_side: int = 128,
    max_side: int = 192,
    seed: int = 0,
) -> Path:
    """Writes the toy dataset into ``out_dir`` (which must not exist yet): ``num_train`` and ``num_val`` images with
    sides from ``min_side`` to ``max_side``, drawn from ``seed``; same arguments, same bytes."""
    out_dir = Path(out_dir)
    rng = np.random.default_rng(seed)
    categories = [{"id": c["id"], "name": c["name"], "supercategory": "shape"} for c in CATEGORIES]
    image_id = ann_id = 0
    for split, count in (("train2017", num_train), ("val2017", num_val)):
        (out_dir / split).mkdir(parents=True)
        images, annotations = [], []
        for _ in range(count):
            image_id += 1
            pixels, objects = _draw_image(rng, min_side, max_side)
            file_name = f"{image_id:012d}.png"
            Image.fromarray(pixels).save(out_dir / split / file_name)
            images.append({"id": image_id, "file_name": file_name, "height": pixels.shape[0], "width": pixels.shape[1]})
            for obj in objects:
                ann_id += 1
                annotations.append(_annotation(obj, ann_id, image_id))
        info = {"description": "vision_tx toy shapes", "version": TOY_VERSION, "seed": seed}
        dataset = {"info": info, "images": images, "annotations": annotations, "categories": categories}
        (out_dir / "annotations").mkdir(exist_ok=True)
        (out_dir / "annotations" / f"instances_{split}.json").write_text(json.dumps(dataset))
    return out_dir


def cached_build(
    cache_dir: str | os.PathLike | None,
    name: str,
    version: int,
    builder: Callable[[Path], Any],
    read_version: Callable[[Path], Any],
) -> Path:
    """The root folder ``cache_dir`` of the generated dataset ``name`` (default ``~/.cache/vision_tx/{name}``), built by
    ``builder(out_dir)`` once.

    ``read_version(root)`` reads the version a built root was stamped with; a root that lacks it or
    holds another ``version`` is rebuilt. The data is built in a temporary folder and renamed into
    place, so processes that start together (DDP) never see a half-written dataset.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else Path.home() / ".cache" / "vision_tx" / name

    def is_current() -> bool:
        try:
            return read_version(root) == version
        except (OSError, ValueError, KeyError):
            return False

    if is_current():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        builder(tmp / "data")
        if root.exists() and not is_current():  # an older version: move it aside first
            stale = Path(tempfile.mkdtemp(prefix=f".{root.name}.stale.", dir=root.parent))
            os.replace(root, stale / "data")
        try:
            os.rename(tmp / "data", root)
        except OSError:
            if not is_current():  # not another process that got there first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for stale_dir in root.parent.glob(f".{root.name}.stale.*"):
            shutil.rmtree(stale_dir, ignore_errors=True)
    return root


def _version(root: Path) -> Any:
    return json.loads((root / "annotations" / "instances_val2017.json").read_text())["info"]["version"]


def toy_coco_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The toy dataset's root folder ``cache_dir``, generated on first use (default ``~/.cache/vision_tx/toy_coco``)."""
    return cached_build(cache_dir, "toy_coco", TOY_VERSION, make_toy_coco, _version)
