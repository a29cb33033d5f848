"""A trained detector over an image, a folder, a glob pattern or a video, in batches, with tiled (sliced) inference
for large images with small objects (``tools/predict.py``, ``vision-tx predict``).

    python tools/predict.py --config rtdetr_convnext_toy --ckpt runs/.../last.ckpt --source photos/ --out predicted/
    python tools/predict.py --config rtdetr_convnext_toy --ckpt runs/.../last.ckpt --source clip.mp4 --out clip/
    python tools/predict.py --config rtdetr_convnext_toy --ckpt runs/.../last.ckpt --source "scans/*.tif" --tile 512

Writes into ``--out``: ``results.json``, the detections as a COCO results file (image ids 1, 2, ... in file order,
a video's frames one id each; the model's category ids; ``bbox`` xywh in the original image's pixels);
``images.json``, what each image id is (COCO ``images`` entries plus the video ``frame`` and the files below);
per image ``detections/NAME.json`` and, unless ``--no-save-pictures``, ``pictures/NAME.png`` with the boxes drawn.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.io import write_png
from torchvision.ops import batched_nms
from tqdm import tqdm

from vision_tx.io import write_json_atomic
from vision_tx.lightning.detection import DetectionModule
from vision_tx.lightning.inference import load_trained, read_rgb_image
from vision_tx.metrics.coco import to_results
from vision_tx.visualize import draw_detections

IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".ppm", ".tif", ".tiff", ".webp")
VIDEO_SUFFIXES = (".avi", ".m4v", ".mkv", ".mov", ".mp4", ".mpeg", ".mpg", ".webm")
# A tile's box whose side lies within this fraction of the tile's size from a side of the tile that cuts the image is
# taken to be cut there (see merge_windows).
CUT_MARGIN = 0.01

Window = tuple[int, int, int, int]
"""A window of an image: (x0, y0, x1, y1) in pixels, the far sides excluded."""
Detector = Callable[[list[Tensor]], list[dict[str, Tensor]]]
"""uint8 images ``[3,H_i,W_i]`` -> per image ``{"boxes" [K,4] xyxy in its pixels, "scores" [K], "labels" [K]
int64}``."""


@dataclass
class Picture:
    """One image to predict on: an image file's, or a frame of a video (``frame``: its index from 0)."""

    image_id: int
    file_name: str
    frame: int | None
    name: str  # the stem of the files written for it: unique among the pictures of one run
    image: Tensor  # [3,H,W] uint8 RGB


def source_files(source: str) -> list[Path]:
    """The image and video files of ``source``: a file; a folder's files with an image or video suffix (sorted, not
    recursive); or those a glob pattern matches (sorted; ``**`` recursive)."""
    path = Path(source)
    if path.is_file():
        return [path]
    suffixes = IMAGE_SUFFIXES + VIDEO_SUFFIXES
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in suffixes)
        if not files:
            raise SystemExit(f"error: {path}: no image or video file in the folder (suffixes {' '.join(suffixes)})")
        return files
    if not any(c in source for c in "*?["):
        raise SystemExit(f"error: {source}: no such file or folder")
    files = sorted(
        Path(p) for p in glob.glob(source, recursive=True) if Path(p).is_file() and Path(p).suffix.lower() in suffixes
    )
    if not files:
        raise SystemExit(f"error: {source}: the pattern matches no image or video file (suffixes {' '.join(suffixes)})")
    return files


def is_video(path: Path) -> bool:
    """Whether ``path`` is read as a video (by its suffix, one of :data:`VIDEO_SUFFIXES`)."""
    return path.suffix.lower() in VIDEO_SUFFIXES


def _pyav(path: Path) -> Any:
    try:
        import av
    except ImportError:
        raise SystemExit(f"error: {path}: reading a video needs PyAV: pip install av") from None
    return av


def video_frame_count(path: Path) -> int | None:
    """The number of frames the video at ``path`` declares, or None where its container does not say."""
    av = _pyav(path)
    try:
        with av.open(str(path)) as container:
            return (container.streams.video[0].frames or None) if container.streams.video else None
    except av.FFmpegError as err:
        raise SystemExit(f"error: {path}: cannot be read as a video ({err})") from err


