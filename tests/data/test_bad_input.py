"""Bad dataset input ends in an error naming the file, the record and the problem, or, with
``skip_invalid=True``, in a warning and the record skipped. The "Bad input" table of docs/CORRECTNESS.md lists
these tests (and the ones in test_coco.py, test_ade20k.py and test_coco_panoptic.py it names)."""

from __future__ import annotations

import ast
import json
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as F

from tests.data.test_coco import _ann, _write_dataset
from vision_tx.data.ade20k import ADE20KDataset, ADE20KFormatError
from vision_tx.data.coco import CocoDetection, CocoFormatError
from vision_tx.data.coco_panoptic import CocoPanoptic, coco_panoptic_split_paths, load_panoptic_json
from vision_tx.data.detection import CocoDetectionDataModule
from vision_tx.data.image_io import read_rgb_image
from vision_tx.data.invalid import SkippedRecordsWarning
from vision_tx.data.segmentation import SegmentationDataModule
from vision_tx.data.toy import make_toy_coco
from vision_tx.data.toy_panoptic import make_toy_coco_panoptic
from vision_tx.data.toy_segmentation import TOY_CLASSES, make_toy_segmentation

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"num_train": 3, "num_val": 2, "min_side": 32, "max_side": 48}
# torchvision's decoders are the reference for 8-bit RGB; their deprecation notice is not this test's concern.
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")


def _noise(mode: str, size: tuple[int, int] = (20, 15)) -> Image.Image:
    channels = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}[mode]
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)


