"""``tools/predict.py``: sources (images, folders, globs, videos), batched prediction, tiled inference and the files
written, through the real command line on a trained checkpoint.

The tiling tests run :func:`predict_pictures` with ``BlobDetector``, a deterministic stand-in for a detector that
resizes its input and so misses objects too small at that size: what tiling adds (cutting, shifting back, merging)
is tested with boxes known to the pixel, which a briefly trained model could not give. The model's own path
(transform, batch, post-processing) is tested on the session's DETR checkpoint.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import ndimage

from tests.conftest import require_reference
from tests.lightning.test_detection import SMALL
from tests.lightning.tools import run_tool_in_process
from vision_tx.lightning.cli import SUBCOMMANDS, main
from vision_tx.lightning.inference import load_trained, read_rgb_image
from vision_tx.lightning.predict import (
    ModuleDetector,
    Picture,
    merge_windows,
    picture_count,
    predict_pictures,
    read_pictures,
    read_video_frames,
    resolve_classes,
    source_files,
    tile_windows,
)


class BlobDetector:
    """The stand-in detector: each image is resized (area averaging) so that its longer side is ``input_side``, as a
    detector's input transform does; its bright pixels are grouped into connected blobs, and a blob at least
    ``min_side`` pixels high and wide at that size is found: its box scaled back to the image, score 0.9, label 1.
    At even coordinates and a scale of 1/2 the boxes come back exact."""

    def __init__(self, input_side: int = 64, min_side: int = 3) -> None:
        self.input_side, self.min_side = input_side, min_side

    def __call__(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        found = []
        for image in images:
            height, width = image.shape[-2:]
            scale = self.input_side / max(height, width)
            size = (round(height * scale), round(width * scale))
            small = F.interpolate(image[None].float(), size=size, mode="area")[0].mean(0) > 127
            blobs = ndimage.find_objects(ndimage.label(small.numpy())[0])
            boxes = [
                [x.start, y.start, x.stop, y.stop]
                for y, x in blobs
                if y.stop - y.start >= self.min_side and x.stop - x.start >= self.min_side
            ]
            boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
            boxes *= torch.tensor([width / size[1], height / size[0]] * 2)
            found.append(
                {
                    "boxes": boxes,
                    "scores": torch.full((len(boxes),), 0.9),
                    "labels": torch.ones(len(boxes), dtype=torch.int64),
                }
            )
        return found


def canvas(boxes: list[list[int]], side: int = 512) -> Picture:
    """A black ``side`` x ``side`` picture with a white rectangle at each of ``boxes`` (xyxy)."""
    image = torch.zeros(3, side, side, dtype=torch.uint8)
    for x0, y0, x1, y1 in boxes:
        image[:, y0:y1, x0:x1] = 255
    return Picture(1, "canvas.png", None, "canvas", image)


# On a 512 canvas, tiles of 128 sharing 0.25 start every 96 pixels (0, 96, 192, 288, 384).
SMALL_OBJECTS = [
    [
        88,
        20,
        102,
        34,
    ],  # across the side x=96 of the second column: whole in the first, cut (6 pixels wide) in the second
    [100, 300, 112, 312],  # whole in four tiles: columns 0 and 1, rows 2 and 3
    [250, 150, 262, 162],  # in one tile
    [400, 450, 412, 462],  # in the last row (moved back to end at the edge), whole in its last two tiles
]


def test_small_objects_are_missed_whole_and_found_tiled_once_each() -> None:
    picture = canvas(SMALL_OBJECTS)
    ((_, whole),) = predict_pictures(BlobDetector(), [picture])
    assert len(whole["boxes"]) == 0  # 12-14 pixels at 1/8: under 3 pixels
    ((_, tiled),) = predict_pictures(BlobDetector(), [picture], batch_size=5, tile=128, overlap=0.25)
    assert sorted(tiled["boxes"].tolist()) == sorted([float(v) for v in box] for box in SMALL_OBJECTS)
    assert tiled["scores"].tolist() == [pytest.approx(0.9)] * 4 and tiled["labels"].tolist() == [1] * 4


def test_an_object_larger_than_the_overlap_comes_from_the_whole_image() -> None:
    picture = canvas([[160, 160, 400, 400]])  # cut in every tile that sees it
    ((_, merged),) = predict_pictures(BlobDetector(), [picture], tile=128, overlap=0.25)
    assert merged["boxes"].tolist() == [[160.0, 160.0, 400.0, 400.0]]  # 1/8 of the image: exact at multiples of 8
    ((_, tiles_only),) = predict_pictures(BlobDetector(), [picture], tile=128, overlap=0.25, whole_image=False)
    assert len(tiles_only["boxes"]) == 0


def test_tile_windows_cover_the_image_from_the_top_left() -> None:
    assert tile_windows(100, 160, 100, 0.4) == [(0, 0, 100, 100), (60, 0, 160, 100), (0, 0, 160, 100)]
    assert tile_windows(100, 160, 100, 0.4, whole_image=False) == [(0, 0, 100, 100), (60, 0, 160, 100)]
    assert tile_windows(250, 200, 100, 0.0) == [(x, y, x + 100, y + 100) for y in (0, 100, 150) for x in (0, 100)] + [
        (0, 0, 200, 250)
    ]
    assert tile_windows(50, 80, 100, 0.25) == [(0, 0, 80, 50)]  # the one window is the whole image


def test_merging_shifts_back_drops_cut_boxes_and_keeps_one_box_per_object() -> None:
    windows = [(0, 0, 100, 100), (60, 0, 160, 100)]  # an image 100 high and 160 wide; the windows share x 60..100
    first = {  # in the first window's pixels
        "boxes": torch.tensor([[70.0, 10, 90, 30], [90, 50, 100, 70], [70, 10, 90, 30]]),  # the second cut at x=100
        "scores": torch.tensor([0.8, 0.95, 0.6]),
        "labels": torch.tensor([1, 1, 2]),
    }
    second = {  # in the second window's pixels: the first object again, and the cut one whole
        "boxes": torch.tensor([[10.0, 10, 30, 30], [30, 50, 50, 70], [90, 0, 100, 20]]),
        "scores": torch.tensor([0.7, 0.5, 0.4]),
        "labels": torch.tensor([1, 1, 1]),  # the third at the image's edge: kept
    }
    merged = merge_windows([first, second], windows, 100, 160)
    assert merged["boxes"].tolist() == [[70, 10, 90, 30], [70, 10, 90, 30], [90, 50, 110, 70], [150, 0, 160, 20]]
    assert merged["scores"].tolist() == pytest.approx([0.8, 0.6, 0.5, 0.4])
    assert merged["labels"].tolist() == [1, 2, 1, 1]  # one class does not suppress another's box


def test_batches_hold_the_windows_of_several_pictures_in_order() -> None:
    seen = []

    def detector(images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        seen.append([tuple(image.shape[-2:]) for image in images])
        return BlobDetector()(images)

    pictures = [canvas([[8, 8, 40, 40]], side=64), canvas([[100, 300, 112, 312]]), canvas([], side=64)]
    results = list(predict_pictures(detector, pictures, batch_size=4, tile=128))
    assert seen == [
        [(64, 64)] + [(128, 128)] * 3,
        [(128, 128)] * 4,
        [(128, 128)] * 4,
        [(128, 128)] * 4,
        [(128, 128)] * 4,
        [(128, 128)] * 4,
        [(128, 128), (128, 128), (512, 512), (64, 64)],
    ]
    assert [picture for picture, _ in results] == pictures
    assert [found["boxes"].tolist() for _, found in results] == [[[8, 8, 40, 40]], [[100, 300, 112, 312]], []]


def test_score_threshold_and_classes_filter_the_detections() -> None:
    def detector(images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return [
            {
                "boxes": torch.tensor([[0.0, 0, 4, 4], [1, 1, 5, 5], [2, 2, 6, 6]]),
                "scores": torch.tensor([0.9, 0.3, 0.8]),
                "labels": torch.tensor([1, 2, 3]),
            }
            for _ in images
        ]

    ((_, found),) = predict_pictures(detector, [canvas([], side=8)], score_threshold=0.5, classes=[1, 2])
    assert found["labels"].tolist() == [1] and found["boxes"].tolist() == [[0, 0, 4, 4]]


def test_classes_are_given_by_name_or_id() -> None:
    names = {1: "circle", 2: "square", 3: "triangle"}
    assert resolve_classes(["triangle", "1"], names) == [3, 1]
    with pytest.raises(
        SystemExit, match=r"--classes: no class 'hexagon' in the model's categories \(1 circle, 2 square, 3 triangle\)"
    ):
        resolve_classes(["hexagon"], names)
    with pytest.raises(SystemExit, match="no class '7'"):
        resolve_classes(["7"], names)


def test_sources_are_a_file_a_sorted_folder_or_a_glob(tmp_path: Path) -> None:
    for name in ("b.png", "a.jpg", "c.mp4", "notes.txt"):
        (tmp_path / name).touch()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.png").touch()
    assert source_files(str(tmp_path)) == [tmp_path / "a.jpg", tmp_path / "b.png", tmp_path / "c.mp4"]
    assert source_files(str(tmp_path / "*.png")) == [tmp_path / "b.png"]
    assert source_files(str(tmp_path / "**" / "*.png")) == [tmp_path / "b.png", tmp_path / "sub" / "d.png"]
    assert source_files(str(tmp_path / "notes.txt")) == [tmp_path / "notes.txt"]  # a file named is read as an image
    with pytest.raises(SystemExit, match=f"{tmp_path / 'missing.png'}: no such file or folder"):
        source_files(str(tmp_path / "missing.png"))
    with pytest.raises(SystemExit, match=r"\*\.gif: the pattern matches no image or video file"):
        source_files(str(tmp_path / "*.gif"))
    with pytest.raises(SystemExit, match=f"{tmp_path / 'sub' / 'empty'}: no image or video file in the folder"):
        (tmp_path / "sub" / "empty").mkdir()
        source_files(str(tmp_path / "sub" / "empty"))


def test_pictures_are_numbered_in_file_order_and_named_uniquely(tmp_path: Path) -> None:
    from PIL import Image

    for folder, value in (("one", 10), ("two", 20)):
        (tmp_path / folder).mkdir()
        Image.fromarray(np.full((6, 8, 3), value, dtype=np.uint8)).save(tmp_path / folder / "x.png")
    Image.fromarray(np.full((6, 8, 3), 30, dtype=np.uint8)).save(tmp_path / "one" / "y.png")
    pictures = list(read_pictures(source_files(str(tmp_path / "*" / "*.png"))))
    assert [(p.image_id, p.name, p.frame) for p in pictures] == [(1, "x_1", None), (2, "y", None), (3, "x_3", None)]
    assert [int(p.image[0, 0, 0]) for p in pictures] == [10, 30, 20] and pictures[0].image.shape == (3, 6, 8)
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(SystemExit, match=f"{tmp_path / 'bad.png'}: cannot be read as an image"):
        list(read_pictures([tmp_path / "bad.png"]))


@pytest.fixture(scope="module")
def av() -> ModuleType:
    return require_reference("av")


def write_video(av: ModuleType, path: Path, frames: list[np.ndarray], rate: int = 5) -> Path:
    """Writes ``frames`` (``[H,W,3]`` uint8 RGB, even sides) into an MPEG-4 video at ``path``."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return path


