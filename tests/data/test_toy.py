"""The built-in toy dataset: deterministic, valid COCO, boxes tight around the drawn shapes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

from vision_tx.data.coco import CocoDetection, coco_split_paths
from vision_tx.data.toy import CATEGORIES, TOY_VERSION, make_toy_coco, toy_coco_root


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_generation_is_deterministic(tmp_path: Path) -> None:
    first = _files(make_toy_coco(tmp_path / "a", num_train=4, num_val=2))
    second = _files(make_toy_coco(tmp_path / "b", num_train=4, num_val=2))
    assert first == second and len(first) == 4 + 2 + 2
    assert first != _files(make_toy_coco(tmp_path / "c", num_train=4, num_val=2, seed=1))


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # inside pycocotools' decode
def test_boxes_are_tight_around_the_drawn_shapes(tmp_path: Path) -> None:
    root = make_toy_coco(tmp_path / "toy", num_train=6, num_val=2)
    colours = {c["id"]: np.array(c["colour"]) for c in CATEGORIES}
    for split in ("train2017", "val2017"):
        coco = COCO(str(root / "annotations" / f"instances_{split}.json"))
        assert sorted(coco.getCatIds()) == [1, 2, 3]
        for image_id in coco.getImgIds():
            info = coco.imgs[image_id]
            pixels = np.asarray(Image.open(root / split / info["file_name"])).astype(float)
            assert pixels.shape == (info["height"], info["width"], 3)
            anns = coco.imgToAnns[image_id]
            assert 1 <= len(anns) <= 3
            for ann in anns:
                # Pixels of the shape's colour (its noise is small; backgrounds are grey) ...
                near = np.linalg.norm(pixels - colours[ann["category_id"]], axis=-1) < 45
                ys, xs = np.nonzero(near & coco.annToMask(ann).astype(bool))
                x, y, w, h = ann["bbox"]
                # ... span exactly the box, and none of that colour lies in a ring around it.
                assert [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1] == [x, y, x + w, y + h]
                ring = np.zeros_like(near)
                ring[max(y - 3, 0) : y + h + 3, max(x - 3, 0) : x + w + 3] = True
                ring[y : y + h, x : x + w] = False
                assert not near[ring].any()
                assert ann["area"] == coco.annToMask(ann).sum() and ann["iscrowd"] == 0
                assert min(w, h) >= min(info["height"], info["width"]) // 4  # large objects


def test_cache_is_built_once_and_refreshed_when_stale(tmp_path: Path) -> None:
    root = toy_coco_root(tmp_path / "cache")
    image_dir, ann_file = coco_split_paths(root, "train2017")
    assert len(CocoDetection(image_dir, ann_file)) == 64
    assert len(CocoDetection(*coco_split_paths(root, "val2017"))) == 16
    stamp = ann_file.stat().st_mtime_ns
    assert toy_coco_root(tmp_path / "cache") == root and ann_file.stat().st_mtime_ns == stamp

    val_file = root / "annotations" / "instances_val2017.json"
    stale = json.loads(val_file.read_text())
    stale["info"]["version"] = TOY_VERSION - 1
    val_file.write_text(json.dumps(stale))
    toy_coco_root(tmp_path / "cache")
    assert json.loads(val_file.read_text())["info"]["version"] == TOY_VERSION
    assert [p.name for p in (tmp_path).iterdir()] == ["cache"]  # no temporary folders left behind
