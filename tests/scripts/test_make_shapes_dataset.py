"""scripts/make_shapes_dataset.py writes a COCO set that vision_tx reads, with tight boxes, crowds and empty images."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from vision_tx.data.coco import CocoDetection, coco_split_paths

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_shapes_dataset.py"


@pytest.fixture(scope="module")
def shapes_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    script = runpy.run_path(str(SCRIPT))
    args = script["parser"]().parse_args(
        [
            str(tmp_path_factory.mktemp("shapes") / "set"),
            "--num-train",
            "10",
            "--num-val",
            "4",
            "--min-side",
            "64",
            "--max-side",
            "96",
            "--max-objects",
            "3",
            "--empty",
            "0.3",
            "--crowd",
            "0.5",
        ]
    )
    return script["make_dataset"](args)


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # inside pycocotools' decode
def test_boxes_and_areas_are_those_of_the_masks(shapes_root: Path) -> None:
    crowds = empties = 0
    for split in ("train2017", "val2017"):
        coco = COCO(str(shapes_root / "annotations" / f"instances_{split}.json"))
        assert sorted(coco.getCatIds()) == [4, 11, 23]
        for image_id, info in coco.imgs.items():
            image = Image.open(shapes_root / split / info["file_name"])
            assert image.format == "JPEG" and image.size == (info["width"], info["height"])
            anns = coco.imgToAnns[image_id]
            empties += not anns
            for ann in anns:
                mask = mask_utils.decode(ann["segmentation"]).astype(bool)
                ys, xs = np.nonzero(mask)
                assert ann["bbox"] == [xs.min(), ys.min(), xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min()]
                assert ann["area"] == mask.sum()
                crowds += ann["iscrowd"]
    assert crowds > 0 and empties > 0


def test_vision_tx_reads_it_without_the_crowds(shapes_root: Path) -> None:
    for split in ("train2017", "val2017"):
        dataset = CocoDetection(*coco_split_paths(shapes_root, split))
        coco = COCO(str(coco_split_paths(shapes_root, split)[1]))
        for index in range(len(dataset)):
            image, target = dataset[index]
            solid = [a for a in coco.imgToAnns[target["image_id"]] if not a["iscrowd"]]
            assert image.shape[-2:] == tuple(target["orig_size"].tolist())
            assert sorted(target["labels"].tolist()) == sorted(a["category_id"] for a in solid)


@pytest.mark.parametrize("background", ["plain", "textured"])
def test_plain_backgrounds_are_one_colour_and_textured_ones_are_not(tmp_path: Path, background: str) -> None:
    script = runpy.run_path(str(SCRIPT))
    args = script["parser"]().parse_args(
        [
            str(tmp_path / "set"),
            "--num-train",
            "6",
            "--num-val",
            "0",
            "--min-side",
            "64",
            "--max-side",
            "64",
            "--empty",
            "1.0",
            "--background",
            background,
        ]
    )
    root = script["make_dataset"](args)
    spreads = []
    for path in sorted((root / "train2017").glob("*.jpg")):
        pixels = np.asarray(Image.open(path), dtype=np.float64)
        blocks = pixels.reshape(4, 16, 4, 16, 3).mean((1, 3))  # the mean colour of each 16x16 block
        spreads.append(np.ptp(blocks.reshape(16, 3), 0).max())
    # Pixel noise averages out over a block; a gradient or stripes do not.
    assert (max(spreads) < 8) if background == "plain" else (min(spreads) > 8)
