"""CocoInstances: each training box's mask, as pycocotools decodes it, in the targets or on demand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO

from vision_tx.data.coco import CocoFormatError
from vision_tx.data.coco_instances import CocoInstances
from vision_tx.data.toy import toy_coco_root


@pytest.fixture(scope="module")
def toy_train(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = toy_coco_root(str(tmp_path_factory.mktemp("toy")))
    return root / "train2017", root / "annotations" / "instances_train2017.json"


def test_masks_are_pycocotools_masks_of_the_boxes_in_order_in_the_targets_or_on_demand(
    toy_train: tuple[Path, Path],
) -> None:
    image_dir, ann_file = toy_train
    coco = COCO(str(ann_file))
    with_masks = CocoInstances(image_dir, ann_file)
    on_demand = CocoInstances(image_dir, ann_file, masks_in_targets=False)
    assert with_masks.objects_without_masks == 0
    for index in (0, 5, len(with_masks) - 1):
        image, target = with_masks[index]
        _, plain = on_demand[index]
        assert "masks" not in plain and torch.equal(plain["boxes"], target["boxes"])
        image_id = int(target["image_id"])
        annotations = sorted(coco.loadAnns(coco.getAnnIds(imgIds=image_id, iscrowd=False)), key=lambda a: a["id"])
        expected = np.stack([coco.annToMask(a).astype(bool) for a in annotations])
        assert target["masks"].shape == (len(target["boxes"]), *image.shape[-2:]) and len(annotations) == len(
            target["boxes"]
        )
        assert np.array_equal(target["masks"].numpy(), expected)
        assert torch.equal(on_demand.instance_masks(index), target["masks"])


def test_an_object_without_a_segmentation_is_counted_and_named_when_its_mask_is_decoded(
    toy_train: tuple[Path, Path], tmp_path: Path
) -> None:
    image_dir, ann_file = toy_train
    dataset = json.loads(ann_file.read_text())
    first_image = dataset["annotations"][0]["image_id"]
    del dataset["annotations"][0]["segmentation"]
    dataset["annotations"][1]["segmentation"] = []
    edited = tmp_path / "instances_train2017.json"
    edited.write_text(json.dumps(dataset))
    instances = CocoInstances(image_dir, edited, masks_in_targets=False)
    assert instances.objects_without_masks == 2
    index = int(np.flatnonzero(instances.image_ids == first_image)[0])
    assert "masks" not in instances[index][1]  # boxes alone need no segmentation
    with pytest.raises(
        CocoFormatError, match=rf"instances_train2017.json: annotation 0 of image {first_image}: segmentation"
    ):
        instances.instance_masks(index)
