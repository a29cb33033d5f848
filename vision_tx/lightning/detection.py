"""LightningModule for object detection: a named detector (DETR, DINO, RT-DETR, Mask2Former) on a named backbone, COCO
evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from torchvision import tv_tensors

from vision_tx.attention import detector_attention_pictures
from vision_tx.backbones import load_weights
from vision_tx.lightning.budget import PlannedStepLR
from vision_tx.lightning.common import adamw, build_task_backbone, is_fitting, param_groups
from vision_tx.lightning.task import TaskModule
from vision_tx.metrics.classwise import markdown_table
from vision_tx.metrics.coco import CLASSWISE_COLUMNS, CocoEvaluator
from vision_tx.metrics.detection_report import write_validation_report
from vision_tx.models import DETECTORS
from vision_tx.visualize import denormalize, draw_detections, save_grid


class DetectionModule(TaskModule):
    """Detection of the datamodule's categories by ``detector`` (a name of ``vision_tx.models.DETECTORS``:
    ``detr``, ``dino``, ``rtdetr``, ``mask2former`` at their official sizes, ``detr_toy`` ... at their toy
    sizes) on ``build_backbone(backbone, **backbone_kwargs)``.

    ``num_classes=None`` takes the datamodule's number (largest category id + 1) when the model is
    built (``configure_model``) and records it, so a checkpoint rebuilds the same model.
    ``pretrained`` is a backbone checkpoint, ``weights`` a whole-model one (e.g. the official
    ``detr-r50-e632da11.pth``); both are read with ``load_weights`` when training starts. Weights of
    another number of classes fine-tune: all but the detector's ``class_keys`` tensors load, those
    keep the new model's initialisation, and the log names them.
    ``detector_kwargs`` (over the named size's), ``matcher_kwargs`` and ``criterion_kwargs`` go to the detector, which
    builds its matcher and criterion from the last two (``HungarianMatcher``, ``SetCriterion``/``DINOCriterion``;
    their signatures hold the papers' defaults). The model computes its loss and post-processing from
    the batch's targets; this module only calls them (the protocol: docs/CONVENTIONS.md, "Detectors"). The
    optimiser is DETR's: AdamW, the backbone at ``backbone_lr``, every parameter decayed unless
    ``decay_norms_and_biases=False`` exempts those the model's ``no_weight_decay()`` names (norms, biases,
    tables, tokens: RT-DETR's and Mask2Former's recipes), the learning rate divided by 10
    after ``lr_drop_epochs``, or after ``lr_drop_steps`` optimiser steps when that is given (a
    schedule that does not depend on the dataset's size, for runs budgeted by ``trainer.max_steps``; a
    :class:`~vision_tx.lightning.budget.PlannedStepLR`, which ``--budget.minutes`` stretches to a time).
    ``share_scores_from_epoch`` turns the detector's ``share_scores`` on (RT-DETR, DINO, D-FINE: each class scored by
    its share of the query's class probabilities) once the weights have trained that many epochs (optimiser steps
    times ``accumulate_grad_batches`` over the batches of an epoch): a query torn between two classes then ranks both
    lower, which pays once the classes are learnt and costs while they are not (docs/LEARNING.md, "Scores: shared once
    20 epochs are trained"). The step of the switch is kept in checkpoints (``scores_shared_from_step``), so a resumed
    run, and what evaluates or exports a checkpoint saved after it, scores as the run did; a ``share_scores`` given in
    ``detector_kwargs`` goes over it.
    Each validation writes, beside ``metrics.json``, the report of :mod:`vision_tx.metrics.detection_report` (the
    precision-recall and F1 curves per class, the confidence of the best F1 and the confusion matrix of the detections
    scoring at least that): ``confusion_matrix.png``, ``pr_curve.png``, ``f1_curve.png``, the numbers
    in ``metrics.json``'s ``bbox`` section, the pictures in TensorBoard (``val/confusion_matrix``, ...).
    ``compile`` (and any other option of :class:`TaskModule`) is passed on.
    """

    deployed_as = "detection"  # what vision_tx.export wraps it in: its detector's ``detections``

    backbone_prefix = "backbone."  # where the backbone's parameters sit in ``self.model``
    backbone_out_indices: tuple[int, ...] | None = None  # None: the stages the detector reads

    def __init__(
        self,
        backbone: str = "swin_t",
        detector: str = "detr",
        num_classes: int | None = None,
        pretrained: str | None = None,
        weights: str | None = None,
        backbone_kwargs: dict[str, Any] | None = None,
        detector_kwargs: dict[str, Any] | None = None,
        matcher_kwargs: dict[str, Any] | None = None,
        criterion_kwargs: dict[str, Any] | None = None,
        lr: float = 1e-4,
        backbone_lr: float = 1e-5,
        weight_decay: float = 1e-4,
        decay_norms_and_biases: bool = True,
        lr_drop_epochs: int = 200,
        lr_drop_steps: int | None = None,
        num_visualized: int = 8,
        visualize_score_threshold: float | None = None,
        share_scores_from_epoch: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if detector not in DETECTORS:
            raise ValueError(f"DetectionModule: unknown detector {detector!r}; known: {', '.join(DETECTORS)}")
        if share_scores_from_epoch is not None and share_scores_from_epoch < 0:
            raise ValueError(
                f"DetectionModule: share_scores_from_epoch must be at least 0, got {share_scores_from_epoch}"
            )
        self.save_hyperparameters()
        self.model: torch.nn.Module | None = None
        self.scores_shared_from_step: int | None = None  # the step at which share_scores_from_epoch was reached

    def configure_model(self) -> None:
        if self.model is not None:
            return
        hp = self.hparams
        out_indices = self.backbone_out_indices or self.detector_class.backbone_out_indices
        self.model = self.build_model(build_task_backbone(self, out_indices))
        if hp.share_scores_from_epoch is not None and not hasattr(self.model, "share_scores"):
            raise ValueError(
                f"DetectionModule: share_scores_from_epoch needs a detector of sigmoid class scores (RT-DETR, DINO, "
                f"D-FINE); {hp.detector} has none"
            )
        if hp.weights and is_fitting(self):
            report = load_weights(self.model, hp.weights, class_keys=self.model.class_keys)
            rank_zero_info(f"model weights: {report}")
        self.compile_model()

    def build_model(self, backbone: torch.nn.Module) -> torch.nn.Module:
        """The detector around the task's backbone (it builds its own matcher and criterion)."""
        hp = self.hparams
        return DETECTORS[hp.detector](
            backbone,
            hp.num_classes,
            matcher_kwargs=hp.matcher_kwargs,
            criterion_kwargs=hp.criterion_kwargs,
            **(hp.detector_kwargs or {}),
        )

    @property
    def detector_class(self) -> type[torch.nn.Module]:
        """The class ``detector`` names (its sizes share it)."""
        return DETECTORS[self.hparams.detector].func

    @property
    def visualize_score_threshold(self) -> float:
        """The score above which pictures draw a detection: ``visualize_score_threshold``, or the detector's default."""
        given = self.hparams.visualize_score_threshold
        return self.detector_class.score_threshold if given is None else given

    def forward(
        self,
        images: torch.Tensor,
        pixel_mask: torch.Tensor | None = None,
        targets: list[dict[str, torch.Tensor]] | None = None,
    ) -> dict[str, Any]:
        """``images [B,3,H,W]``, ``pixel_mask [B,H,W]`` (True on padding), the batch's ``targets`` (for
        training-time queries such as DINO's denoising) -> the detector's raw outputs."""
        return self.model(images, pixel_mask, targets)

    def training_step(self, batch: dict[str, Any], batch_index: int) -> torch.Tensor:
        targets = batch["targets"]
        outputs = self(batch["images"], batch["pixel_mask"], targets)
        losses = self.model.loss(outputs, targets)
        batch_size = batch["images"].shape[0]
        self.log_training_losses(losses, batch_size)
        return losses["loss"]

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_index: int) -> None:
        self.share_scores_once_trained()

    def share_scores_once_trained(self) -> None:
        """``share_scores_from_epoch``: turns the detector's ``share_scores`` on once this run's optimiser steps make
        that many epochs, and keeps the step for the checkpoint."""
        start, trainer = self.hparams.share_scores_from_epoch, self.trainer
        if start is None or self.model.share_scores:
            return
        epochs = trainer.global_step * trainer.accumulate_grad_batches / trainer.num_training_batches
        if epochs >= start:
            self.model.share_scores = True
            self.scores_shared_from_step = trainer.global_step
            rank_zero_info(
                f"DetectionModule: class scores shared from step {trainer.global_step} ({epochs:.1f} epochs trained, "
                f"share_scores_from_epoch {start:g})"
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["scores_shared_from_step"] = self.scores_shared_from_step

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.scores_shared_from_step = checkpoint.get("scores_shared_from_step")
        # the detector scores as the run did since then, unless detector_kwargs (the command line's) says otherwise
        if self.scores_shared_from_step is not None and "share_scores" not in (self.hparams.detector_kwargs or {}):
            self.model.share_scores = True

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self.evaluator = CocoEvaluator(self.trainer.datamodule.val_coco, "bbox")

    def validation_step(self, batch: dict[str, Any], batch_index: int) -> dict[str, Any]:
        """Scores the boxes of ``batch``; returns the model's outputs (for subclasses that score more)."""
        targets = batch["targets"]
        outputs = self(batch["images"], batch["pixel_mask"])
        losses = self.model.loss(outputs, targets)
        self.log("val/loss", losses["loss"], batch_size=len(targets), sync_dist=True)
        orig_sizes = torch.stack([t["orig_size"] for t in targets])
        detections = self.model.postprocess(outputs, orig_sizes)
        self.evaluator.update([{"image_id": int(t["image_id"]), **d} for t, d in zip(targets, detections)])
        if len(self.preview) < self.hparams.num_visualized and self.trainer.is_global_zero:
            self._add_preview(batch, outputs)
        return outputs

    def _add_preview(self, batch: dict[str, Any], outputs: dict[str, Any]) -> None:
        sizes = torch.stack([t["size"] for t in batch["targets"]])
        names = self.trainer.datamodule.category_names
        for image, size, detection, target in zip(
            batch["images"], sizes, self.model.postprocess(outputs, sizes), batch["targets"]
        ):
            if len(self.preview) >= self.hparams.num_visualized:
                break
            picture = denormalize(image[:, : size[0], : size[1]])
            self.preview.append(
                draw_detections(
                    picture, **detection, category_names=names, score_threshold=self.visualize_score_threshold
                )
            )
            self.preview_truth.append(
                draw_detections(picture, target["boxes"].cpu(), target["labels"].cpu(), category_names=names)
            )

    def on_validation_epoch_end(self) -> None:
        stats = self.evaluator.compute()  # the same on every rank
        self.log_dict({f"val/{k}": v for k, v in stats.items() if k != "AP"})
        self.log("val/AP", stats["AP"], prog_bar=True)
        self.per_category_tables["val/bbox_AP_per_category"] = markdown_table(
            self.evaluator.per_category, CLASSWISE_COLUMNS
        )
        log_dir = self.trainer.log_dir  # a collective call under DDP: every rank makes it
        if self.trainer.sanity_checking or not self.trainer.is_global_zero or log_dir is None:
            return
        log_dir = Path(log_dir)
        report, pictures = write_validation_report(self.evaluator, stats, log_dir)
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                for name, report_picture in pictures.items():
                    logger.experiment.add_image(f"val/{name}", report_picture, self.global_step)
        picture = save_grid(self.preview, log_dir / f"predictions_step{self.global_step}.png") if self.preview else None
        best_f1, best_threshold = report.best
        rank_zero_info(
            f"step {self.global_step}: COCO box AP {stats['AP']:.3f}, AP50 {stats['AP50']:.3f}, "
            f"AP75 {stats['AP75']:.3f}\n"
            f"{self.evaluator.table()}\n"
            f"best F1 {best_f1:.3f} at confidence {best_threshold:.2f}; confusion matrix, PR and F1 curves: "
            f"{', '.join(f'{name}.png' for name in pictures)}\n"
            f"metrics: {log_dir / 'metrics.json'}" + (f"\npredictions drawn in {picture}" if picture else "")
        )

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        groups = param_groups(
            self.model,
            hp.lr,
            hp.weight_decay,
            backbone_lr=hp.backbone_lr,
            decay_norms_and_biases=hp.decay_norms_and_biases,
            backbone_prefix=self.backbone_prefix,
        )
        optimizer = adamw(self, groups)
        if hp.lr_drop_steps is None:
            schedule, interval = torch.optim.lr_scheduler.StepLR(optimizer, hp.lr_drop_epochs, gamma=0.1), "epoch"
        else:
            schedule, interval = PlannedStepLR(optimizer, [hp.lr_drop_steps], gamma=0.1, trainer=self._trainer), "step"
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": interval}}

    @torch.no_grad()
    def predict_image(
        self, image: torch.Tensor, datamodule: pl.LightningDataModule
    ) -> tuple[dict[str, Any], torch.Tensor]:
        """The raw outputs for ``image`` ``[3,H,W]`` uint8 after the datamodule's validation resize, and
        that resized size ``[1,2]`` (h, w)."""
        height, width = image.shape[-2:]
        target = {"boxes": tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(height, width))}
        inputs, _ = datamodule.val_transform(tv_tensors.Image(image), target)
        return self(inputs[None].to(self.device)), torch.tensor([inputs.shape[-2:]], device=self.device)

    @torch.no_grad()
    def draw_prediction(self, image: torch.Tensor, datamodule: pl.LightningDataModule) -> torch.Tensor:
        """Detects objects in ``image`` ``[3,H,W]`` uint8 (the datamodule's validation resize) and draws them."""
        outputs, _ = self.predict_image(image, datamodule)
        detection = self.model.postprocess(outputs, torch.tensor([image.shape[-2:]], device=self.device))[0]
        return draw_detections(
            image,
            **{k: v.cpu() for k, v in detection.items()},
            category_names=datamodule.category_names,
            score_threshold=self.visualize_score_threshold,
        )

    def attention_pictures(
        self, image: torch.Tensor, datamodule: pl.LightningDataModule, score_threshold: float = 0.7
    ) -> list[torch.Tensor]:
        """``image`` ``[3,H,W]`` uint8 after the validation transform, then each object scored above
        ``score_threshold`` (the 4 best when none is) with its box and the detector's cross-attention."""
        return detector_attention_pictures(
            self.model, image, datamodule.val_transform, getattr(datamodule, "category_names", None), score_threshold
        )