def read_video_frames(path: Path, frame_step: int = 1) -> Iterator[tuple[int, Tensor]]:
    """Every ``frame_step``-th frame of the video at ``path`` from the first, decoded with PyAV: (its index, ``[3,H,W]``
    uint8 RGB)."""
    av = _pyav(path)
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise SystemExit(f"error: {path}: the file holds no video stream")
            for index, frame in enumerate(container.decode(container.streams.video[0])):
                if index % frame_step == 0:
                    yield index, torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1)
    except av.FFmpegError as err:
        raise SystemExit(f"error: {path}: cannot be read as a video ({err})") from err


def read_pictures(files: Sequence[Path], frame_step: int = 1) -> Iterator[Picture]:
    """The pictures of ``files`` in order, image ids from 1: an image file's image, each ``frame_step``-th frame of a
    video. Named by the file's stem (a video's frames ``STEM_FRAME``), the file's position added where stems repeat."""
    repeated = {stem for stem, count in Counter(file.stem for file in files).items() if count > 1}
    image_id = 0
    for position, file in enumerate(files, 1):
        stem = f"{file.stem}_{position}" if file.stem in repeated else file.stem
        frames = read_video_frames(file, frame_step) if is_video(file) else [(None, read_rgb_image(file))]
        for frame, image in frames:
            image_id += 1
            yield Picture(image_id, str(file), frame, stem if frame is None else f"{stem}_{frame:06d}", image)


def picture_count(files: Sequence[Path], frame_step: int = 1) -> int | None:
    """How many pictures :func:`read_pictures` gives for ``files`` (each video's every ``frame_step``-th frame), or None
    where a video does not declare its frame count."""
    counts = [math.ceil(n / frame_step) if (n := video_frame_count(f)) else None for f in files if is_video(f)]
    return None if None in counts else len(files) - len(counts) + sum(counts)


