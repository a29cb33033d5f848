"""LightningModule for image classification: any classifier of the factory, trained with the DeiT recipe
(Mixup/CutMix, label smoothing, AdamW with a batch-scaled learning rate, warmup then cosine) and,
with a teacher, DeiT's hard distillation; scored by top-1 and top-5 accuracy."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
import torchvision
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix
from torchvision import tv_tensors
from torchvision.transforms import v2

from vision_tx.attention import classifier_attention_pictures
from vision_tx.backbones import build_classifier, load_weights
from vision_tx.checkpoint import read_checkpoint, unwrap_state_dict
from vision_tx.io import merge_metrics_json
from vision_tx.lightning.common import adamw, is_fitting, param_groups
from vision_tx.lightning.task import TaskModule
from vision_tx.visualize import denormalize, draw_confusion, draw_top_classes, save_grid

TORCHVISION_PREFIX = "torchvision:"
CLASS_KEYS = (r"^head(_dist)?\.",)  # the classifiers' tensors with a row per class (fine-tuning: load_weights)


def warmup_cosine_factor(
    step: int, total_steps: int, warmup_steps: int, warmup_ratio: float, final_ratio: float
) -> float:
    """The learning-rate multiplier at ``step``: linear from ``warmup_ratio`` to 1 over ``warmup_steps``,
    then a half cosine from 1 down to ``final_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return warmup_ratio + (1.0 - warmup_ratio) * step / warmup_steps
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    return final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def class_and_distillation_logits(outputs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A classifier's ``outputs`` as ``(class logits [B,C], distillation logits [B,C] or None)``: a tensor is
    the class head alone; a pair (tuple, list or the two values of a dict) is DeiT's two heads."""
    if isinstance(outputs, torch.Tensor):
        return outputs, None
    heads = list(outputs.values()) if isinstance(outputs, dict) else list(outputs)
    if len(heads) != 2:
        raise ValueError(
            f"a classifier returns logits or a pair (class, distillation) of them, got {len(heads)} outputs"
        )
    return heads[0], heads[1]


def load_teacher(path: str, name: str, num_classes: int, kwargs: dict[str, Any] | None = None) -> nn.Module:
    """A frozen classifier in eval mode with ``num_classes`` outputs: ``name`` from the factory (``build_classifier``)
    or ``torchvision:NAME`` (``torchvision.models.get_model``), built with the keyword arguments ``kwargs``, its
    weights read strictly from ``path`` (a native, official or Lightning checkpoint)."""
    if name.startswith(TORCHVISION_PREFIX):
        teacher = torchvision.models.get_model(
            name[len(TORCHVISION_PREFIX) :], num_classes=num_classes, **(kwargs or {})
        )
        teacher.load_state_dict(unwrap_state_dict(read_checkpoint(path), path))
    else:
        teacher = build_classifier(name, num_classes, **(kwargs or {}))
        load_weights(teacher, path, strict=True)
    return teacher.eval().requires_grad_(False)


class ClassificationModule(TaskModule):
    """Classification of the datamodule's classes with ``build_classifier(backbone, num_classes, **backbone_kwargs)``.

    ``num_classes=None`` and ``class_names=None`` are taken from the datamodule when the model is built
    and recorded, so that a checkpoint rebuilds the same model and names its classes.
    ``pretrained`` is a classifier checkpoint (official layouts included); a head of another number
    of classes keeps the new model's initialisation (fine-tuning), and the log names it. The learning rate is
    ``lr * global batch / lr_batch_size`` (DeiT: 5e-4 x 1024 / 512), warmed up linearly from ``warmup_lr`` over
    ``warmup_epochs`` and then decayed by a half cosine to ``min_lr``, updated every step. Training batches are mixed by
    Mixup (``mixup_alpha``) or CutMix (``cutmix_alpha``), one of the two at random (0 turns one off). The
    parameters the model's ``no_weight_decay()`` names are not decayed unless ``decay_norms_and_biases=True``.

    With ``teacher`` (a checkpoint path) and ``teacher_backbone`` (a factory name or ``torchvision:NAME``)
    the loss is DeiT's hard distillation: ``(1 - w) CE(class head, y) + w CE(distillation head,
    argmax teacher)`` with ``w = distillation_weight``; a model with one head uses it for both terms.
    A model returning two heads without a teacher trains both on the labels. ``compile`` (and any
    other option of :class:`TaskModule`) is passed on.
    """

    deployed_as = "classification"  # what vision_tx.export wraps it in: probabilities and the top classes

    def __init__(
        self,
        backbone: str = "deit_small",
        num_classes: int | None = None,
        class_names: list[str] | None = None,
        pretrained: str | None = None,
        backbone_kwargs: dict[str, Any] | None = None,
        lr: float = 5e-4,
        lr_batch_size: int = 512,
        min_lr: float = 1e-5,
        warmup_lr: float = 1e-6,
        warmup_epochs: float = 5.0,
        weight_decay: float = 0.05,
        decay_norms_and_biases: bool = False,
        betas: tuple[float, float] = (0.9, 0.999),
        label_smoothing: float = 0.1,
        mixup_alpha: float = 0.8,
        cutmix_alpha: float = 1.0,
        teacher: str | None = None,
        teacher_backbone: str | None = None,
        teacher_kwargs: dict[str, Any] | None = None,
        distillation_weight: float = 0.5,
        confusion_classes: int = 10,
        num_visualized: int = 8,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        if teacher is not None and teacher_backbone is None:
            raise ValueError(
                "ClassificationModule: teacher needs teacher_backbone (a factory name or torchvision:NAME)"
            )
        self.model: nn.Module | None = None
        self._teacher: tuple[nn.Module, ...] = ()  # outside the state dict and out of train()

    def configure_model(self) -> None:
        if self.model is not None:
            return
        hp = self.hparams
        if hp.num_classes is None:
            datamodule = self.trainer.datamodule if self._trainer is not None else None
            if datamodule is None:
                raise ValueError("ClassificationModule: num_classes is None and there is no datamodule to take it from")
            hp.num_classes = datamodule.num_classes
        if hp.class_names is None and self._trainer is not None and self.trainer.datamodule is not None:
            names = list(getattr(self.trainer.datamodule, "class_names", None) or [])
            hp.class_names = names if len(names) == hp.num_classes else None
        self.model = build_classifier(hp.backbone, hp.num_classes, **(hp.backbone_kwargs or {}))
        if hp.pretrained and is_fitting(self):
            rank_zero_info(f"classifier weights: {load_weights(self.model, hp.pretrained, class_keys=CLASS_KEYS)}")
        self.compile_model()
        if hp.teacher and is_fitting(self):
            self._teacher = (load_teacher(hp.teacher, hp.teacher_backbone, hp.num_classes, hp.teacher_kwargs),)
            rank_zero_info(f"distillation teacher: {hp.teacher_backbone} from {hp.teacher}")
        mixers = [
            mix(alpha=a, num_classes=hp.num_classes)
            for mix, a in ((v2.MixUp, hp.mixup_alpha), (v2.CutMix, hp.cutmix_alpha))
            if a > 0
        ]
        self.mix = v2.RandomChoice(mixers) if mixers else None
        top_k = min(5, hp.num_classes)
        self.val_top1 = MulticlassAccuracy(hp.num_classes, top_k=1, average="micro")
        self.val_top5 = MulticlassAccuracy(hp.num_classes, top_k=top_k, average="micro")
        self.val_confusion = MulticlassConfusionMatrix(hp.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Class logits ``[B, C]`` (DeiT's two heads averaged) for normalised ``images [B,3,H,W]``."""
        logits, distillation = class_and_distillation_logits(self.model(images))
        return logits if distillation is None else (logits + distillation) / 2

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_index: int) -> torch.Tensor:
        hp = self.hparams
        images, labels = batch
        targets = labels
        if self.mix is not None:
            images, targets = self.mix(images, labels)
        logits, distillation = class_and_distillation_logits(self.model(images))
        losses = {"class": F.cross_entropy(logits, targets, label_smoothing=hp.label_smoothing)}
        if self._teacher:
            teacher = self._teacher[0].to(images.device)
            with torch.no_grad():
                teacher_labels = teacher(images).argmax(1)
            losses["distillation"] = F.cross_entropy(logits if distillation is None else distillation, teacher_labels)
            losses["loss"] = (1 - hp.distillation_weight) * losses["class"] + hp.distillation_weight * losses[
                "distillation"
            ]
        elif distillation is not None:
            losses["distillation"] = F.cross_entropy(distillation, targets, label_smoothing=hp.label_smoothing)
            losses["loss"] = (losses["class"] + losses["distillation"]) / 2
        else:
            losses["loss"] = losses["class"]
        self.log_training_losses(losses, len(images))
        return losses["loss"]

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_index: int) -> None:
        images, labels = batch
        logits = self(images)
        self.log("val/loss", F.cross_entropy(logits, labels), batch_size=len(images), sync_dist=True)
        for metric in (self.val_top1, self.val_top5, self.val_confusion):
            metric.update(logits, labels)
        if len(self.preview) < self.hparams.num_visualized and self.trainer.is_global_zero:
            names = self.class_names
            for image, probabilities in zip(
                images[: self.hparams.num_visualized - len(self.preview)], logits.softmax(1)
            ):
                self.preview.append(draw_top_classes(denormalize(image), probabilities.cpu(), names))

    def on_validation_epoch_end(self) -> None:
        top1, top5 = float(self.val_top1.compute()), float(self.val_top5.compute())  # synchronised over processes
        confusion = self.val_confusion.compute().cpu()
        for metric in (self.val_top1, self.val_top5, self.val_confusion):
            metric.reset()
        self.log_dict({"val/top1": top1, "val/top5": top5}, prog_bar=True)
        log_dir = self.trainer.log_dir  # a collective call under DDP: every rank makes it
        if self.trainer.sanity_checking or not self.trainer.is_global_zero:
            return
        summary = {"top1": top1, f"top{min(5, self.hparams.num_classes)}": top5, "images": int(confusion.sum())}
        rank_zero_info(f"step {self.global_step}: top-1 {top1:.4f}, top-5 {top5:.4f} over {summary['images']} images")
        if log_dir is None:
            return
        log_dir = Path(log_dir)
        merge_metrics_json("classification", summary, log_dir / "metrics.json")
        picture = draw_confusion(confusion, self.class_names, self.hparams.confusion_classes)
        save_grid([picture], log_dir / f"confusion_step{self.global_step}.png")
        if self.preview:
            save_grid(self.preview, log_dir / f"predictions_step{self.global_step}.png")

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        datamodule = self.trainer.datamodule
        global_batch = datamodule.hparams.batch_size * self.trainer.world_size * self.trainer.accumulate_grad_batches
        lr = hp.lr * global_batch / hp.lr_batch_size
        optimizer = adamw(
            self,
            param_groups(self.model, lr, hp.weight_decay, decay_norms_and_biases=hp.decay_norms_and_biases),
            lr=lr,
            betas=hp.betas,
        )
        total = int(self.trainer.estimated_stepping_batches)
        # with max_steps alone, the estimate above leaves the batches per epoch unknown
        self.trainer.fit_loop.setup_data()
        steps_per_epoch = max(self.trainer.num_training_batches // self.trainer.accumulate_grad_batches, 1)
        warmup = int(hp.warmup_epochs * steps_per_epoch)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine_factor(step, total, warmup, hp.warmup_lr / lr, hp.min_lr / lr)
        )
        rank_zero_info(f"learning rate {lr:.3g} (global batch {global_batch}), {warmup} warmup steps of {total}")
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    @torch.no_grad()
    def draw_prediction(self, image: torch.Tensor, datamodule: pl.LightningDataModule) -> torch.Tensor:
        """The top-5 classes with their probabilities written on ``image`` ``[3,H,W]`` uint8."""
        inputs = datamodule.val_transform(tv_tensors.Image(image))
        probabilities = self(inputs[None].to(self.device))[0].softmax(0).cpu()
        return draw_top_classes(image, probabilities, self.class_names)

    def attention_pictures(
        self, image: torch.Tensor, datamodule: pl.LightningDataModule, score_threshold: float = 0.7
    ) -> list[torch.Tensor]:
        """``image`` ``[3,H,W]`` uint8 after the validation transform, the attention rollout and the last layer's
        class-token attention of each head (a ViT/DeiT classifier; ``score_threshold`` is the detectors')."""
        return classifier_attention_pictures(self.model, image, datamodule.val_transform)

    @property
    def class_names(self) -> list[str]:
        """The recorded class names, or the class indices as text."""
        return list(self.hparams.class_names or [str(i) for i in range(self.hparams.num_classes)])
