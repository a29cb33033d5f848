"""Shared LightningModule pieces: backbone building, pretrained weights, parameter groups."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn

from vision_tx.backbones import build_backbone, save_weights
from vision_tx.backbones.base import norms_and_biases_and
from vision_tx.lightning.common import adamw, build_task_backbone, param_groups, sync_batchnorm_where_supported

SMALL = {"embed_dim": 16, "depths": (1, 1, 1, 1), "num_heads": (1, 1, 1, 1)}


class _Task(LightningModule):
    def __init__(
        self,
        backbone: str = "swin_t",
        num_classes: int | None = None,
        pretrained: str | None = None,
        backbone_kwargs: dict | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()


def _attach(module: LightningModule, fn: TrainerFn, num_classes: int = 7) -> None:
    module._trainer = SimpleNamespace(state=SimpleNamespace(fn=fn), datamodule=SimpleNamespace(num_classes=num_classes))


def test_pretrained_weights_load_only_when_fitting(tmp_path) -> None:
    source = build_backbone("swin_t", **SMALL)
    save_weights(source, tmp_path / "backbone.pth")
    fitting = _Task(pretrained=str(tmp_path / "backbone.pth"), backbone_kwargs=SMALL)
    _attach(fitting, TrainerFn.FITTING)
    for name, tensor in build_task_backbone(fitting).state_dict().items():
        torch.testing.assert_close(tensor, source.state_dict()[name], rtol=0, atol=0)
    assert fitting.hparams.num_classes == 7  # taken from the datamodule and recorded

    # A reloaded checkpoint (no trainer) or a validation run never reads the file: it may be gone.
    (tmp_path / "backbone.pth").unlink()
    reloaded = _Task(num_classes=3, pretrained=str(tmp_path / "backbone.pth"), backbone_kwargs=SMALL)
    build_task_backbone(reloaded)
    _attach(reloaded, TrainerFn.VALIDATING)
    build_task_backbone(reloaded)
    assert reloaded.hparams.num_classes == 3


def test_num_classes_needs_a_datamodule() -> None:
    with pytest.raises(ValueError, match="num_classes is None and there is no datamodule"):
        build_task_backbone(_Task(backbone_kwargs=SMALL))


class _BackboneAndHead(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module) -> None:
        super().__init__()
        self.backbone, self.head = backbone, torch.nn.Linear(4, 2)

    def no_weight_decay(self) -> set[str]:
        return norms_and_biases_and(self, "backbone")


def test_param_groups_split_backbone_and_decay() -> None:
    model = _BackboneAndHead(build_backbone("swin_t", **SMALL))
    groups = param_groups(model, lr=1e-4, weight_decay=0.05, backbone_lr=1e-5, decay_norms_and_biases=False)
    by_setting = {(g["lr"], g["weight_decay"]): g["params"] for g in groups}
    assert set(by_setting) == {(1e-5, 0.05), (1e-5, 0.0), (1e-4, 0.05), (1e-4, 0.0)}
    assert sum(len(p) for p in by_setting.values()) == len(list(model.parameters()))
    assert model.head.bias in [p for p in by_setting[(1e-4, 0.0)]]
    assert [g["weight_decay"] for g in param_groups(model, lr=1e-4, weight_decay=0.05)] == [
        0.05
    ]  # DETR decays everything


def test_param_groups_follow_no_weight_decay() -> None:
    """Exactly the parameters ``no_weight_decay()`` names are undecayed: ViT/DeiT's tokens and position embeddings among
    them."""
    model = _BackboneAndHead(build_backbone("deit_tiny_distilled", depth=1))
    groups = param_groups(model, lr=1e-4, weight_decay=0.05, decay_norms_and_biases=False)
    undecayed = {id(p) for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert undecayed == {id(p) for name, p in model.named_parameters() if name in model.no_weight_decay()}
    stem = model.backbone.stem
    assert {id(stem.cls_token), id(stem.dist_token), id(stem.pos_embed)} <= undecayed
    assert id(stem.patch_embed.proj.weight) not in undecayed


@pytest.mark.parametrize(("world_size", "device", "synced"), [(2, "cuda", True), (2, "cpu", False), (1, "cuda", False)])
def test_batchnorm_is_synced_only_over_several_gpu_processes(world_size: int, device: str, synced: bool) -> None:
    module = _Task()
    module._trainer = SimpleNamespace(world_size=world_size, strategy=SimpleNamespace(root_device=torch.device(device)))

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))

    assert isinstance(sync_batchnorm_where_supported(module, model())[1], torch.nn.SyncBatchNorm) is synced
    assert not isinstance(sync_batchnorm_where_supported(_Task(), model())[1], torch.nn.SyncBatchNorm)  # no trainer


def _task_modules(decay: bool, precision: str = "32-true") -> list[LightningModule]:
    """A small module of each task with ``decay_norms_and_biases=decay``, its model built, attached to a
    stand-in trainer of 10 steps at ``precision`` (what their schedules and optimisers read)."""
    from vision_tx.lightning.classification import ClassificationModule
    from vision_tx.lightning.detection import DetectionModule
    from vision_tx.lightning.segmentation import SegmentationModule

    small = {"backbone": "swin_t", "num_classes": 3, "backbone_kwargs": SMALL, "decay_norms_and_biases": decay}
    modules = [
        DetectionModule(
            detector="rtdetr",
            **small,
            detector_kwargs={
                "hidden_dim": 32,
                "num_heads": 2,
                "num_queries": 5,
                "num_decoder_layers": 1,
                "num_denoising": 0,
            },
        ),
        SegmentationModule(**small, head_kwargs={"channels": 16, "aux_channels": 8}),
        ClassificationModule(**small),
    ]
    for module in modules:
        module._trainer = SimpleNamespace(
            precision=precision,
            estimated_stepping_batches=10,
            world_size=1,
            accumulate_grad_batches=1,
            num_training_batches=10,
            datamodule=SimpleNamespace(hparams=SimpleNamespace(batch_size=8)),
            fit_loop=SimpleNamespace(setup_data=lambda: None),
        )
        module.configure_model()
    return modules


@pytest.mark.parametrize("decay", [True, False])
def test_every_task_decays_norms_and_biases_as_its_option_says(decay: bool) -> None:
    """``decay_norms_and_biases`` (the recipe in the config) reaches each task's optimiser: false exempts exactly
    the parameters its model's ``no_weight_decay()`` names, true none."""
    for module in _task_modules(decay):
        optimizer = module.configure_optimizers()["optimizer"]
        undecayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
        exempt = {id(p) for name, p in module.model.named_parameters() if name in module.model.no_weight_decay()}
        assert exempt and undecayed == (set() if decay else exempt), type(module).__name__


