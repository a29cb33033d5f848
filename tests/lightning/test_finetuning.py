"""Fine-tuning from an official checkpoint on data of another number of classes: ``--model.weights``
(DETR, DINO) and ``--model.pretrained`` (UperNet, classifiers) load every tensor but those with a row
per class, which keep the new model's own initialisation, and the log names them on one line.

The checkpoints are the official key layouts of ``tests/fixtures/official_keys`` (written from the
official model definitions) filled with random values; the class-dependent keys expected to be left
out are written here from the same definitions."""

from __future__ import annotations

import io
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import torch
from lightning.pytorch.trainer.states import TrainerFn

from tests.lightning.tools import CONSOLE_LOGGERS
from tests.models.test_dino_official import official_state
from tests.official_layout import random_state, read_layout
from vision_tx.lightning.classification import ClassificationModule
from vision_tx.lightning.detection import DetectionModule
from vision_tx.lightning.segmentation import SegmentationModule

NUM_CLASSES = 5


def build(module, seed: int = 0):
    """``module``'s model as ``trainer.fit`` builds it (reading its weights), from the random seed ``seed``."""
    module._trainer = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING), datamodule=None, world_size=1)
    torch.manual_seed(seed)
    module.configure_model()
    return module.model


def save(state: dict[str, torch.Tensor], path: Path, wrapper: str = "model") -> str:
    torch.save({wrapper: {k: v.float() if v.is_floating_point() else v for k, v in state.items()}}, path)
    return str(path)


