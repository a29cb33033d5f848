"""A built-in toy panoptic dataset in the COCO panoptic layout: shapes ("things") over sky and ground ("stuff").

Each image has a sky region above a random horizon, ground below it, and 1-3 non-overlapping
coloured shapes with a one-pixel unlabelled (id 0) outline, so the void rules of PQ are exercised.
Small enough to learn on a CPU in minutes; generated deterministically on first use and cached as
``ROOT/{train2017,val2017}/*.png``, ``ROOT/annotations/panoptic_{train2017,val2017}.json`` and
``ROOT/annotations/panoptic_{train2017,val2017}/*.png``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from scipy import ndimage

from vision_tx.data.coco_panoptic import MAX_SEGMENT_ID, write_panoptic_png
from vision_tx.data.toy import CATEGORIES as SHAPES
from vision_tx.data.toy import cached_build, shape_mask

# Bump when the drawing changes, so that old caches are regenerated.
TOY_VERSION = 1
STUFF = (
    {"id": 4, "name": "sky", "colour": (110, 170, 235)},
    {"id": 5, "name": "ground", "colour": (130, 100, 60)},
)
CATEGORIES = tuple(
    {
        "id": c["id"],
        "name": c["name"],
        "supercategory": "shape" if isthing else "scene",
        "isthing": int(isthing),
        "color": list(c["colour"]),
    }
    for isthing, group in ((True, SHAPES), (False, STUFF))
    for c in group
)


def _draw_image(
    rng: np.random.Generator, min_side: int, max_side: int
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """One image ``[H, W, 3]`` uint8, its segment ids ``[H, W]`` int64 and its segments (``id``, ``category_id``)."""
    height, width = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
    horizon = int(rng.integers(height * 3 // 10, height * 7 // 10 + 1))
    categories = [STUFF[0]["id"], STUFF[1]["id"]]
    labels = np.ones((height, width), dtype=np.int64)  # position in ``categories`` plus one
    labels[horizon:] = 2
    image = np.zeros((height, width, 3))
    image[:horizon] = STUFF[0]["colour"]
    image[horizon:] = STUFF[1]["colour"]
    image += rng.normal(0, 15, size=image.shape)
    occupied = np.zeros((height, width), dtype=bool)
    for _ in range(int(rng.integers(1, 4))):
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        for _attempt in range(20):  # shapes (with their outlines) do not touch, so each stays one segment
            size = int(rng.integers(min(height, width) // 4, min(height, width) // 2 + 1))
            top, left = int(rng.integers(0, height - size + 1)), int(rng.integers(0, width - size + 1))
            if not occupied[max(top - 1, 0) : top + size + 1, max(left - 1, 0) : left + size + 1].any():
                break
        else:
            continue
        mask = np.zeros((height, width), dtype=bool)
        mask[top : top + size, left : left + size] = shape_mask(shape["name"], size)
        occupied |= ndimage.binary_dilation(mask)
        image[mask] = np.array(shape["colour"]) + rng.normal(0, 8, size=(int(mask.sum()), 3))
        categories.append(shape["id"])
        labels[ndimage.binary_dilation(mask) & ~mask] = 0
        labels[mask] = len(categories)
    segment_ids = rng.choice(MAX_SEGMENT_ID, size=len(categories), replace=False) + 1
    ids = np.where(labels > 0, np.concatenate([[0], segment_ids])[labels], 0)
    segments = [{"id": int(i), "category_id": c} for i, c in zip(segment_ids, categories)]
    return np.clip(image, 0, 255).astype(np.uint8), ids, segments


def _segment_info(segment: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
    ys, xs = np.nonzero(ids == segment["id"])
    x1, y1, x2, y2 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
    return {**segment, "iscrowd": 0, "bbox": [x1, y1, x2 - x1, y2 - y1], "area": len(xs)}


def make_toy_coco_panoptic(
    out_dir: str | os.PathLike,
    num_train: int = 64,
    num_val: int = 16,
    min_side: int = 96,
    max_side: int = 128,
    seed: int = 0,
) -> Path:
    """Writes the toy dataset into ``out_dir`` (which must not exist yet): ``num_train`` and ``num_val`` images with
    sides from ``min_side`` to ``max_side``, drawn from ``seed``; same arguments, same bytes."""
    out_dir = Path(out_dir)
    rng = np.random.default_rng(seed)
    image_id = 0
    for split, count in (("train2017", num_train), ("val2017", num_val)):
        (out_dir / split).mkdir(parents=True)
        (out_dir / "annotations" / f"panoptic_{split}").mkdir(parents=True)
        images, annotations = [], []
        for _ in range(count):
            image_id += 1
            pixels, ids, segments = _draw_image(rng, min_side, max_side)
            file_name = f"{image_id:012d}.png"
            Image.fromarray(pixels).save(out_dir / split / file_name)
            write_panoptic_png(out_dir / "annotations" / f"panoptic_{split}" / file_name, torch.from_numpy(ids))
            images.append({"id": image_id, "file_name": file_name, "height": pixels.shape[0], "width": pixels.shape[1]})
            annotations.append(
                {
                    "image_id": image_id,
                    "file_name": file_name,
                    "segments_info": [_segment_info(s, ids) for s in segments],
                }
            )
        info = {"description": "vision_tx toy panoptic shapes", "version": TOY_VERSION, "seed": seed}
        dataset = {"info": info, "images": images, "annotations": annotations, "categories": list(CATEGORIES)}
        (out_dir / "annotations" / f"panoptic_{split}.json").write_text(json.dumps(dataset))
    return out_dir


def _version(root: Path) -> Any:
    return json.loads((root / "annotations" / "panoptic_val2017.json").read_text())["info"]["version"]


def toy_coco_panoptic_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The toy dataset's root ``cache_dir``, generated on first use (default
    ``~/.cache/vision_tx/toy_coco_panoptic``)."""
    return cached_build(cache_dir, "toy_coco_panoptic", TOY_VERSION, make_toy_coco_panoptic, _version)
