"""A truncated JPEG met by a DataLoader worker while training ends tools/train.py with one ``error:``
line naming the file, for the COCO detection, ADE20K and COCO panoptic roots, and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from tests.lightning.test_configs import SHORT, small_args
from vision_tx.data.toy import make_toy_coco
from vision_tx.data.toy_panoptic import make_toy_coco_panoptic
from vision_tx.data.toy_segmentation import make_toy_segmentation

ROOT = Path(__file__).resolve().parents[2]
SIZES = {"num_train": 3, "num_val": 2, "min_side": 32, "max_side": 48}


def _truncated_jpeg(image: Path) -> Path:
    """Saves ``image`` as a JPEG beside it (the original removed), cut to half its bytes."""
    jpeg = image.with_suffix(".jpg")
    Image.open(image).convert("RGB").save(jpeg, quality=95)
    if image != jpeg:
        image.unlink()
    jpeg.write_bytes(jpeg.read_bytes()[: jpeg.stat().st_size // 2])
    return jpeg


def _coco_like(make: Callable[..., Path], annotations: str) -> Callable[[Path], tuple[Path, Path]]:
    def build(folder: Path) -> tuple[Path, Path]:
        root = make(folder, **SIZES)
        ann_file = root / "annotations" / annotations
        data = json.loads(ann_file.read_text())
        image = data["images"][1]
        bad = _truncated_jpeg(root / "train2017" / image["file_name"])
        image["file_name"] = bad.name
        ann_file.write_text(json.dumps(data))
        return root, bad

    return build


def _ade20k(folder: Path) -> tuple[Path, Path]:
    root = make_toy_segmentation(folder, **SIZES)
    return root, _truncated_jpeg(sorted((root / "ADEChallengeData2016/images/training").glob("*.jpg"))[1])


@pytest.mark.parametrize(
    "config, build",
    [
        ("detr_swin_toy", _coco_like(make_toy_coco, "instances_train2017.json")),
        ("upernet_swin_t_ade20k", _ade20k),
        ("detr_panoptic_swin_toy", _coco_like(make_toy_coco_panoptic, "panoptic_train2017.json")),
    ],
    ids=["coco", "ade20k", "coco_panoptic"],
)
def test_truncated_jpeg_in_a_worker_is_one_error_line(config: str, build, tmp_path: Path) -> None:
    root, bad = build(tmp_path / "root")
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "train.py"),
            "--config",
            config,
            *small_args(ROOT / "vision_tx" / "configs" / f"{config}.yaml"),
            *SHORT,
            # Every training image in the first batch, read by two worker processes.
            "--data.root",
            str(root),
            "--data.num_workers",
            "2",
            "--data.batch_size",
            "3",
            "--trainer.val_check_interval",
            "1",
            "--trainer.default_root_dir",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {bad}: corrupt or truncated image"), result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout and "DataLoader worker" not in result.stderr
