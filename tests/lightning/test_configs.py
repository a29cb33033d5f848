"""Every config in vision_tx/configs/ trains 2 steps and validates on its toy set on a CPU, as written but for the
sizes set on the command line (a small backbone, the detector's or head's toy size, small images); all in this one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vision_tx.lightning.cli import run_cli
from vision_tx.models import DETECTORS, DINO, RTDETR, SEGMENTATION_HEADS, Mask2Former, UperNetSegmentor

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(ROOT.glob("vision_tx/configs/*.yaml"))

# Backbone kwargs that shrink each family (the variant's other settings, window sizes included, stay).
SMALL_BACKBONES = {
    "swin": "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 1, 1, 1]}",
    "nat": "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 1, 1, 1]}",
    "convnext": "{depths: [1, 1, 1, 1], dims: [16, 32, 64, 128]}",
    "vit": "{embed_dim: 16, depth: 1, num_heads: 1, img_size: 32}",
    "deit": "{embed_dim: 16, depth: 1, num_heads: 1, img_size: 32}",
    "mixer": "{embed_dim: 16, depth: 1, img_size: 32}",
    "resnet": None,  # ResNet-50 has no smaller form here: its cost at 64-pixel images is small anyway
}
# Each detector's and head's official name, by class: its toy size is ``<name>_toy`` (UperNet has none).
OFFICIAL_NAMES = {build.func: name for name, build in (DETECTORS | SEGMENTATION_HEADS).items() if not build.keywords}
DEFAULT_DETECTORS = {"InstanceSegmentationModule": "mask2former"}  # the other task modules': detr
DETR_TRANSFORMS = [
    "--data.train_transform", "{class_path: vision_tx.data.transforms.DetrTrainTransform, init_args: "
                              "{scales: [64], max_size: 96, crop_scales: [64], crop_size: [48, 64]}}",
    "--data.val_transform", "{class_path: vision_tx.data.transforms.DetrValTransform, init_args: {size: 64, max_size: 96}}",
]
# Two training steps, then one validation batch, whatever the config's schedule.
SHORT = [
    "--trainer.accelerator", "cpu", "--trainer.max_steps", "2", "--trainer.max_epochs", "1",
    "--trainer.limit_train_batches", "2", "--trainer.val_check_interval", "2", "--trainer.check_val_every_n_epoch", "1",
    "--trainer.limit_val_batches", "1", "--trainer.num_sanity_val_steps", "0",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--data.num_workers", "0",
]


def small_args(config: Path) -> list[str]:
    """The command-line overrides that make ``config`` small; its classes and structure stay."""
    model = yaml.safe_load(config.read_text())["model"]
    init, module = model["init_args"], model["class_path"].rpartition(".")[2]
    backbone_kwargs = SMALL_BACKBONES[init.get("backbone", "swin_t").split("_")[0].rstrip("0123456789")]
    args = ["--model.backbone_kwargs", backbone_kwargs] if backbone_kwargs else []
    # The classes the config's named sizes build (the task modules' default detector: detr, Mask2Former for instances).
    detector = DETECTORS[init.get("detector", DEFAULT_DETECTORS.get(module, "detr"))].func
    head = SEGMENTATION_HEADS[init.get("head", "upernet")].func
    role, sized = ("head", head) if module == "SegmentationModule" else ("detector", detector)
    if sized is not UperNetSegmentor and module != "ClassificationModule":  # the toy size, the config's own kwargs dropped
        kwargs = "{num_denoising: 4}" if sized in (DINO, RTDETR) else "{}"
        args += [f"--model.{role}", f"{OFFICIAL_NAMES[sized]}_toy", f"--model.{role}_kwargs", kwargs]
        args += ["--model.criterion_kwargs", "{num_points: 256}"] if sized is Mask2Former else []
    if module in ("DetectionModule", "PanopticModule", "InstanceSegmentationModule"):
        args += ["--data.batch_size", "2", *DETR_TRANSFORMS]
    elif module == "SegmentationModule":
        args += ([] if sized is Mask2Former else ["--model.head_kwargs", "{channels: 16, aux_channels: 8}"]) + ["--data.scale", "[96, 64]",
                 "--data.crop_size", "[64, 64]", "--data.batch_size", "2", "--data.val_batch_size", "1"]
    elif module == "ClassificationModule":
        args += ["--data.image_size", "32", "--data.batch_size", "4", "--data.val_batch_size", "4"]
    return args


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_trains_and_validates_on_cpu(config: Path, tmp_path_factory, tmp_path: Path) -> None:
    # Each toy set is generated once, for all the configs that read it.
    data_class = yaml.safe_load(config.read_text())["data"]["class_path"]
    toy_cache = tmp_path_factory.getbasetemp() / "toy_cache" / data_class
    run_cli("fit", [
        "--config", str(config), *small_args(config), *SHORT,
        "--data.toy_cache_dir", str(toy_cache), "--trainer.default_root_dir", str(tmp_path),
    ])
    metrics = json.loads(next(tmp_path.rglob("metrics.json")).read_text())
    assert metrics and all(values for values in metrics.values())
    assert list(tmp_path.rglob("last.ckpt"))