def test_video_frames_are_read_with_their_index(av: ModuleType, tmp_path: Path) -> None:
    levels = [20, 60, 100, 140, 180]
    video = write_video(av, tmp_path / "clip.mp4", [np.full((48, 64, 3), level, dtype=np.uint8) for level in levels])
    frames = list(read_video_frames(video, frame_step=2))
    assert [index for index, _ in frames] == [0, 2, 4]
    assert all(frame.shape == (3, 48, 64) and frame.dtype == torch.uint8 for _, frame in frames)
    assert [float(frame.float().mean()) for _, frame in frames] == [
        pytest.approx(level, abs=4) for level in levels[::2]
    ]
    assert picture_count([video, tmp_path / "x.png"], frame_step=2) == 4
    pictures = list(read_pictures([video], frame_step=2))
    assert [(p.image_id, p.frame, p.name, p.file_name) for p in pictures] == [
        (1, 0, "clip_000000", str(video)),
        (2, 2, "clip_000002", str(video)),
        (3, 4, "clip_000004", str(video)),
    ]


def test_a_bad_video_or_no_pyav_is_one_line(av: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00" * 64)
    with pytest.raises(SystemExit, match=f"error: {broken}: cannot be read as a video"):
        list(read_video_frames(broken))
    monkeypatch.setitem(sys.modules, "av", None)  # import av raises ImportError
    with pytest.raises(SystemExit, match=f"error: {broken}: reading a video needs PyAV: pip install av"):
        list(read_video_frames(broken))


def test_vision_tx_predict_is_the_tool(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert SUBCOMMANDS["predict"] == "vision_tx.lightning.predict:predict_main"
    with pytest.raises(SystemExit, match="0"):
        main(["predict", "--help"])
    assert "--source SOURCE" in capsys.readouterr().out
    # Bad options and sources stop before the model loads (the checkpoint named here does not exist).
    given = ["predict", "--config", "rtdetr_convnext_toy", "--ckpt", str(tmp_path / "none.ckpt")]
    with pytest.raises(SystemExit, match=f"error: {tmp_path / 'missing'}: no such file or folder"):
        main([*given, "--source", str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="2"):
        main([*given, "--source", str(tmp_path), "--tile", "256", "--overlap", "1"])
    assert "--overlap in [0, 1), got 256 and 1.0" in capsys.readouterr().err


def test_the_module_detector_batches_as_one_image_at_a_time(detr_checkpoint: Path, detr_toy_cache: Path) -> None:
    module, datamodule = load_trained([*SMALL, "--data.toy_cache_dir", str(detr_toy_cache)], detr_checkpoint)
    image = read_rgb_image(next(detr_toy_cache.rglob("val2017/*.png")))
    outputs, _ = module.predict_image(image, datamodule)
    expected = module.model.postprocess(outputs, torch.tensor([image.shape[-2:]]))[0]
    one, (twice, _) = ModuleDetector(module, datamodule)([image]), ModuleDetector(module, datamodule)([image, image])
    for key in ("boxes", "scores", "labels"):
        torch.testing.assert_close(one[0][key], expected[key])
        torch.testing.assert_close(twice[key], expected[key])


def test_predict_tool_writes_results_index_per_image_json_and_pictures(
    av: ModuleType,
    detr_checkpoint: Path,
    detr_toy_cache: Path,
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    toy_images = sorted(detr_toy_cache.rglob("val2017/*.png"))[:3]
    for name, image in zip(("a.png", "b.png"), toy_images):
        shutil.copy(image, source / name)
    frame = read_rgb_image(toy_images[2]).permute(1, 2, 0).numpy()
    frame = frame[: frame.shape[0] // 2 * 2, : frame.shape[1] // 2 * 2]
    write_video(av, source / "c.mp4", [frame] * 3)
    out = tmp_path / "out"
    result = run_tool_in_process(
        "predict.py",
        *SMALL,
        "--data.toy_cache_dir",
        str(detr_toy_cache),
        "--ckpt",
        str(detr_checkpoint),
        "--source",
        str(source / "*"),
        "--out",
        str(out),
        "--batch-size",
        "2",
        "--score-threshold",
        "0",
        "--device",
        "cpu",
        cwd=tmp_path,
    )
    assert "5 images (score >= 0)" in result.stdout

    images = json.loads((out / "images.json").read_text())
    sizes = [read_rgb_image(source / name).shape[-2:] for name in ("a.png", "b.png")] + [frame.shape[:2]] * 3
    assert images == [
        {
            "id": i,
            "file_name": str(source / file),
            "frame": frame_index,
            "height": size[0],
            "width": size[1],
            "detections": f"detections/{name}.json",
            "picture": f"pictures/{name}.png",
        }
        for i, (file, frame_index, name, size) in enumerate(
            zip(
                ["a.png", "b.png", "c.mp4", "c.mp4", "c.mp4"],
                [None, None, 0, 1, 2],
                ["a", "b", "c_000000", "c_000001", "c_000002"],
                sizes,
            ),
            1,
        )
    ]
    results = json.loads((out / "results.json").read_text())
    assert len(results) == 5 * 5  # every query of the 5-query DETR at score threshold 0
    names = {1: "circle", 2: "square", 3: "triangle"}
    for entry in images:
        mine = [r for r in results if r["image_id"] == entry["id"]]
        assert len(mine) == 5 and all(set(r) == {"image_id", "category_id", "bbox", "score"} for r in mine)
        for r in mine:
            x, y, w, h = r["bbox"]
            assert r["category_id"] in range(4) and 0 <= r["score"] <= 1  # the model's classes (4: ids 0-3)
            assert -1e-3 <= x and -1e-3 <= y and w >= 0 and h >= 0
            assert x + w <= entry["width"] + 1e-3 and y + h <= entry["height"] + 1e-3
        per_image = json.loads((out / entry["detections"]).read_text())
        assert per_image["image"] == entry
        assert per_image["detections"] == [{**r, "category_name": names.get(r["category_id"])} for r in mine]
        assert read_rgb_image(out / entry["picture"]).shape == (3, entry["height"], entry["width"])
