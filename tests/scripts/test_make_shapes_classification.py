"""scripts/make_shapes_classification.py writes an ImageFolder set of eight shape classes that vision_tx
reads, the same files for the same seed; compare_classification.py's top-k is the count by hand."""

from __future__ import annotations

import hashlib
import runpy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from vision_tx.data.imagefolder import ImageFolderDataModule

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
CLASSES = ["arrow", "cross", "diamond", "ellipse", "four_point_star", "hexagon", "star", "triangle"]


def run_script(name: str) -> dict[str, Any]:
    sys.path.insert(0, str(SCRIPTS))  # the scripts import their neighbours
    try:
        return runpy.run_path(str(SCRIPTS / name))
    finally:
        sys.path.remove(str(SCRIPTS))


def make(root: Path, seed: int) -> Path:
    script = run_script("make_shapes_classification.py")
    args = script["parser"]().parse_args(
        [str(root), "--num-train", "3", "--num-val", "2", "--size", "40", "--seed", str(seed)]
    )
    return script["make_dataset"](args)


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.jpg"))}


def test_layout_classes_and_sizes(tmp_path: Path) -> None:
    root = make(tmp_path / "set", seed=0)
    for split, count in (("train", 3), ("val", 2)):
        assert sorted(p.name for p in (root / split).iterdir()) == CLASSES
        for folder in (root / split).iterdir():
            files = sorted(folder.glob("*.jpg"))
            assert len(files) == count
            for path in files:
                image = Image.open(path)
                assert image.format == "JPEG" and image.size == (40, 40) and image.mode == "RGB"
    data = ImageFolderDataModule(root, image_size=32, num_workers=0, batch_size=4)
    data.setup("fit")
    assert list(data.class_names) == CLASSES and len(data.train_set) == 24 and len(data.val_set) == 16


def test_same_seed_same_files_other_seed_other_files(tmp_path: Path) -> None:
    first = digests(make(tmp_path / "a", seed=0))
    assert digests(make(tmp_path / "b", seed=0)) == first
    other = digests(make(tmp_path / "c", seed=1))
    assert other.keys() == first.keys() and all(other[k] != first[k] for k in first)


@pytest.mark.parametrize(
    ("name", "low", "high"), [("ellipse", 0.65, 0.85), ("triangle", 0.2, 0.55), ("four_point_star", 0.1, 0.3)]
)
def test_classes_hold_their_shape(tmp_path: Path, name: str, low: float, high: float) -> None:
    # The share of its bounding box a shape fills (median of 5: measured 0.78, 0.34, 0.15): an ellipse pi/4,
    # a triangle at most 1/2, a four-pointed star far less.
    script = run_script("make_shapes_classification.py")
    args = script["parser"]().parse_args(
        [
            str(tmp_path / "set"),
            "--num-train",
            "5",
            "--num-val",
            "0",
            "--size",
            "96",
            "--background",
            "plain",
            "--min-object",
            "0.6",
            "--seed",
            "4",
        ]
    )
    root = script["make_dataset"](args)
    fills = []
    for path in sorted((root / "train" / name).glob("*.jpg")):
        pixels = np.asarray(Image.open(path), dtype=np.float64)
        border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
        shape = np.abs(pixels - np.median(border, axis=0)).sum(-1) > 60
        ys, xs = np.nonzero(shape)
        fills.append(shape.sum() / ((np.ptp(ys) + 1) * (np.ptp(xs) + 1)))
    assert low < np.median(fills) < high, fills


def test_top_k_counts_the_labels_among_the_k_best_logits() -> None:
    script = run_script("compare_classification.py")
    logits = torch.tensor(
        [
            [0.0, 5.0, 4.0, 3.0, 2.0, 1.0, -1.0],  # label 1: top-1
            [6.0, 5.0, 4.0, 3.0, 2.0, 1.0, -1.0],  # label 5: 6th best, not in the top 5
            [1.0, 5.0, 4.0, 3.0, 2.0, 0.0, -1.0],
        ]
    )  # label 0: 5th best
    labels = torch.tensor([1, 5, 0])
    found = script["top_k"]([(logits[:2], labels[:2]), (logits[2:], labels[2:])], torch.nn.Identity())
    assert found == pytest.approx({"top1": 1 / 3, "top5": 2 / 3})
