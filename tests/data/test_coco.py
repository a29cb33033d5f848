"""The COCO detection dataset on real COCO images (coco128) and on small broken datasets."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors

from vision_tx.data.coco import CocoDetection, CocoFormatError, coco_split_paths, far_outside


@pytest.fixture(scope="module")
def coco128(shared_data: Path) -> tuple[Path, Path]:
    return coco_split_paths(shared_data / "coco128", "train2017")


def test_coco128_targets_match_the_json(coco128: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    image_dir, ann_file = coco128
    with caplog.at_level(logging.INFO, logger="vision_tx.data.coco"):
        dataset = CocoDetection(image_dir, ann_file)
    raw = json.loads(ann_file.read_text())
    crowd = sum(a["iscrowd"] for a in raw["annotations"])
    assert crowd == 10
    assert f"{crowd} crowd boxes" in caplog.text and caplog.text.count("crowd boxes") == 1
    assert len(dataset) == len(raw["images"]) == 128

    expected: dict[int, list[dict]] = {img["id"]: [] for img in raw["images"]}
    for ann in raw["annotations"]:
        if not ann["iscrowd"]:
            expected[ann["image_id"]].append(ann)
    total = 0
    for index in range(len(dataset)):
        image, target = dataset[index]
        info = raw["images"][index]
        assert isinstance(image, tv_tensors.Image) and image.dtype == torch.uint8 and image.shape[0] == 3
        assert target["image_id"] == info["id"]
        assert target["orig_size"].tolist() == target["size"].tolist() == [info["height"], info["width"]]
        assert list(image.shape[-2:]) == [info["height"], info["width"]]
        boxes = target["boxes"]
        assert isinstance(boxes, tv_tensors.BoundingBoxes) and boxes.canvas_size == (info["height"], info["width"])
        anns = expected[info["id"]]
        xyxy = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)], dtype=torch.float32)
        torch.testing.assert_close(boxes.as_subclass(torch.Tensor), xyxy.reshape(-1, 4), rtol=0, atol=0)
        assert target["labels"].tolist() == [a["category_id"] for a in anns]
        assert target["labels"].dtype == torch.int64
        total += len(anns)
    assert total == len(raw["annotations"]) - crowd


def _write_dataset(
    tmp_path: Path, annotations: list[dict], images: list[tuple[str, Image.Image]] | None = None
) -> tuple[Path, Path]:
    """A one-split dataset ``tmp_path/{img,ann.json}``; default: one 40x30 RGB image with id 1."""
    images = images if images is not None else [("a.png", Image.new("RGB", (40, 30), (10, 20, 30)))]
    image_dir = tmp_path / "img"
    image_dir.mkdir(exist_ok=True)
    entries = []
    for image_id, (name, pil) in enumerate(images, start=1):
        pil.save(image_dir / name)
        entries.append({"id": image_id, "file_name": name, "width": pil.width, "height": pil.height})
    ann_file = tmp_path / "ann.json"
    categories = [{"id": 1, "name": "thing"}, {"id": 7, "name": "other"}]
    ann_file.write_text(json.dumps({"images": entries, "annotations": annotations, "categories": categories}))
    return image_dir, ann_file


def _ann(ann_id: int, bbox: list[float], category_id: int = 1, iscrowd: int = 0, image_id: int = 1) -> dict:
    return {
        "id": ann_id,
        "image_id": image_id,
        "bbox": bbox,
        "category_id": category_id,
        "iscrowd": iscrowd,
        "area": 1.0,
    }


def test_clipping_degenerate_and_empty_images(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    images = [("a.png", Image.new("RGB", (40, 30))), ("b.png", Image.new("RGB", (20, 20)))]
    anns = [
        _ann(1, [-1, 2, 10, 10]),
        _ann(2, [5, 5, 0, 4]),
        _ann(3, [30, 20, 11, 10.5], 7),
        _ann(4, [0, 0, 5, 5], iscrowd=1),
    ]
    with caplog.at_level(logging.INFO, logger="vision_tx.data.coco"):
        dataset = CocoDetection(*_write_dataset(tmp_path, anns, images))
    assert "1 crowd boxes, 1 degenerate (zero width or height); 2 clipped to the image" in caplog.text
    _, target = dataset[0]
    assert target["boxes"].tolist() == [[0, 2, 9, 12], [30, 20, 40, 30]]
    assert target["labels"].tolist() == [1, 7]
    _, empty = dataset[1]  # no annotations: a valid image with empty targets
    assert empty["boxes"].shape == (0, 4) and empty["labels"].shape == (0,)


def test_modes_are_converted_to_rgb_and_exif_applied(tmp_path: Path) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: the stored pixels must be turned 90 degrees clockwise to show
    stored = Image.new("RGB", (40, 30), (0, 0, 255))
    stored.paste((255, 0, 0), (0, 0, 10, 30))  # a red band on the stored image's left
    images = [
        ("gray.png", Image.new("L", (40, 30), 100)),
        ("rgba.png", Image.new("RGBA", (40, 30), (1, 2, 3, 4))),
        ("cmyk.jpg", Image.new("CMYK", (40, 30), (0, 0, 0, 0))),
        ("exif.png", Image.new("RGB", (30, 40))),
    ]
    image_dir, ann_file = _write_dataset(tmp_path, [], images)
    stored.save(image_dir / "exif.png", exif=exif)
    dataset = CocoDetection(image_dir, ann_file)
    gray, rgba, cmyk, rotated = (dataset[i][0] for i in range(4))
    assert gray.shape == (3, 30, 40) and (gray == 100).all()
    assert rgba.shape == (3, 30, 40) and rgba[:, 0, 0].tolist() == [1, 2, 3]
    assert cmyk.shape == (3, 30, 40) and (cmyk == 255).all()
    assert rotated.shape == (3, 40, 30)
    assert rotated[:, 0, 29].tolist() == [255, 0, 0] and rotated[:, 39, 0].tolist() == [0, 0, 255]  # band now on top


def _photo(width: int, height: int, box: tuple[int, int, int, int]) -> Image.Image:
    """A black picture with the white rectangle ``box`` (x0, y0, x1, y1)."""
    picture = Image.new("RGB", (width, height))
    picture.paste((255, 255, 255), box)
    return picture


@pytest.mark.parametrize(
    ("min_side", "expected"),
    [(70, (75, 100)), (75, (75, 100)), (76, (150, 200)), (150, (150, 200)), (151, (300, 400)), (None, (300, 400))],
)
def test_jpegs_decode_reduced_as_far_as_the_shorter_side_allows_with_their_boxes(
    tmp_path: Path, min_side: int | None, expected: tuple[int, int]
) -> None:
    box = (100, 60, 220, 180)
    images = [("photo.jpg", _photo(400, 300, box)), ("photo.png", _photo(400, 300, box))]
    anns = [_ann(1, [100, 60, 120, 120]), _ann(2, [100, 60, 120, 120], image_id=2)]
    image_dir, ann_file = _write_dataset(tmp_path, anns, images)
    (image_dir / "photo.jpg").write_bytes(_jpeg_bytes(images[0][1]))
    dataset = CocoDetection(image_dir, ann_file, decode_shorter_side=min_side)
    image, target = dataset[0]
    assert tuple(image.shape[-2:]) == tuple(target["size"].tolist()) == expected
    assert target["orig_size"].tolist() == [300, 400] and target["boxes"].canvas_size == expected
    scale = expected[1] / 400
    torch.testing.assert_close(target["boxes"].as_subclass(torch.Tensor), torch.tensor([box]) * scale)
    x0, y0, x1, y1 = (round(v * scale) for v in box)
    assert image[:, y0 + 1 : y1 - 1, x0 + 1 : x1 - 1].float().mean() > 240  # the rectangle is where its box is
    assert image[:, : y0 - 1].float().mean() < 15 and image[:, :, x1 + 1 :].float().mean() < 15
    png, png_target = dataset[1]
    assert png.shape[-2:] == (300, 400) and png_target["boxes"].tolist() == [list(map(float, box))]


def test_a_reduced_jpeg_is_turned_by_its_exif_orientation(tmp_path: Path) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 400 wide, 300 high; displayed 300 wide, 400 high
    displayed = [("a.png", Image.new("RGB", (300, 400)))]
    image_dir, ann_file = _write_dataset(tmp_path, [_ann(1, [0, 0, 300, 40])], displayed)
    (image_dir / "a.png").unlink()
    stored = _photo(400, 300, (0, 0, 40, 300))  # a band on the stored left: on top once turned
    stored.save(image_dir / "a.jpg", exif=exif, quality=95)
    ann_file.write_text(ann_file.read_text().replace("a.png", "a.jpg"))
    image, target = CocoDetection(image_dir, ann_file, decode_shorter_side=75)[0]
    assert image.shape[-2:] == (100, 75) and target["orig_size"].tolist() == [400, 300]
    assert target["boxes"].tolist() == [[0.0, 0.0, 75.0, 10.0]]
    assert image[:, :8].float().mean() > 240 and image[:, 12:].float().mean() < 15


def _jpeg_bytes(picture: Image.Image) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def test_image_size_must_match_the_json(tmp_path: Path) -> None:
    image_dir, ann_file = _write_dataset(tmp_path, [])
    Image.new("RGB", (41, 30)).save(image_dir / "a.png")
    with pytest.raises(CocoFormatError, match=r"a\.png: the image is \(30, 41\) .* says \(30, 40\) for image id 1"):
        CocoDetection(image_dir, ann_file)[0]


def test_missing_image_file(tmp_path: Path) -> None:
    image_dir, ann_file = _write_dataset(tmp_path, [])
    (image_dir / "a.png").unlink()
    with pytest.raises(
        CocoFormatError,
        match=rf"{image_dir / 'a.png'}: image file not found \(image id 1, file_name 'a.png' in .*ann\.json\)",
    ):
        CocoDetection(image_dir, ann_file)


def test_malformed_json(tmp_path: Path) -> None:
    image_dir, ann_file = _write_dataset(tmp_path, [])
    ann_file.write_text('{"images": [],\n "annotations": [}')
    with pytest.raises(CocoFormatError, match=rf"{ann_file}: not valid JSON: .* at line 2 column 18"):
        CocoDetection(image_dir, ann_file)
    ann_file.write_text('{"images": []}')
    with pytest.raises(
        CocoFormatError,
        match=r"ann\.json: not a COCO instances file: missing top-level keys \['annotations', 'categories'\]",
    ):
        CocoDetection(image_dir, ann_file)


@pytest.mark.parametrize(
    ("ann", "problem"),
    [
        (_ann(5, [1, 1, -3, 4]), r"bbox \[1, 1, -3, 4\] has a negative size"),
        (
            _ann(5, [1, 1, 10, 35]),
            r"bbox \[1, 1, 10, 35\] \(x, y, w, h\) lies far outside the image, which is 40 wide and 30 high",
        ),
        (_ann(5, [1, 1, 3, 4], category_id=3), r"category_id 3 is not in 'categories' \(ids \[1, 7\]\)"),
        (_ann(5, [1, 1, 3, 4], image_id=9), r"image_id 9 is not in 'images'"),
        ({"id": 5, "image_id": 1, "category_id": 1}, r"missing one of the keys"),
    ],
)
def test_bad_annotation_names_file_annotation_and_image(tmp_path: Path, ann: dict, problem: str) -> None:
    image_dir, ann_file = _write_dataset(tmp_path, [_ann(4, [1, 1, 3, 4]), ann])
    with pytest.raises(CocoFormatError, match=rf"{ann_file}: annotation id 5 \(image .*\): {problem}"):
        CocoDetection(image_dir, ann_file)


def test_wrong_root_layout_shows_the_expected_one(tmp_path: Path) -> None:
    (tmp_path / "train2017").mkdir()
    with pytest.raises(CocoFormatError) as err:
        coco_split_paths(tmp_path, "train2017")
    message = str(err.value)
    assert f"{tmp_path}: not a COCO detection root, missing {tmp_path}/annotations/instances_train2017.json" in message
    assert f"{tmp_path}/train2017/*.jpg\n  {tmp_path}/annotations/instances_train2017.json" in message


def test_a_box_is_far_outside_past_five_percent_of_the_side_or_two_pixels() -> None:
    """On a 100x40 (w x h) image the slack is 5 px across and 2 px down (5% of 40 is under 2): the same rule for one box
    (the YOLO and VOC readers) and for arrays of them (the COCO reader)."""
    inside = [(-4.9, 0.0, 104.9, 40.0), (0.0, -1.9, 50.0, 41.9)]
    outside = [(-5.1, 0.0, 50.0, 40.0), (0.0, 0.0, 105.1, 40.0), (0.0, -2.1, 50.0, 40.0), (0.0, 0.0, 50.0, 42.1)]
    for box, expected in [*((b, False) for b in inside), *((b, True) for b in outside)]:
        assert bool(far_outside(*box, 40, 100)) is expected, box
    boxes = np.array(inside + outside)
    assert far_outside(*boxes.T, np.full(6, 40.0), np.full(6, 100.0)).tolist() == [False, False, True, True, True, True]
