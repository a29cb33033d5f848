"""YOLO (Ultralytics) and Pascal VOC detection layouts, read as COCO datasets and written from them.

Each layout is converted into a COCO instances dict (``images``, ``annotations``, ``categories``) that the COCO
dataset, its checks and the pycocotools evaluation read unchanged; :func:`write_yolo_layout` and
:func:`write_voc_layout` write one split of a COCO set in either layout, so that a copy reads back as the same
images in the same order with the same boxes and labels (and trains the same model).

YOLO: ``data.yaml`` with ``path`` (the dataset folder; relative: to the yaml's folder; absent: the yaml's folder),
``train``, ``val`` (and ``test``), each a folder of images (searched recursively, ordered by path), a ``.txt``
list of image paths (relative: to the list's folder) or a list of these, and ``names`` (a list, or
``{index: name}``). An image's labels are at its path with the last ``images`` folder replaced by ``labels``
and the suffix by ``.txt`` (Ultralytics' rule): one row ``class cx cy w h`` per object, fractions of the
image's width and height (after its EXIF orientation) in [0, 1]. An image without a label file has no objects.
Class ``k`` is category id ``k + 1`` (COCO's ids start at 1: a copy of a COCO set with ids 1..K keeps them, and
with them the model's class count, largest id + 1); ``bbox`` is ``((cx - w/2) W, (cy - h/2) H, w W, h H)``.

VOC: ``Annotations/ID.xml``, ``JPEGImages/`` and ``ImageSets/Main/SPLIT.txt`` (one ID a line). The image of an
annotation is ``JPEGImages/`` + its ``<filename>`` (``ID.jpg`` where it has none). Class names: ``labels.txt``
beside ``Annotations/`` when present, one name a line, line ``k`` (from 1) being category id ``k`` (a blank line
leaves its id unused); otherwise the names found in the training split's annotations, sorted, as ids 1..K.
VOC's corners count pixels from 1 and include the last one: ``bbox = (xmin - 1, ymin - 1, xmax - xmin + 1,
ymax - ymin + 1)``. A ``difficult`` object is a COCO crowd region (``iscrowd=1``): left out of the training
targets, and a detection on it counts neither as a hit nor as a false positive, as in VOC's own evaluation.

Both: the images of a split are numbered from 1 in their order; ``area`` is the box's (a COCO set whose
``area`` holds mask areas scores its small/medium/large ranges otherwise); a COCO crowd region has no YOLO row.
A malformed row or object, a class not in the names, a box far outside its image (more than the COCO reader's
tolerance) or a missing image is an error naming the file, the row or object and the problem; with
``skip_invalid`` such an image is left out instead, with one warning, as the COCO reader does.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from PIL import Image
from torchvision.datasets import VOCDetection

from vision_tx.data.coco import far_outside, read_coco_json
from vision_tx.data.image_io import exif_orientation
from vision_tx.data.invalid import InvalidDataError, warn_skipped

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp")
# The COCO defaults of the datamodule's split names read as the YOLO and VOC ones where the layout has no such split.
SPLIT_NAMES = {"train2017": "train", "val2017": "val"}

CocoDict = dict[str, Any]


class LayoutFormatError(InvalidDataError):
    """A YOLO or VOC dataset that cannot be read: the message names the file, the row or object and the problem."""


def image_size(path: Path) -> tuple[int, int]:
    """``(height, width)`` of the image at ``path`` after its EXIF orientation, from its header."""
    try:
        with Image.open(path) as image:
            width, height = image.size
            if exif_orientation(image) in (5, 6, 7, 8):
                width, height = height, width
    except FileNotFoundError as err:
        raise LayoutFormatError(f"{path}: image file not found") from err
    except (OSError, SyntaxError, ValueError) as err:
        raise LayoutFormatError(f"{path}: not an image file, or a format PIL cannot read ({err})") from err
    return height, width


def _split_name(split: str, present: Any) -> str:
    return split if split in present else SPLIT_NAMES.get(split, split)


def _number(value: float) -> str:
    """``value`` as text that reads back to the same float (an integer without its ``.0``)."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def _gather(images: list[tuple[Any, ...]], read: Any, source: str, skip_invalid: bool) -> list[tuple[Any, ...]]:
    """``read(*image)`` for each image: its COCO image size and annotations, or an error; with ``skip_invalid``
    the images whose ``read`` fails are left out with one warning naming ``source``."""
    kept, problems = [], []
    for image in images:
        try:
            kept.append(read(*image))
        except LayoutFormatError as err:
            if not skip_invalid:
                raise
            problems.append(str(err))
    if problems:
        warn_skipped(source, problems, len(images), "images")
    return kept


