"""Fine-tuning every detector and segmentor family from its official checkpoint layout on data of another
number of classes: RT-DETR and Mask2Former built from such a checkpoint (DETR, DINO and UperNet are in
``test_finetuning.py``), a model of one class more than the checkpoint, and two training steps of each of the
five families through ``tools/train.py`` on the toy sets, whose log names on one line the tensors it left at
the model's initialisation.

The checkpoints are the official key layouts of ``tests/fixtures/official_keys`` (written from the official
model definitions) filled with random values; the class-dependent keys expected to be left out are written
here from the same definitions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.lightning.test_finetuning import NUM_CLASSES, finetune, mmseg_upernet_heads, save
from tests.lightning.tools import run_tool_in_process
from tests.models.test_dino_official import official_state
from tests.models.test_rtdetr import MapsBackbone
from tests.official_layout import random_state, read_layout
from vision_tx.backbones import load_weights
from vision_tx.lightning.detection import DetectionModule
from vision_tx.lightning.segmentation import SegmentationModule
from vision_tx.models import DINO, RTDETR
from vision_tx.models.convert import build_for_conversion, convert_checkpoint

LAYERS = 6  # the official models' decoder layers: a class head each, and one for the encoder's proposals
RTDETR_SKIPPED = [f"class_embed.{i}.{p}" for i in range(LAYERS + 1) for p in ("weight", "bias")] + [
    "denoising.label_embed.weight"
]
DINO_SKIPPED = RTDETR_SKIPPED  # the same heads and label book
DETR_SKIPPED = ["class_embed.weight", "class_embed.bias"]
MASK2FORMER_SKIPPED = ["predictor.class_embed.weight", "predictor.class_embed.bias"]
UPERNET_SKIPPED = [f"{head}.classifier.{p}" for head in ("decode_head", "auxiliary_head") for p in ("weight", "bias")]


def rtdetr_official_state() -> dict[str, torch.Tensor]:
    """lyuwenyu/RT-DETR's rtdetr_r50vd head layout (80 classes) on a torchvision ResNet-50's keys (DETR's backbone
    layout): the official PResNet-vd has no vision_tx counterpart."""
    resnet = random_state(read_layout("detr-r50-e632da11"), seed=1)
    backbone = {
        f"backbone.{k.removeprefix('backbone.0.body.')}": v
        for k, v in resnet.items()
        if k.startswith("backbone.0.body.")
    }
    return random_state(read_layout("rtdetr_r50vd_6x_coco_head")) | backbone


def upernet_official_state() -> dict[str, torch.Tensor]:
    """mmsegmentation's Swin-B UperNet (ADE20K, 150 classes)."""
    official = random_state(
        read_layout("upernet_swin_base_patch4_window7_512x512") | mmseg_upernet_heads([128, 256, 512, 1024], 150)
    )
    return {k: v.long() if k.endswith("num_batches_tracked") else v for k, v in official.items()}


def test_rtdetr_weights_of_another_class_count(tmp_path: Path) -> None:
    official = rtdetr_official_state()
    assert official["decoder.denoising_class_embed.weight"].shape == (81, 256)  # 80 classes and the padding row
    checkpoint = save(official, tmp_path / "rtdetr.pth")
    log, tuned = finetune(
        lambda weights: DetectionModule(
            backbone="resnet50", detector="rtdetr", num_classes=NUM_CLASSES, weights=weights
        ),
        checkpoint,
        RTDETR_SKIPPED,
    )
    assert "unused from the checkpoint" not in log
    assert tuned["denoising.label_embed.weight"].shape == (NUM_CLASSES, 256)
    for key, official_key in (
        ("bbox_embed.6.layers.2.bias", "decoder.enc_bbox_head.layers.2.bias"),
        ("decoder.layers.4.ffn.norm.weight", "decoder.decoder.layers.4.norm3.weight"),
        ("encoder.encoder.layers.0.linear1.weight", "encoder.encoder.0.layers.0.linear1.weight"),
        ("enc_output_norm.bias", "decoder.enc_output.1.bias"),
    ):
        torch.testing.assert_close(tuned[key], official[official_key].float(), rtol=0, atol=0)


def test_mask2former_weights_of_another_class_count(tmp_path: Path) -> None:
    official = random_state(read_layout("mask2former_swin_tiny_ade20k_semantic_160k"))
    assert official["sem_seg_head.predictor.class_embed.weight"].shape == (151, 256)  # ADE20K's 150 and no-object
    checkpoint = save(official, tmp_path / "mask2former.pth")
    log, tuned = finetune(
        lambda weights: SegmentationModule(
            backbone="swin_t", head="mask2former", num_classes=NUM_CLASSES, weights=weights
        ),
        checkpoint,
        MASK2FORMER_SKIPPED,
    )
    assert "unused from the checkpoint" not in log
    assert tuned["predictor.class_embed.weight"].shape == (NUM_CLASSES + 1, 256)
    for key, official_key in (
        ("predictor.query_feat.weight", "sem_seg_head.predictor.query_feat.weight"),
        ("pixel_decoder.mask_features.weight", "sem_seg_head.pixel_decoder.mask_features.weight"),
        ("predictor.mask_embed.layers.2.bias", "sem_seg_head.predictor.mask_embed.layers.2.bias"),
        ("backbone.stages.3.out_norm.weight", "backbone.norm3.weight"),
    ):
        torch.testing.assert_close(tuned[key], official[official_key].float(), rtol=0, atol=0)