def finetune(make_module, checkpoint: str, skipped: list[str]) -> tuple[str, dict]:
    """Builds the model twice from one seed, without and with ``checkpoint``: checks that exactly
    ``skipped`` kept their initial values and that the log names them on one line; returns the log
    and the fine-tuned state."""
    fresh = {k: v.clone() for k, v in build(make_module(None)).state_dict().items()}
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    loggers = [logging.getLogger(name) for name in CONSOLE_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        tuned = build(make_module(checkpoint)).state_dict()
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    log = stream.getvalue()
    lines = [line for line in log.splitlines() if "of another number of classes" in line]
    assert len(lines) == 1
    count, _, names = lines[0].partition("left at the model's initialisation (")[2].partition("): ")
    assert int(count) == len(skipped) and sorted(names.split(", ")) == sorted(skipped)
    assert "missing in the checkpoint" not in log
    for key in skipped:
        assert torch.equal(tuned[key], fresh[key]), key
    return log, tuned


def test_detr_weights_of_another_class_count(tmp_path: Path) -> None:
    official = random_state(read_layout("detr-r50-e632da11"))
    assert official["class_embed.weight"].shape == (92, 256)  # COCO's 91 ids and no-object
    checkpoint = save(official, tmp_path / "detr.pth")
    _, tuned = finetune(
        lambda weights: DetectionModule(backbone="resnet50", detector="detr", num_classes=NUM_CLASSES, weights=weights),
        checkpoint,
        ["class_embed.weight", "class_embed.bias"],
    )
    assert tuned["class_embed.weight"].shape == (NUM_CLASSES + 1, 256)
    for key in (
        "query_embed.weight",
        "bbox_embed.layers.2.bias",
        "transformer.decoder.norm.weight",
        "input_proj.weight",
    ):
        torch.testing.assert_close(tuned[key], official[key].float(), rtol=0, atol=0)


def test_dino_weights_of_another_class_count(tmp_path: Path) -> None:
    official = official_state("dino_4scale_r50")
    assert official["label_enc.weight"].shape == (92, 256) and official["class_embed.0.bias"].shape == (91,)
    checkpoint = save(official, tmp_path / "dino.pth")
    # Six decoder layers' heads and the encoder proposals' (class_embed.6), and the denoising label book.
    skipped = [f"class_embed.{i}.{p}" for i in range(6) for p in ("weight", "bias")]
    skipped += ["class_embed.6.weight", "class_embed.6.bias", "denoising.label_embed.weight"]
    _, tuned = finetune(
        lambda weights: DetectionModule(backbone="resnet50", detector="dino", num_classes=NUM_CLASSES, weights=weights),
        checkpoint,
        skipped,
    )
    prior = -math.log((1 - 0.01) / 0.01)  # DINO's own initialisation: every class at probability 0.01
    assert torch.equal(tuned["class_embed.3.bias"], torch.full((NUM_CLASSES,), prior))
    for key, official_key in (
        ("query_embed.weight", "transformer.tgt_embed.weight"),
        ("neck.level_embed", "transformer.level_embed"),
        ("bbox_embed.6.layers.2.bias", "transformer.enc_out_bbox_embed.layers.2.bias"),
    ):
        torch.testing.assert_close(tuned[key], official[official_key].float(), rtol=0, atol=0)


def mmseg_upernet_heads(
    in_channels: list[int], num_classes: int, channels: int = 512, aux_channels: int = 256
) -> dict[str, tuple[int, ...]]:
    """mmsegmentation's ``UPerHead`` (pool scales 1, 2, 3, 6) and ``FCNHead`` (one conv, input 2, no
    concatenation) keys: ``ConvModule``s of a bias-free ``conv`` and a ``bn``, and the ``conv_seg`` classifier."""

    def conv_module(name: str, out: int, inp: int, kernel: int) -> dict[str, tuple[int, ...]]:
        norm = {f"{name}.bn.{p}": (out,) for p in ("weight", "bias", "running_mean", "running_var")}
        return {f"{name}.conv.weight": (out, inp, kernel, kernel), **norm, f"{name}.bn.num_batches_tracked": ()}

    layout: dict[str, tuple[int, ...]] = {}
    for i in range(4):
        layout |= conv_module(f"decode_head.psp_modules.{i}.1", channels, in_channels[-1], 1)
    layout |= conv_module("decode_head.bottleneck", channels, in_channels[-1] + 4 * channels, 3)
    for i, width in enumerate(in_channels[:-1]):
        layout |= conv_module(f"decode_head.lateral_convs.{i}", channels, width, 1)
        layout |= conv_module(f"decode_head.fpn_convs.{i}", channels, channels, 3)
    layout |= conv_module("decode_head.fpn_bottleneck", channels, len(in_channels) * channels, 3)
    layout |= {
        "decode_head.conv_seg.weight": (num_classes, channels, 1, 1),
        "decode_head.conv_seg.bias": (num_classes,),
    }
    layout |= conv_module("auxiliary_head.convs.0", aux_channels, in_channels[2], 3)
    layout |= {
        "auxiliary_head.conv_seg.weight": (num_classes, aux_channels, 1, 1),
        "auxiliary_head.conv_seg.bias": (num_classes,),
    }
    return layout


def test_upernet_weights_of_another_class_count(tmp_path: Path) -> None:
    """The official Swin-B UperNet (ADE20K, 150 classes) layout: backbone and both heads load, both
    classifiers keep their initialisation."""
    layout = read_layout("upernet_swin_base_patch4_window7_512x512") | mmseg_upernet_heads([128, 256, 512, 1024], 150)
    official = random_state(layout)
    official = {k: v.long() if k.endswith("num_batches_tracked") else v for k, v in official.items()}
    checkpoint = save(official, tmp_path / "upernet.pth", wrapper="state_dict")
    skipped = [
        "decode_head.classifier.weight",
        "decode_head.classifier.bias",
        "auxiliary_head.classifier.weight",
        "auxiliary_head.classifier.bias",
    ]
    log, tuned = finetune(
        lambda weights: SegmentationModule(backbone="swin_b", num_classes=NUM_CLASSES, weights=weights),
        checkpoint,
        skipped,
    )
    assert "unused from the checkpoint" not in log
    for key in (
        "decode_head.fpn_bottleneck.conv.weight",
        "decode_head.psp_modules.3.1.bn.running_var",
        "auxiliary_head.convs.0.bn.bias",
    ):
        torch.testing.assert_close(tuned[key], official[key].float(), rtol=0, atol=0)
    torch.testing.assert_close(
        tuned["backbone.stages.3.blocks.1.mlp.fc2.bias"],
        official["backbone.layers.3.blocks.1.mlp.fc2.bias"].float(),
        rtol=0,
        atol=0,
    )


def test_classifier_pretrained_of_another_class_count(tmp_path: Path) -> None:
    official = random_state(read_layout("swin_tiny_patch4_window7_224"))
    assert official["head.weight"].shape == (1000, 768)
    checkpoint = save(official, tmp_path / "swin_t.pth")
    _, tuned = finetune(
        lambda pretrained: ClassificationModule(backbone="swin_t", num_classes=NUM_CLASSES, pretrained=pretrained),
        checkpoint,
        ["head.weight", "head.bias"],
    )
    torch.testing.assert_close(tuned["stages.3.out_norm.weight"], official["norm.weight"].float(), rtol=0, atol=0)
    torch.testing.assert_close(tuned["stem.norm.bias"], official["patch_embed.norm.bias"].float(), rtol=0, atol=0)