def _coco_dict(images: list[tuple[str, tuple[int, int], list[dict[str, Any]]]], categories: dict[int, str]) -> CocoDict:
    """A COCO dict of ``(file_name, (height, width), annotations)``: images numbered from 1, annotations from 1."""
    coco: CocoDict = {
        "images": [],
        "annotations": [],
        "categories": [{"id": i, "name": n} for i, n in sorted(categories.items())],
    }
    for image_id, (file_name, (height, width), image_annotations) in enumerate(images, 1):
        coco["images"].append({"id": image_id, "file_name": file_name, "height": height, "width": width})
        for ann in image_annotations:
            w, h = ann["bbox"][2:]
            coco["annotations"].append({"id": len(coco["annotations"]) + 1, "image_id": image_id, "area": w * h, **ann})
    return coco


def _coco_split(coco_json: str | os.PathLike) -> tuple[dict[str, Any], dict[int, list[dict[str, Any]]]]:
    """A COCO file's content and its annotations by image id."""
    dataset = read_coco_json(coco_json)
    by_image: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ann in dataset["annotations"]:
        by_image[ann["image_id"]].append(ann)
    return dataset, by_image


def _copy_image(source: Path, target: Path, image: dict[str, Any]) -> None:
    """Copies ``source`` to ``target`` after checking its size against the COCO ``image`` entry."""
    size = image_size(source)
    if size != (image["height"], image["width"]):
        raise LayoutFormatError(
            f"{source}: the image is {size} (h, w), its annotation says "
            f"({image['height']}, {image['width']}) for image id {image['id']}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def _check_unique(key: Path | str, taken: set[Any], source: Path) -> None:
    """Two images of a written split may not share a label or annotation file: ``key`` is this one's."""
    if key in taken:
        raise LayoutFormatError(
            f"{source}: a second image whose labels would go to {key} (they go by the file name's stem)"
        )
    taken.add(key)


# ------------------------------------------------------------------------------------------------------------- YOLO


class YoloLayout:
    """A YOLO detection dataset described by its ``data.yaml`` (the layout: this module's docstring)."""

    def __init__(self, data_yaml: str | os.PathLike):
        self.data_yaml = Path(data_yaml)
        try:
            config = yaml.safe_load(self.data_yaml.read_text())
        except (OSError, yaml.YAMLError) as err:
            raise LayoutFormatError(f"{self.data_yaml}: cannot be read as YAML ({err})") from err
        if not isinstance(config, dict) or "names" not in config or "train" not in config:
            raise LayoutFormatError(f"{self.data_yaml}: a YOLO data.yaml needs 'train' and 'names' (and 'val')")
        base = Path(str(config.get("path") or "."))
        self.base = Path(os.path.normpath(base if base.is_absolute() else self.data_yaml.parent / base))
        self.config = config
        self.names = self._names(config["names"])

    def _names(self, names: Any) -> dict[int, str]:
        if isinstance(names, list):
            names = dict(enumerate(names))
        try:
            classes = {int(k): str(v) for k, v in names.items()} if isinstance(names, dict) else None
        except (TypeError, ValueError):
            classes = None
        if not classes or min(classes) < 0:
            raise LayoutFormatError(
                f"{self.data_yaml}: 'names' must be a list of class names or {{index: name}} "
                f"with indices from 0, got {names!r}"
            )
        return classes

    @property
    def categories(self) -> dict[int, str]:
        """COCO category id -> name: class ``k`` is id ``k + 1``."""
        return {k + 1: name for k, name in self.names.items()}

    @property
    def names_source(self) -> str:
        """Where the category names come from, and how (for messages about a label)."""
        return f"{self.data_yaml} (YOLO class k read as category id k + 1)"

    @property
    def description(self) -> str:
        return f"a YOLO layout ({self.data_yaml}: {len(self.names)} classes, YOLO class k read as category id k + 1)"

    def image_paths(self, split: str) -> list[tuple[Path, str]]:
        """The images of ``split`` in order, each with where it was listed (for a missing file's message)."""
        key = _split_name(split, self.config)
        if not self.config.get(key):
            raise LayoutFormatError(f"{self.data_yaml}: no '{key}' images (keys: {list(self.config)})")
        entries = self.config[key] if isinstance(self.config[key], list) else [self.config[key]]
        images: list[tuple[Path, str]] = []
        for entry in entries:
            path = Path(str(entry))
            path = path if path.is_absolute() else self.base / path
            if path.is_dir():
                found = sorted((str(p), p) for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
                images += [(p, f"in {path}") for _, p in found]
            elif path.is_file():
                lines = path.read_text().splitlines()
                images += [
                    (
                        Path(line.strip()) if Path(line.strip()).is_absolute() else path.parent / line.strip(),
                        f"line {number} of {path}",
                    )
                    for number, line in enumerate(lines, 1)
                    if line.strip()
                ]
            else:
                raise LayoutFormatError(
                    f"{self.data_yaml}: '{key}' names {path}, which is neither a folder nor an image list"
                )
        return images

    def coco_dataset(self, split: str, skip_invalid: bool = False) -> tuple[Path, CocoDict]:
        """``split`` as ``(image folder, COCO dict)``, its file names relative to that folder (the dataset's)."""
        paths = self.image_paths(split)
        missing_labels: list[Path] = []

        def read(path: Path, listed: str) -> tuple[str, tuple[int, int], list[dict[str, Any]]]:
            if not path.is_file():
                raise LayoutFormatError(f"{path}: image file not found ({listed})")
            size = image_size(path)
            label = yolo_label_path(path)
            if not label.is_file():
                missing_labels.append(label)
                annotations = []
            else:
                annotations = self.read_labels(label, *size)
            name = os.path.relpath(path, self.base) if path.is_relative_to(self.base) else str(path)
            return name, size, annotations

        images = _gather(paths, read, f"{self.data_yaml} ({split})", skip_invalid)
        if missing_labels:
            logger.info(
                "%s (%s): %d of %d images have no label file (%s, ...): no objects on them",
                self.data_yaml,
                split,
                len(missing_labels),
                len(paths),
                missing_labels[0],
            )
        return self.base, _coco_dict(images, self.categories)

    def read_labels(self, label: Path, height: int, width: int) -> list[dict[str, Any]]:
        """The COCO annotations (``bbox`` xywh pixels, ``category_id``, ``iscrowd``) of a label file."""
        annotations = []
        for number, line in enumerate(label.read_text().splitlines(), 1):
            fields = line.split()
            if not fields:
                continue

            def error(problem: str) -> LayoutFormatError:
                return LayoutFormatError(f"{label}: row {number}: {problem} (the row: {line.strip()!r})")

            if len(fields) != 5:
                raise error(f"{len(fields)} fields, a detection row has 5: class cx cy w h")
            try:
                values = [float(v) for v in fields]
            except ValueError as err:
                raise error(f"not a number ({err})") from err
            if not values[0].is_integer() or int(values[0]) not in self.names:
                raise error(f"class {fields[0]} is not in 'names' of {self.data_yaml} (classes {sorted(self.names)})")
            cx, cy, w, h = values[1:]
            out = [name for name, v in zip(("cx", "cy", "w", "h"), values[1:]) if not 0 <= v <= 1]
            if out:
                raise error(f"{', '.join(out)} outside [0, 1]: a YOLO box is fractions of the image's width and height")
            x, y, w, h = (cx - w / 2) * width, (cy - h / 2) * height, w * width, h * height
            if far_outside(x, y, x + w, y + h, height, width):
                raise error(
                    f"the box reaches x {x:.1f} to {x + w:.1f}, y {y:.1f} to {y + h:.1f}: outside the image, "
                    f"which is {width} wide and {height} high"
                )
            annotations.append({"category_id": int(values[0]) + 1, "bbox": [x, y, w, h], "iscrowd": 0})
        return annotations


def yolo_label_path(image: Path) -> Path:
    """The label file of an ``image`` path: its last ``images`` folder replaced by ``labels``, its suffix by
    ``.txt``."""
    parts = list(image.parts)
    folders = [i for i, part in enumerate(parts[:-1]) if part == "images"]
    if folders:
        parts[folders[-1]] = "labels"
    return Path(*parts).with_suffix(".txt")


def write_yolo_layout(
    coco_json: str | os.PathLike, images_dir: str | os.PathLike, out: str | os.PathLike, split: str = "train"
) -> Path:
    """Writes the ``split`` of a COCO set (``coco_json``, images under ``images_dir``) as YOLO under ``out``:
    ``out/images/SPLIT/`` (copies), ``out/labels/SPLIT/*.txt`` and the split and its names into ``out/data.yaml``
    (created, or extended: its names must agree). Category id ``c`` is class ``c - 1`` (``names: {c - 1: name}``;
    Ultralytics itself wants the ids 1..K, names 0..K-1); crowd regions get no row; an image without objects gets an
    empty label file. Returns ``data.yaml``."""
    out = Path(out)
    dataset, by_image = _coco_split(coco_json)
    categories = {int(c["id"]): str(c["name"]) for c in dataset["categories"]}
    if min(categories) < 1:
        raise LayoutFormatError(
            f"{coco_json}: category id {min(categories)} has no YOLO class (class k is category id k + 1)"
        )
    data_yaml = out / "data.yaml"
    config = yaml.safe_load(data_yaml.read_text()) if data_yaml.is_file() else {"path": ".", "names": {}}
    names = {c - 1: name for c, name in sorted(categories.items())}
    if config["names"] and config["names"] != names:
        raise LayoutFormatError(f"{data_yaml}: names {config['names']} differ from the categories of {coco_json}")
    taken: set[Path] = set()
    for image in dataset["images"]:
        source, target = Path(images_dir) / image["file_name"], out / "images" / split / image["file_name"]
        label = yolo_label_path(target)
        _check_unique(label, taken, source)
        _copy_image(source, target, image)
        rows = []
        for ann in by_image[image["id"]]:
            if ann.get("iscrowd", 0):
                continue
            x, y, w, h = (float(v) for v in ann["bbox"])
            box = ((x + w / 2) / image["width"], (y + h / 2) / image["height"], w / image["width"], h / image["height"])
            rows.append(" ".join([str(ann["category_id"] - 1), *map(_number, box)]) + "\n")
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text("".join(rows))
    config.update({split: f"images/{split}", "names": names})
    data_yaml.write_text(yaml.safe_dump(config, sort_keys=False))
    return data_yaml


# -------------------------------------------------------------------------------------------------------------- VOC


class VocLayout:
    """A Pascal VOC detection dataset under ``root`` (the layout: this module's docstring); the class names of
    ``labels.txt``, or of the annotations of ``train_split``."""

    def __init__(self, root: str | os.PathLike, train_split: str = "train"):
        self.root = Path(root)
        self.labels_file = self.root / "labels.txt"
        self.train_split = train_split

    @staticmethod
    def found_at(root: Path) -> bool:
        return (root / "Annotations").is_dir() and (root / "ImageSets" / "Main").is_dir()

    @property
    def names_source(self) -> str:
        """Where the category names come from, and how (for messages about a label)."""
        if self.labels_file.is_file():
            return f"{self.labels_file} (line k: category id k)"
        return (
            f"{self.root / 'Annotations'} (the names in the '{self.train_split}' annotations, sorted, as ids 1..K; "
            f"no {self.labels_file.name})"
        )

    @property
    def description(self) -> str:
        return (
            f"a Pascal VOC layout ({self.root}/Annotations: difficult objects as crowd regions; "
            f"classes from {self.names_source})"
        )

    def ids(self, split: str) -> tuple[Path, list[str]]:
        """The image set file of ``split`` and its ids, in order."""
        image_sets = self.root / "ImageSets" / "Main"
        path = image_sets / f"{_split_name(split, {p.stem for p in image_sets.glob('*.txt')})}.txt"
        if not path.is_file():
            raise LayoutFormatError(
                f"{path}: image set not found (a VOC split is ImageSets/Main/SPLIT.txt, one image id a line)"
            )
        return path, [line.split()[0] for line in path.read_text().splitlines() if line.strip()]

    def read_xml(self, image_id: str, listed: str) -> tuple[Path, dict[str, Any]]:
        """The annotation file of ``image_id`` and its content as torchvision's ``parse_voc_xml`` gives it."""
        xml = self.root / "Annotations" / f"{image_id}.xml"
        try:
            content = VOCDetection.parse_voc_xml(ET.parse(xml).getroot())
        except FileNotFoundError as err:
            raise LayoutFormatError(f"{xml}: annotation file not found ({listed})") from err
        except ET.ParseError as err:
            raise LayoutFormatError(f"{xml}: not valid XML ({err})") from err
        if not isinstance(content.get("annotation"), dict):
            raise LayoutFormatError(f"{xml}: not a VOC annotation (no <annotation> element with children)")
        return xml, content["annotation"]

    @functools.cached_property
    def categories(self) -> dict[int, str]:
        """COCO category id -> name (``labels.txt``, or the training annotations' names sorted)."""
        if self.labels_file.is_file():
            lines = [line.strip() for line in self.labels_file.read_text().splitlines()]
            names = {i: name for i, name in enumerate(lines, 1) if name}
            if len(set(names.values())) != len(names):
                raise LayoutFormatError(f"{self.labels_file}: a class name appears twice")
            return names
        image_set, ids = self.ids(self.train_split)
        found = set()
        for number, image_id in enumerate(ids, 1):
            _, annotation = self.read_xml(image_id, f"line {number} of {image_set}")
            found.update(str(obj.get("name", "")).strip() for obj in _objects(annotation) if isinstance(obj, dict))
        return {i: name for i, name in enumerate(sorted(found - {""}), 1)}

    def coco_dataset(self, split: str, skip_invalid: bool = False) -> tuple[Path, CocoDict]:
        """``split`` as ``(JPEGImages folder, COCO dict)``."""
        image_set, ids = self.ids(split)
        image_dir = self.root / "JPEGImages"
        category_of = {name: i for i, name in self.categories.items()}

        def read(number: int, image_id: str) -> tuple[str, tuple[int, int], list[dict[str, Any]]]:
            listed = f"line {number} of {image_set}"
            xml, annotation = self.read_xml(image_id, listed)
            file_name = str(annotation.get("filename") or f"{image_id}.jpg")
            if not (image_dir / file_name).is_file():
                raise LayoutFormatError(f"{image_dir / file_name}: image file not found (the image of {xml}, {listed})")
            size = annotation.get("size") if isinstance(annotation.get("size"), dict) else {}
            try:
                height, width = int(float(size["height"])), int(float(size["width"]))
            except (KeyError, TypeError, ValueError):
                height, width = 0, 0
            if height <= 0 or width <= 0:  # no <size>: the image's own
                height, width = image_size(image_dir / file_name)
            return (
                file_name,
                (height, width),
                [
                    self.read_object(xml, index, obj, category_of, height, width)
                    for index, obj in enumerate(_objects(annotation), 1)
                ],
            )

        images = _gather(list(enumerate(ids, 1)), read, image_set, skip_invalid)
        return image_dir, _coco_dict(images, self.categories)

    def read_object(
        self, xml: Path, index: int, obj: Any, category_of: dict[str, int], height: int, width: int
    ) -> dict[str, Any]:
        """The COCO annotation of the ``index``-th ``<object>`` of ``xml``."""

        def error(problem: str) -> LayoutFormatError:
            return LayoutFormatError(f"{xml}: object {index}: {problem}")

        box = obj.get("bndbox") if isinstance(obj, dict) else None
        if not isinstance(box, dict) or "name" not in obj:
            raise error("needs a <name> and a <bndbox>")
        try:
            xmin, ymin, xmax, ymax = (float(box[key]) for key in ("xmin", "ymin", "xmax", "ymax"))
        except (KeyError, TypeError, ValueError) as err:
            raise error(f"<bndbox> needs numbers xmin, ymin, xmax, ymax, got {box}") from err
        name = str(obj["name"]).strip()
        if name not in category_of:
            raise error(f"class {name!r} is not one of the classes {sorted(category_of)} (from {self.names_source})")
        x, y, w, h = xmin - 1, ymin - 1, xmax - xmin + 1, ymax - ymin + 1
        if not all(map(_finite, (x, y, w, h))) or w < 0 or h < 0:
            raise error(
                f"box xmin {box['xmin']}, ymin {box['ymin']}, xmax {box['xmax']}, ymax {box['ymax']} "
                "has a negative size"
            )
        if far_outside(x, y, x + w, y + h, height, width):
            raise error(
                f"box xmin {box['xmin']}, ymin {box['ymin']}, xmax {box['xmax']}, ymax {box['ymax']} lies outside "
                f"the image, which is {width} wide and {height} high"
            )
        difficult = str(obj.get("difficult", "0")).strip() not in ("", "0")
        return {"category_id": category_of[name], "bbox": [x, y, w, h], "iscrowd": int(difficult)}


def _objects(annotation: dict[str, Any]) -> list[Any]:
    objects = annotation.get("object", [])
    return objects if isinstance(objects, list) else [objects]


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")


def write_voc_layout(
    coco_json: str | os.PathLike, images_dir: str | os.PathLike, out: str | os.PathLike, split: str = "train"
) -> Path:
    """Writes the ``split`` of a COCO set (``coco_json``, images under ``images_dir``) as Pascal VOC:
    ``out/JPEGImages/`` (copies), ``out/Annotations/ID.xml`` (ID: the file name's stem),
    ``out/ImageSets/Main/SPLIT.txt`` in the COCO file's order and ``out/labels.txt`` (line k: category id k; created,
    or checked to agree). Crowd regions become difficult objects. Returns ``out``."""
    out = Path(out)
    dataset, by_image = _coco_split(coco_json)
    categories = {int(c["id"]): str(c["name"]) for c in dataset["categories"]}
    if min(categories) < 1:
        raise LayoutFormatError(
            f"{coco_json}: category id {min(categories)} has no line in labels.txt (line k is id k)"
        )
    labels = "".join(f"{categories.get(i, '')}\n" for i in range(1, max(categories) + 1))
    labels_file = out / "labels.txt"
    if labels_file.is_file() and labels_file.read_text() != labels:
        raise LayoutFormatError(f"{labels_file}: its classes differ from the categories of {coco_json}")
    (out / "Annotations").mkdir(parents=True, exist_ok=True)
    labels_file.write_text(labels)
    image_sets = out / "ImageSets" / "Main"
    taken = {line for other in image_sets.glob("*.txt") if other.stem != split for line in other.read_text().split()}
    ids = []
    for image in dataset["images"]:
        source, name = Path(images_dir) / image["file_name"], Path(image["file_name"]).name
        _check_unique(Path(name).stem, taken, source)
        _copy_image(source, out / "JPEGImages" / name, image)
        ids.append(Path(name).stem)
        root = ET.Element("annotation")
        ET.SubElement(root, "filename").text = name
        size = ET.SubElement(root, "size")
        for key, value in (("width", image["width"]), ("height", image["height"]), ("depth", 3)):
            ET.SubElement(size, key).text = str(value)
        for ann in by_image[image["id"]]:
            x, y, w, h = (float(v) for v in ann["bbox"])
            obj = ET.SubElement(root, "object")
            ET.SubElement(obj, "name").text = categories[ann["category_id"]]
            ET.SubElement(obj, "difficult").text = str(int(bool(ann.get("iscrowd", 0))))
            box = ET.SubElement(obj, "bndbox")
            for key, value in (("xmin", x + 1), ("ymin", y + 1), ("xmax", x + w), ("ymax", y + h)):
                ET.SubElement(box, key).text = _number(value)
        ET.indent(root)
        ET.ElementTree(root).write(out / "Annotations" / f"{Path(name).stem}.xml", encoding="utf-8")
    image_sets.mkdir(parents=True, exist_ok=True)
    (image_sets / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
    return out


# ----------------------------------------------------------------------------------------------------------- finding


def find_layout(root: str | os.PathLike, train_split: str) -> YoloLayout | VocLayout | None:
    """The layout at ``root``: YOLO where ``root`` is a ``.yaml`` file or holds ``data.yaml``, VOC where it holds
    ``Annotations/`` and ``ImageSets/Main/`` (its class names read from ``train_split`` when it has no
    ``labels.txt``), None (COCO) otherwise."""
    root = Path(root)
    if root.suffix in (".yaml", ".yml") and root.is_file():
        return YoloLayout(root)
    if (root / "data.yaml").is_file():
        return YoloLayout(root / "data.yaml")
    if VocLayout.found_at(root):
        return VocLayout(root, train_split)
    return None