@pytest.mark.parametrize(("precision", "fused"), [("32-true", True), ("bf16-mixed", None), ("16-mixed", None)])
def test_every_task_fuses_adamw_unless_lightning_mixes_precision(precision: str, fused: bool | None) -> None:
    """One fused AdamW kernel on the CPU; under ``16-mixed`` and ``bf16-mixed`` not fused, since Lightning's
    mixed-precision plugin will not clip the gradients of an optimiser that could unscale them itself, but left to
    torch (``None``): ``fused=False`` would also turn off its multi-tensor step on a GPU, leaving the loop over
    the parameters (20 ms a step on an H200 against 2.5, docs/LEARNING.md)."""
    for module in _task_modules(True, precision):
        optimizer = module.configure_optimizers()["optimizer"]
        assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"] is fused, type(module).__name__
        assert optimizer.defaults["foreach"] is None, type(module).__name__


class _Regression(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.layer(inputs).float(), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return adamw(self, param_groups(self.layer, lr=1e-2, weight_decay=0.0))


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_adamw_trains_with_gradient_clipping_in_every_cpu_precision(precision: str, tmp_path) -> None:
    """A real ``Trainer.fit`` with the configs' gradient clipping: a fused optimiser under ``bf16-mixed`` stops
    the first step (Lightning: "does not allow for gradient clipping")."""
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = Trainer(
        max_steps=3,
        precision=precision,
        gradient_clip_val=0.1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    module = _Regression()
    before = module.layer.weight.detach().clone()
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    assert trainer.global_step == 3 and not torch.equal(module.layer.weight, before)