def test_conversion_to_another_class_count_keeps_the_new_class_tensors(tmp_path: Path) -> None:
    """``tools/convert_weights.py --num-classes``: the native file holds the new model's own class tensors and the
    report names them."""
    save(random_state(read_layout("rtdetr_r50vd_6x_coco_head")), tmp_path / "rtdetr.pth")
    torch.manual_seed(0)
    report = convert_checkpoint(
        "rtdetr_resnet50", tmp_path / "rtdetr.pth", tmp_path / "native.pth", num_classes=NUM_CLASSES
    )
    assert sorted(report.other_classes_keys) == sorted(RTDETR_SKIPPED)
    torch.manual_seed(0)
    fresh = build_for_conversion("rtdetr_resnet50", num_classes=NUM_CLASSES).state_dict()
    native = torch.load(tmp_path / "native.pth", weights_only=True)["model"]
    for key in RTDETR_SKIPPED:
        assert torch.equal(native[key], fresh[key]), key


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")
@pytest.mark.parametrize("detector", ["dino", "rtdetr"])
def test_one_class_more_than_the_checkpoint_keeps_its_label_embeddings(detector: str) -> None:
    """The label book's padding row makes it one row longer than the official class count: a model of one
    class more must not read it as its own label embeddings."""
    official, model_class = (
        (official_state("dino_4scale_r50"), DINO)
        if detector == "dino"
        else (random_state(read_layout("rtdetr_r50vd_6x_coco_head")), RTDETR)
    )
    classes = len(
        official["transformer.enc_out_class_embed.bias" if detector == "dino" else "decoder.enc_score_head.bias"]
    )
    with torch.device("meta"):
        maps = [torch.empty(1, channels, 1, 1) for channels in (512, 1024, 2048)]
        model = model_class.build(MapsBackbone(maps), classes + 1)
    report = load_weights(model, official, class_keys=model_class.class_keys)
    assert sorted(report.other_classes_keys) == sorted(DINO_SKIPPED)
    assert report.missing_keys == []  # the backbone's keys (DINO's) are unused: the stand-in backbone has none


# Each family's full-size config, its task, the official checkpoint (read by --model.weights) and what it leaves.
FAMILIES = {
    "detr": ("detr_r50", "detection", lambda: random_state(read_layout("detr-r50-e632da11")), DETR_SKIPPED),
    "dino": ("dino_r50", "detection", lambda: official_state("dino_4scale_r50"), DINO_SKIPPED),
    "rtdetr": ("rtdetr_r50", "detection", rtdetr_official_state, RTDETR_SKIPPED),
    "mask2former": (
        "mask2former_swin_t_ade20k",
        "segmentation",
        lambda: random_state(read_layout("mask2former_swin_tiny_ade20k_semantic_160k")),
        MASK2FORMER_SKIPPED,
    ),
    "upernet": ("upernet_swin_b_ade20k", "segmentation", upernet_official_state, UPERNET_SKIPPED),
}
SMALL_DETECTION = [
    "--data.train_transform",
    json.dumps(
        {
            "class_path": "vision_tx.data.transforms.DetrTrainTransform",
            "init_args": {"scales": [64], "max_size": 96, "crop_scales": [64], "crop_size": [48, 64]},
        }
    ),
]
SMALL_SEGMENTATION = ["--data.crop_size", "[64, 64]", "--data.scale", "[128, 64]"]
# The backbone frozen (Adam's update of its weights would cost most of the time), images of 64 pixels.
TWO_STEPS = [
    "--model.backbone_kwargs",
    "{frozen_stages: 4}",
    "--data.batch_size",
    "2",
    "--data.num_workers",
    "0",
    "--trainer.accelerator",
    "cpu",
    "--trainer.max_steps",
    "2",
    "--trainer.limit_val_batches",
    "0",
    "--trainer.num_sanity_val_steps",
    "0",
    "--trainer.logger",
    "false",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.callbacks",
    "[]",
    "--trainer.enable_checkpointing",
    "false",
]


@pytest.fixture(scope="module")
def toy_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("toy")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_two_training_steps_from_an_official_checkpoint_of_another_class_count(
    family: str, toy_cache: Path, tmp_path: Path
) -> None:
    config, task, official, skipped = FAMILIES[family]
    checkpoint = save(official(), tmp_path / f"{family}.pth")
    small = SMALL_SEGMENTATION if task == "segmentation" else SMALL_DETECTION
    result = run_tool_in_process(
        "train.py",
        "--config",
        config,
        "--model.weights",
        checkpoint,
        *small,
        *TWO_STEPS,
        "--data.toy_cache_dir",
        str(toy_cache),
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    lines = [line for line in result.stderr.splitlines() if "of another number of classes" in line]
    assert len(lines) == 1, result.stderr[-3000:]
    count, _, names = lines[0].partition("left at the model's initialisation (")[2].partition("): ")
    assert int(count) == len(skipped) and sorted(names.split(", ")) == sorted(skipped)
    assert "missing in the checkpoint" not in result.stderr
