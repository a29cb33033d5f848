"""Classification through the tools: training on a toy set writes top-1/top-5, the confusion picture and
predictions; eval.py validates and infer.py draws the top classes of a checkpoint; SAM trains through the CLI.
DeiT's hard distillation against the loss by hand, with teachers from the factory and from torchvision."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import torchvision
from lightning.pytorch.trainer.states import TrainerFn
from torchvision.io import read_image

from tests.lightning.tools import run_tool_in_process
from tests.parity import perturb_
from vision_tx.backbones import build_classifier, save_weights
from vision_tx.data.toy_classification import make_toy_classification
from vision_tx.lightning.classification import ClassificationModule, load_teacher

SMALL = [
    "--config",
    "classification_toy",
    "--model.backbone",
    "swin_t",
    "--model.backbone_kwargs",
    "{embed_dim: 16, depths: [1, 1, 1, 1], num_heads: [1, 2, 4, 8], window_size: 4}",
    "--data.image_size",
    "32",
    "--data.batch_size",
    "8",
    "--data.num_workers",
    "0",
    "--trainer.accelerator",
    "cpu",
    "--trainer.devices",
    "1",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.num_sanity_val_steps",
    "0",
]


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory) -> Path:
    return make_toy_classification(
        tmp_path_factory.mktemp("toy") / "cls", num_train_per_class=4, num_val_per_class=2, side=32
    )


def test_train_eval_infer(tmp_path: Path, toy_root: Path) -> None:
    run_tool_in_process(
        "train.py",
        *SMALL,
        "--data.root",
        str(toy_root),
        "--trainer.max_steps",
        "3",
        "--trainer.max_epochs",
        "1",
        "--trainer.default_root_dir",
        str(tmp_path),
        cwd=tmp_path,
    )
    metrics = json.loads(next(tmp_path.rglob("metrics.json")).read_text())["classification"]
    assert set(metrics) == {"top1", "top5", "images"} and metrics["images"] == 12
    assert 0 <= metrics["top1"] <= metrics["top5"] <= 1
    assert list(tmp_path.rglob("confusion_step*.png")) and list(tmp_path.rglob("predictions_step*.png"))
    ckpt = next(tmp_path.rglob("last.ckpt"))
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert checkpoint["hyper_parameters"]["class_names"][0] == "blue_circle"

    result = run_tool_in_process("eval.py", *SMALL, "--data.root", str(toy_root), "--ckpt", str(ckpt), cwd=tmp_path)
    assert "val/top1" in result.stdout
    image = next((toy_root / "val").rglob("*.png"))
    run_tool_in_process(
        "infer.py",
        *SMALL,
        "--ckpt",
        str(ckpt),
        "--image",
        str(image),
        "--out",
        str(tmp_path / "pred.png"),
        cwd=tmp_path,
    )
    picture = read_image(str(tmp_path / "pred.png"))
    assert picture.shape[1] > 32  # the image with five lines of classes under it


def test_sam_trains_through_the_cli(tmp_path: Path, toy_root: Path) -> None:
    run_tool_in_process(
        "train.py",
        *SMALL,
        "--data.root",
        str(toy_root),
        "--trainer.max_steps",
        "2",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.gradient_clip_val",
        "1.0",
        "--trainer.logger",
        "false",
        "--trainer.callbacks+=vision_tx.lightning.callbacks.SharpnessAwareMinimization",
        "--trainer.callbacks.rho",
        "0.1",
        "--trainer.default_root_dir",
        str(tmp_path),
        cwd=tmp_path,
    )
    assert torch.load(next(tmp_path.rglob("last.ckpt")), map_location="cpu", weights_only=False)["global_step"] == 2


def test_max_steps_without_epochs_keeps_the_warmup_in_epochs(toy_root: Path) -> None:
    """``max_steps`` with no epoch limit: the warm-up is still ``warmup_epochs`` times the batches per epoch."""
    import lightning.pytorch as pl

    from vision_tx.data.imagefolder import ImageFolderDataModule

    module = ClassificationModule(
        "swin_t",
        backbone_kwargs=dict(embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], window_size=4),
        warmup_epochs=1.5,
        mixup_alpha=0,
        cutmix_alpha=0,
    )
    datamodule = ImageFolderDataModule(str(toy_root), image_size=32, batch_size=4, num_workers=0)
    trainer = pl.Trainer(
        max_steps=2,
        max_epochs=None,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule)
    schedule = trainer.lr_scheduler_configs[0].scheduler
    batches_per_epoch = 24 // 4  # six classes of four training images
    warmup = int(1.5 * batches_per_epoch)
    assert trainer.global_step == 2 and schedule.lr_lambdas[0](warmup) == 1.0 > schedule.lr_lambdas[0](warmup - 1)


def _fitting(module: ClassificationModule) -> ClassificationModule:
    """``module`` built as ``trainer.fit`` builds it (teacher loaded), its logging switched off."""
    module._trainer = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING), datamodule=None)
    module.log_training_losses = lambda *args, **kwargs: None
    module.configure_model()
    return module.train()


def test_hard_distillation_is_half_ce_on_the_labels_and_half_ce_on_the_teachers_argmax(tmp_path: Path) -> None:
    """DeiT's hard distillation: 1/2 CE(class head, y) (label smoothing 0.1) + 1/2 CE(distillation head,
    argmax of the teacher), no smoothing on the teacher's labels; the teacher read from its file, frozen, in
    eval mode (its stochastic depth off) even when the module trains, and outside the module's state."""
    torch.manual_seed(0)
    small = {"depth": 1, "drop_path_rate": 0.0}
    teacher = perturb_(build_classifier("deit_tiny", num_classes=5, depth=2, drop_path_rate=0.5), seed=1).eval()
    save_weights(teacher, tmp_path / "teacher.pth")
    module = _fitting(
        ClassificationModule(
            "deit_tiny_distilled",
            num_classes=5,
            backbone_kwargs=small,
            mixup_alpha=0.0,
            cutmix_alpha=0.0,
            teacher=str(tmp_path / "teacher.pth"),
            teacher_backbone="deit_tiny",
            teacher_kwargs={"depth": 2, "drop_path_rate": 0.5},
        )
    )
    perturb_(module.model, seed=2)  # the two heads and their tokens apart
    loaded = module._teacher[0]
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())
    assert not any(name.startswith("_teacher") for name in module.state_dict())
    images = torch.randn(8, 3, 32, 32)
    with torch.no_grad():
        teacher_labels = teacher(images).argmax(1)
        class_logits, distillation_logits = module.model(images)
    labels = (teacher_labels + 1) % 5  # the labels and the teacher disagree everywhere
    expected = 0.5 * F.cross_entropy(class_logits, labels, label_smoothing=0.1) + 0.5 * F.cross_entropy(
        distillation_logits, teacher_labels
    )
    with torch.no_grad():
        loss = module.training_step((images, labels), 0)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    # Another weight, at which the two terms' weights cannot be swapped unseen: (1 - w) on the labels, w on the teacher.
    module.hparams.distillation_weight = 0.3
    expected = 0.7 * F.cross_entropy(class_logits, labels, label_smoothing=0.1) + 0.3 * F.cross_entropy(
        distillation_logits, teacher_labels
    )
    with torch.no_grad():
        loss = module.training_step((images, labels), 0)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)


def test_torchvision_teacher_is_read_from_its_path_frozen_in_eval_mode(tmp_path: Path) -> None:
    reference = perturb_(torchvision.models.resnet18(num_classes=6)).eval()
    torch.save({"state_dict": {f"model.{k}": v for k, v in reference.state_dict().items()}}, tmp_path / "resnet18.ckpt")
    teacher = load_teacher(str(tmp_path / "resnet18.ckpt"), "torchvision:resnet18", num_classes=6)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(teacher(images), reference(images), rtol=0, atol=0)