class ModuleDetector:
    """A trained ``DetectionModule`` as a :data:`Detector`: the images through the datamodule's validation transform,
    padded into one batch as in validation (its ``collate_fn``), the detector's own post-processing back to each
    image's pixels."""

    def __init__(self, module: Any, datamodule: Any, device: str | torch.device = "cpu") -> None:
        self.module = module.to(device).eval()
        self.datamodule = datamodule
        self.device = torch.device(device)

    def _sample(self, image: Tensor) -> tuple[Tensor, dict[str, Any]]:
        no_boxes = tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=tuple(image.shape[-2:]))
        return self.datamodule.val_transform(tv_tensors.Image(image), {"boxes": no_boxes})

    @torch.no_grad()
    def __call__(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        batch = self.datamodule.collate_fn([self._sample(image) for image in images])
        outputs = self.module(batch["images"].to(self.device), batch["pixel_mask"].to(self.device))
        sizes = torch.tensor([list(image.shape[-2:]) for image in images], device=self.device)
        detections = self.module.model.postprocess(outputs, sizes)
        return [{key: found[key].cpu() for key in ("boxes", "scores", "labels")} for found in detections]


def tile_windows(height: int, width: int, tile: int, overlap: float, whole_image: bool = True) -> list[Window]:
    """Square windows of side ``tile`` covering a ``height`` x ``width`` image, neighbours sharing ``overlap`` of
    their side (the last row and column moved back to end at the image's edge; a side shorter than ``tile`` is one
    window across), in rows from the top left; then the whole image where ``whole_image`` and no window is it."""

    def starts(length: int) -> list[int]:
        if length <= tile:
            return [0]
        return [*range(0, length - tile, max(1, round(tile * (1 - overlap)))), length - tile]

    windows = [(x, y, min(x + tile, width), min(y + tile, height)) for y in starts(height) for x in starts(width)]
    if whole_image and (0, 0, width, height) not in windows:
        windows.append((0, 0, width, height))
    return windows


def merge_windows(
    detections: Sequence[Mapping[str, Tensor]],
    windows: Sequence[Window],
    height: int,
    width: int,
    iou_threshold: float = 0.5,
) -> dict[str, Tensor]:
    """One image of ``height`` and ``width`` pixels: its ``detections`` per window (each ``{"boxes" [K,4] xyxy in the
    window's pixels, "scores" [K], "labels" [K]}``) of ``windows`` (x0, y0, x1, y1) merged into ``{"boxes" [M,4],
    "scores" [M], "labels" [M]}`` in the image's pixels, best score first.

    The boxes are shifted back into the image. A box reaching (within :data:`CUT_MARGIN` of the window's size) a
    window side inside the image is dropped: the object runs across that side, and lies whole in the neighbouring
    window where it is no larger than the overlap; larger ones come from the whole-image window, whose sides are the
    image's. Per-class NMS (``batched_nms`` at ``iou_threshold``) then keeps one box of an object seen in several
    windows.
    """
    boxes, scores, labels = [], [], []
    for found, (x0, y0, x1, y1) in zip(detections, windows, strict=True):
        shifted = found["boxes"].float() + torch.tensor([x0, y0, x0, y0], dtype=torch.float32)
        margin = CUT_MARGIN * max(x1 - x0, y1 - y0)
        near, far = torch.tensor([x0, y0]) + margin, torch.tensor([x1, y1]) - margin
        cut = ((shifted[:, :2] <= near) & torch.tensor([x0 > 0, y0 > 0])).any(1)
        cut |= ((shifted[:, 2:] >= far) & torch.tensor([x1 < width, y1 < height])).any(1)
        boxes.append(shifted[~cut])
        scores.append(found["scores"][~cut])
        labels.append(found["labels"][~cut])
    boxes, scores, labels = torch.cat(boxes), torch.cat(scores), torch.cat(labels)
    keep = batched_nms(boxes, scores.float(), labels, iou_threshold)
    return {"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]}


def _kept(found: Mapping[str, Tensor], score_threshold: float, classes: Sequence[int] | None) -> dict[str, Tensor]:
    keep = found["scores"] >= score_threshold
    if classes is not None:
        keep &= torch.isin(found["labels"], torch.tensor(list(classes), dtype=found["labels"].dtype))
    return {key: value[keep] for key, value in found.items()}


def predict_pictures(
    detector: Detector,
    pictures: Iterable[Picture],
    batch_size: int = 4,
    score_threshold: float = 0.0,
    classes: Sequence[int] | None = None,
    tile: int | None = None,
    overlap: float = 0.25,
    whole_image: bool = True,
    iou_threshold: float = 0.5,
) -> Iterator[tuple[Picture, dict[str, Tensor]]]:
    """Each of ``pictures`` with its detections (``{"boxes" [K,4] xyxy in its pixels, "scores" [K], "labels" [K]}``)
    scored at least ``score_threshold``, of ``classes`` (category ids; None: all), in order.

    ``detector`` sees ``batch_size`` images at a time: whole pictures, or with ``tile`` the windows of
    :func:`tile_windows` (``tile``, ``overlap``, ``whole_image``) of each, merged by :func:`merge_windows`
    (``iou_threshold``).
    """

    def views() -> Iterator[tuple[Picture, list[Window], int]]:
        for picture in pictures:
            height, width = picture.image.shape[-2:]
            windows = tile_windows(height, width, tile, overlap, whole_image) if tile else [(0, 0, width, height)]
            yield from ((picture, windows, index) for index in range(len(windows)))

    queue, found = views(), []
    while batch := list(itertools.islice(queue, batch_size)):
        crops = [
            picture.image[:, y0:y1, x0:x1] for picture, windows, index in batch for x0, y0, x1, y1 in [windows[index]]
        ]
        for (picture, windows, index), detections in zip(batch, detector(crops), strict=True):
            found.append(_kept(detections, score_threshold, classes))
            if index == len(windows) - 1:
                merged = (
                    merge_windows(found, windows, *picture.image.shape[-2:], iou_threshold)
                    if len(windows) > 1
                    else found[0]
                )
                found = []
                yield picture, merged


def resolve_classes(given: Sequence[str], category_names: Mapping[int, str]) -> list[int]:
    """The category ids of ``given`` names or ids of ``category_names``; an unknown one stops with the known ones."""
    ids = {name: category_id for category_id, name in category_names.items()}
    resolved = []
    for item in given:
        if item in ids:
            resolved.append(ids[item])
        elif item.isdigit() and int(item) in category_names:
            resolved.append(int(item))
        else:
            known = ", ".join(f"{category_id} {name}" for category_id, name in sorted(category_names.items()))
            raise SystemExit(f"error: --classes: no class {item!r} in the model's categories ({known})")
    return resolved


def write_predictions(
    predictions: Iterable[tuple[Picture, Mapping[str, Tensor]]],
    out: str | Path,
    category_names: Mapping[int, str],
    save_pictures: bool = True,
) -> list[dict[str, Any]]:
    """Writes the files of the module docstring for ``predictions`` (pictures and their ``{"boxes" [K,4] xyxy pixels,
    "scores" [K], "labels" [K]}``) into ``out``, naming the categories by ``category_names`` (id -> name), drawing
    the pictures when ``save_pictures``; returns the ``images.json`` entries."""
    out = Path(out)
    results: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for picture, found in predictions:
        height, width = picture.image.shape[-2:]
        entry = {
            "id": picture.image_id,
            "file_name": picture.file_name,
            "frame": picture.frame,
            "height": height,
            "width": width,
            "detections": f"detections/{picture.name}.json",
            "picture": f"pictures/{picture.name}.png" if save_pictures else None,
        }
        found_results = to_results({"image_id": picture.image_id, **found}, "bbox")
        named = [{**result, "category_name": category_names.get(result["category_id"])} for result in found_results]
        write_json_atomic({"image": entry, "detections": named}, out / entry["detections"])
        if save_pictures:
            (out / "pictures").mkdir(parents=True, exist_ok=True)
            drawn = draw_detections(picture.image, **found, category_names=category_names, score_threshold=-math.inf)
            write_png(drawn, str(out / entry["picture"]))
        results += found_results
        images.append(entry)
    write_json_atomic(results, out / "results.json")
    write_json_atomic(images, out / "images.json")
    return images


def predict_main(argv: Sequence[str] | None = None) -> None:
    """``tools/predict.py``, ``vision-tx predict``: the options below and the config's arguments, from ``argv`` (the
    command line when None)."""
    parser = argparse.ArgumentParser(
        prog="tools/predict.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every other option is the config's: --config NAME [--data.X VALUE ...] "
        "(its datamodule gives the resize and the class names).",
    )
    add, switch = parser.add_argument, argparse.BooleanOptionalAction
    add("--ckpt", required=True, help="Lightning checkpoint of a detection model")
    add("--source", required=True, help="an image, a video, a folder of them or a glob pattern (quoted)")
    add("--out", default="predictions", help="output folder (default: predictions)")
    add("--batch-size", type=int, default=4, help="images (or tiles) per forward pass (default: 4)")
    add(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda where there is one)",
    )
    add(
        "--score-threshold",
        type=float,
        help="the lowest score kept (default: the model's picture threshold; 0 for evaluation)",
    )
    add("--classes", nargs="+", help="the category names or ids kept (default: all)")
    add("--save-pictures", action=switch, default=True, help="draw the boxes into pictures/ (default: yes)")
    add("--frame-step", type=int, default=1, help="a video's every N-th frame, from the first (default: 1)")
    add("--tile", type=int, help="tiled inference: square tiles of this side in pixels")
    add(
        "--overlap", type=float, default=0.25, help="the fraction of a tile's side its neighbour shares (default: 0.25)"
    )
    add(
        "--whole-image",
        action=switch,
        default=True,
        help="with --tile, the whole image as well, for large objects (default: yes)",
    )
    add(
        "--iou-threshold",
        type=float,
        default=0.5,
        help="with --tile, the IoU above which boxes of several tiles are one object (default: 0.5)",
    )
    args, config_args = parser.parse_known_args(argv)
    if args.batch_size < 1 or args.frame_step < 1:
        parser.error("--batch-size and --frame-step must be at least 1")
    if args.tile is not None and (args.tile < 1 or not 0 <= args.overlap < 1):
        parser.error(f"--tile must be at least 1 and --overlap in [0, 1), got {args.tile} and {args.overlap}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device here")
    files = source_files(args.source)
    total = picture_count(files, args.frame_step)  # before the model loads: a video PyAV cannot read stops here
    module, datamodule = load_trained(config_args, args.ckpt)
    if not isinstance(module, DetectionModule):
        raise SystemExit(
            f"error: {args.ckpt}: a {type(module).__name__}; predict runs detection models (DetectionModule)"
        )
    names = datamodule.category_names
    threshold = module.visualize_score_threshold if args.score_threshold is None else args.score_threshold
    classes = resolve_classes(args.classes, names) if args.classes else None
    predictions = predict_pictures(
        ModuleDetector(module, datamodule, args.device),
        read_pictures(files, args.frame_step),
        args.batch_size,
        threshold,
        classes,
        args.tile,
        args.overlap,
        args.whole_image,
        args.iou_threshold,
    )
    bar = tqdm(predictions, total=total, unit="image", desc="predict")
    images = write_predictions(bar, args.out, names, args.save_pictures)
    print(
        f"{len(images)} images (score >= {threshold:g}): {Path(args.out) / 'results.json'}, images.json, detections/"
        + (", pictures/" if args.save_pictures else "")
    )