def _write_png48(path: Path, rgb: np.ndarray) -> None:
    """A 16-bit-per-channel RGB PNG (which PIL cannot write), from ``[H, W, 3]`` uint16."""
    height, width, _ = rgb.shape
    rows = b"".join(b"\x00" + rgb[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    )


def _write_mode(path: Path, mode: str) -> None:
    rng = np.random.default_rng(1)
    if mode == "16-bit grayscale":
        Image.fromarray(rng.integers(0, 65536, (15, 20), dtype=np.uint16)).save(path)
    elif mode == "16-bit RGB":
        _write_png48(path, rng.integers(0, 65536, (15, 20, 3), dtype=np.uint16))
    elif mode == "palette":
        image = Image.fromarray(rng.integers(0, 256, (15, 20), dtype=np.uint8), "P")
        image.putpalette(rng.integers(0, 256, 768, dtype=np.uint8).tolist())
        image.save(path)
    elif mode == "1-bit":
        _noise("L").convert("1").save(path)
    else:
        _noise(mode).save(path)


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "palette", "1-bit", "16-bit grayscale", "16-bit RGB"])
def test_image_modes_are_read_as_8_bit_rgb(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "image.png"
    _write_mode(path, mode)
    image = read_rgb_image(path)
    # libpng through torchvision, scaled to 8 bits as torchvision does (16-bit: value >> 8; alpha dropped).
    reference = F.to_dtype(decode_image(str(path), mode=ImageReadMode.RGB), torch.uint8, scale=True)
    assert image.dtype == np.uint8 and image.shape == (15, 20, 3)
    assert torch.equal(torch.from_numpy(image).permute(2, 0, 1), reference)
    if mode == "16-bit grayscale":  # what PIL's convert("RGB") would give: values above 255 clipped to white
        assert (np.asarray(Image.open(path).convert("RGB")) == 255).mean() > 0.9 > (image == 255).mean()


def test_cmyk_jpeg_is_read_as_rgb(tmp_path: Path) -> None:
    Image.new("CMYK", (20, 15), (0, 255, 0, 0)).save(tmp_path / "cmyk.jpg")  # magenta ink only
    image = read_rgb_image(tmp_path / "cmyk.jpg")
    reference = decode_image(str(tmp_path / "cmyk.jpg"), mode=ImageReadMode.RGB)
    assert torch.equal(torch.from_numpy(image).permute(2, 0, 1), reference)
    assert image[0, 0].tolist() == [255, 0, 255]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garble(path: Path) -> None:
    path.write_bytes(b"<html>not found</html>")


def _flip_png_data(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[data.index(b"IDAT") + 8] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("name", "damage", "problem"),
    [
        ("a.jpg", _truncate, "corrupt or truncated image"),
        ("a.png", _truncate, "corrupt or truncated image"),
        ("a.png", _flip_png_data, "corrupt or truncated image"),
        ("a.jpg", _garble, "not an image file, or a format PIL cannot read"),
    ],
)
def test_unreadable_coco_image_names_file_and_image_id(tmp_path: Path, name: str, damage, problem: str) -> None:
    image_dir, ann_file = _write_dataset(tmp_path, [_ann(1, [1, 1, 5, 5])], [(name, _noise("RGB", (64, 48)))])
    damage(image_dir / name)
    dataset = CocoDetection(image_dir, ann_file)
    with pytest.raises(
        CocoFormatError, match=rf"(?s){image_dir / name}: {re.escape(problem)}.*\(image id 1 in {ann_file}\)"
    ):
        dataset[0]


def test_exif_annotated_on_stored_pixels_names_the_orientation(tmp_path: Path) -> None:
    image_dir, ann_file = _write_dataset(tmp_path, [], [("phone.jpg", _noise("RGB", (40, 30)))])
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned 90 degrees: 40 high, 30 wide
    _noise("RGB", (40, 30)).save(image_dir / "phone.jpg", exif=exif)
    with pytest.raises(CocoFormatError) as err:
        CocoDetection(image_dir, ann_file)[0]
    assert f"{image_dir / 'phone.jpg'}: the image is (40, 30) (h, w) after EXIF orientation" in str(err.value)
    assert "says (30, 40) for image id 1 (the file is stored 30x40 (h x w) with EXIF orientation 6" in str(err.value)


def test_skip_invalid_leaves_out_coco_images_with_bad_records(tmp_path: Path) -> None:
    names = ["good.png", "negative.png", "category.png", "outside.png", "missing.png"]
    anns = [
        _ann(1, [1, 1, 5, 5], image_id=1),
        _ann(2, [1, 1, -3, 4], image_id=2),
        _ann(3, [1, 1, 3, 4], 3, image_id=3),
        _ann(4, [1, 1, 10, 35], image_id=4),
        _ann(5, [1, 1, 3, 3], image_id=5),
        _ann(6, [1, 1, 3, 3], image_id=99),
    ]
    image_dir, ann_file = _write_dataset(tmp_path, anns, [(n, Image.new("RGB", (40, 30))) for n in names])
    (image_dir / "missing.png").unlink()
    with pytest.raises(CocoFormatError, match=r"missing\.png: image file not found"):
        CocoDetection(image_dir, ann_file)
    with pytest.warns(SkippedRecordsWarning) as caught:
        dataset = CocoDetection(image_dir, ann_file, skip_invalid=True)
    messages = [str(w.message) for w in caught]
    assert any(
        m.startswith(f"{ann_file}: skipped 4 of 5 images with invalid data (skip_invalid=True):\n") for m in messages
    )
    assert any("annotation id 2 (image negative.png): bbox [1, 1, -3, 4] has a negative size" in m for m in messages)
    assert any(
        f"{ann_file}: skipped 1 of 6 annotations" in m and "image_id 99 is not in 'images'" in m for m in messages
    )
    assert len(dataset) == 1
    _, target = dataset[0]
    assert target["image_id"] == 1 and target["boxes"].tolist() == [[1, 1, 6, 6]]


def test_skip_invalid_replaces_an_unreadable_coco_image(tmp_path: Path) -> None:
    images = [(f"{i}.jpg", _noise("RGB", (64, 48))) for i in range(3)]
    image_dir, ann_file = _write_dataset(tmp_path, [], images)
    _truncate(image_dir / "1.jpg")
    dataset = CocoDetection(image_dir, ann_file, skip_invalid=True)
    with pytest.warns(
        SkippedRecordsWarning,
        match=rf"{image_dir / '1.jpg'}: corrupt or truncated image .* item 1 skipped "
        r"\(skip_invalid=True\) and replaced .* \(1 skipped so far",
    ):
        _, target = dataset[1]
    assert target["image_id"] == 3 and len(dataset) == 3
    _, again = dataset[1]  # known bad: replaced without a second warning
    assert again["image_id"] == 3


@pytest.fixture()
def ade_root(tmp_path: Path) -> Path:
    return make_toy_segmentation(tmp_path / "ade", **SMALL)


def test_ade20k_unreadable_image_or_label_names_the_file(ade_root: Path) -> None:
    dataset = ADE20KDataset(ade_root, "training", class_names=TOY_CLASSES)
    _truncate(dataset.images[0])
    with pytest.raises(ADE20KFormatError, match=rf"{dataset.images[0]}: corrupt or truncated image"):
        dataset[0]
    _garble(dataset.annotations[1])
    with pytest.raises(
        ADE20KFormatError, match=rf"{dataset.annotations[1]}: unreadable annotation PNG, corrupt or truncated"
    ):
        dataset[1]


def test_skip_invalid_ade20k(ade_root: Path) -> None:
    dataset = ADE20KDataset(ade_root, "training", class_names=TOY_CLASSES)
    dataset.annotations[0].unlink()
    label = np.array(Image.open(dataset.annotations[1]))
    label[0, 0] = len(TOY_CLASSES) + 1
    Image.fromarray(label).save(dataset.annotations[1])
    with pytest.warns(
        SkippedRecordsWarning, match=rf"skipped 1 of 3 images .*\n  .*{dataset.annotations[0].name} is missing"
    ):
        dataset = ADE20KDataset(ade_root, "training", class_names=TOY_CLASSES, skip_invalid=True)
    assert len(dataset) == 2
    with pytest.warns(SkippedRecordsWarning, match=rf"{dataset.annotations[0]}: label 5 above 4.*item 0 skipped"):
        image, _ = dataset[0]
    assert torch.equal(image, dataset[1][0])


@pytest.fixture()
def panoptic_paths(tmp_path: Path) -> tuple[Path, Path, Path]:
    return coco_panoptic_split_paths(make_toy_coco_panoptic(tmp_path / "panoptic", **SMALL), "train2017")


def test_panoptic_malformed_json_names_the_line(panoptic_paths: tuple[Path, Path, Path]) -> None:
    ann_file = panoptic_paths[1]
    ann_file.write_text('{"images": [],\n  "annotations": [,]}')
    with pytest.raises(CocoFormatError, match=rf"{ann_file}: not valid JSON: Expecting value at line 2 column 19"):
        load_panoptic_json(ann_file)


def test_panoptic_unreadable_image_names_the_file(panoptic_paths: tuple[Path, Path, Path]) -> None:
    dataset = CocoPanoptic(*panoptic_paths)
    path = panoptic_paths[0] / dataset.file_names[0]
    _flip_png_data(path)
    with pytest.raises(
        CocoFormatError, match=rf"{path}: corrupt or truncated image .*\(image id {dataset.image_ids[0]} in"
    ):
        dataset[0]


def test_skip_invalid_panoptic(panoptic_paths: tuple[Path, Path, Path]) -> None:
    image_dir, ann_file, png_dir = panoptic_paths
    raw = json.loads(ann_file.read_text())
    raw["annotations"][0]["segments_info"][0]["category_id"] = 77
    del raw["annotations"][1]["segments_info"][0]  # its pixels keep an id that segments_info no longer lists
    ann_file.write_text(json.dumps(raw))
    with pytest.raises(CocoFormatError, match=r"segment id \d+ of .*: unknown category id 77"):
        CocoPanoptic(*panoptic_paths)
    with pytest.warns(SkippedRecordsWarning, match=r"(?s)skipped 1 of 3 images .*unknown category id 77"):
        dataset = CocoPanoptic(*panoptic_paths, skip_invalid=True)
    assert len(dataset) == 2
    with pytest.warns(
        SkippedRecordsWarning, match=r"\.png: segment id\(s\) \[\d+\] are not in its segments_info .*item 0 skipped"
    ):
        _, target = dataset[0]
    assert target["image_id"] == dataset.image_ids[1]


def test_datamodules_pass_skip_invalid_on(tmp_path: Path) -> None:
    coco_root = make_toy_coco(tmp_path / "coco", **SMALL)
    next((coco_root / "train2017").iterdir()).unlink()
    datamodule = CocoDetectionDataModule(root=str(coco_root), skip_invalid=True, num_workers=0)
    with pytest.warns(
        SkippedRecordsWarning, match=r"(?s)instances_train2017\.json: skipped 1 of 3 images .*image file not found"
    ):
        datamodule.setup("fit")
    assert len(datamodule.train_dataset) == 2
    ade_root = make_toy_segmentation(tmp_path / "ade", **SMALL)
    next((ade_root / "ADEChallengeData2016/annotations/validation").iterdir()).unlink()
    datamodule = SegmentationDataModule(root=str(ade_root), skip_invalid=True, num_workers=0)
    with pytest.warns(SkippedRecordsWarning, match=r"validation: skipped 1 of 2 images"):
        datamodule.setup("validate")
    assert len(datamodule.val_set) == 1


def _docs_table(title: str) -> list[str]:
    section = (ROOT / "docs/CORRECTNESS.md").read_text().split(f"# {title}\n", 1)[1].split("\n# ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| input")]


def test_bad_input_table_names_existing_tests() -> None:
    rows = _docs_table("Bad input")
    assert len(rows) >= 20
    defined: dict[str, set[str]] = {}
    for row in rows:
        references = re.findall(r"`(tests/[\w/]+\.py)::(\w+)", row)
        assert references, f"docs/CORRECTNESS.md 'Bad input' row names no test: {row}"
        for path, name in references:
            if path not in defined:
                tree = ast.parse((ROOT / path).read_text())
                defined[path] = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            assert name in defined[path], (
                f"docs/CORRECTNESS.md 'Bad input' row names {path}::{name}, which does not exist"
            )
