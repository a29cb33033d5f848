"""LightningModule for semantic segmentation: a UperNet on a named backbone, trained with the Swin/NAT
ADE20K recipe (AdamW, linear warmup then poly decay per iteration) and scored by mIoU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torchvision import tv_tensors

from vision_tx.backbones import load_weights
from vision_tx.data.segmentation import ValTransform
from vision_tx.io import merge_metrics_json
from vision_tx.lightning.common import (
    adamw,
    build_task_backbone,
    is_fitting,
    param_groups,
    sync_batchnorm_where_supported,
)
from vision_tx.lightning.task import TaskModule
from vision_tx.metrics.classwise import markdown_table
from vision_tx.metrics.miou import MeanIoU
from vision_tx.models import SEGMENTATION_HEADS, Mask2Former, UperNetSegmentor
from vision_tx.visualize import denormalize, draw_semantic


def warmup_poly_factor(step: int, total_steps: int, warmup_steps: int, warmup_ratio: float, power: float) -> float:
    """The learning-rate multiplier at ``step`` of ``total_steps``: ``(1 - step / total) ** power`` (``power`` the
    exponent), times a linear ramp from ``warmup_ratio`` to 1 over the first ``warmup_steps`` (mmcv's ``poly`` policy
    with ``linear`` warmup)."""
    factor = max(1.0 - step / max(total_steps, 1), 0.0) ** power
    if step < warmup_steps:
        factor *= 1.0 - (1.0 - step / warmup_steps) * (1.0 - warmup_ratio)
    return factor


class SegmentationModule(TaskModule):
    """Semantic segmentation of the datamodule's classes by ``head`` (a name of
    ``vision_tx.models.SEGMENTATION_HEADS``: ``upernet``, ``mask2former``, ``mask2former_toy``) on
    ``build_backbone(backbone, **backbone_kwargs)``; ``head_kwargs`` go to the head's constructor, over the named
    size's (UperNet's ``channels``,
    ``aux_channels``, ``aux_in_index``, ``aux_loss_weight``, ``dropout``; Mask2Former's sizes), whose
    signature holds their defaults, and ``criterion_kwargs`` to Mask2Former's ``Mask2FormerCriterion``.

    ``num_classes=None`` takes the datamodule's number when the model is built (``configure_model``)
    and records it in the hyperparameters, so a checkpoint rebuilds the same model. ``pretrained`` (a
    backbone or classifier checkpoint, official Swin/NAT layouts included) and ``weights`` (a whole-model
    one: mmsegmentation's official UperNet layout, Mask2Former's, or vision_tx's) are read with
    ``load_weights`` when training starts, as in every task; heads of another number of classes keep the
    new model's initialisation (fine-tuning), and the log names them.
    Validation runs ``inference_mode`` (``"whole"`` or ``"slide"`` with ``slide_crop_size``/``slide_stride``),
    optionally over ``test_scales`` and flips, and scores at each label's original size; the first
    ``num_visualized`` validation images are drawn with their predicted and true classes.
    With ``sync_batchnorm`` the BatchNorm layers normalise over the global batch when training runs
    on several GPUs (SyncBatchNorm); on one device or on CPUs they stay per-process BatchNorm.
    The optimiser is AdamW; the parameters the model's ``no_weight_decay()`` names (norms, biases, tables)
    are not decayed unless ``decay_norms_and_biases=True``.
    ``compile`` (and any other option of :class:`TaskModule`) is passed on.
    Either head owns its loss and its class scores.
    """

    deployed_as = "semantic"  # what vision_tx.export wraps it in: probabilities and the label map

    def __init__(
        self,
        backbone: str = "swin_t",
        num_classes: int | None = None,
        pretrained: str | None = None,
        weights: str | None = None,
        backbone_kwargs: dict[str, Any] | None = None,
        lr: float = 6e-5,
        weight_decay: float = 0.01,
        decay_norms_and_biases: bool = False,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_iters: int = 1500,
        warmup_ratio: float = 1e-6,
        poly_power: float = 1.0,
        inference_mode: str = "whole",
        slide_crop_size: tuple[int, int] = (512, 512),
        slide_stride: tuple[int, int] = (341, 341),
        test_scales: tuple[float, ...] = (1.0,),
        test_flip: bool = False,
        num_visualized: int = 8,
        sync_batchnorm: bool = True,
        head: str = "upernet",
        head_kwargs: dict[str, Any] | None = None,
        criterion_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()
        self.model: UperNetSegmentor | Mask2Former | None = None

    def configure_model(self) -> None:
        if self.model is not None:
            return
        hp = self.hparams
        backbone = build_task_backbone(self)
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if hp.head not in SEGMENTATION_HEADS:
            raise ValueError(f"SegmentationModule: unknown head {hp.head!r}; known: {', '.join(SEGMENTATION_HEADS)}")
        criterion = {"criterion_kwargs": hp.criterion_kwargs} if hp.criterion_kwargs else {}
        self.model = SEGMENTATION_HEADS[hp.head](
            backbone,
            hp.num_classes,
            ignore_index=getattr(datamodule, "ignore_index", 255),
            **criterion,
            **(hp.head_kwargs or {}),
        )
        if hp.weights and is_fitting(self):
            report = load_weights(self.model, hp.weights, class_keys=self.model.class_keys)
            rank_zero_info(f"model weights: {report}")
        if hp.sync_batchnorm:
            self.model = sync_batchnorm_where_supported(self, self.model)
        self.compile_model()
        class_names = getattr(datamodule, "class_names", None)
        if class_names is not None and len(class_names) != hp.num_classes:
            class_names = None
        self.val_miou = MeanIoU(hp.num_classes, self.model.ignore_index, class_names)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Class probabilities ``[B, C, H, W]`` at the input size, with the validation inference settings."""
        hp = self.hparams
        return self.model.predict(
            images, hp.inference_mode, hp.slide_crop_size, hp.slide_stride, hp.test_scales, hp.test_flip
        )

    def training_step(self, batch: dict[str, Any], batch_index: int) -> torch.Tensor:
        losses = self.model.loss(self.model(batch["images"]), batch["labels"])
        batch_size = batch["images"].shape[0]
        self.log_training_losses(losses, batch_size)
        return losses["loss"]

    def validation_step(self, batch: dict[str, Any], batch_index: int) -> None:
        scores = self(batch["images"])
        for image, score, (height, width), label, (label_h, label_w) in zip(
            batch["images"], scores, batch["image_sizes"].tolist(), batch["labels"], batch["label_sizes"].tolist()
        ):
            if len(self.preview) < self.hparams.num_visualized and self.trainer.is_global_zero:
                self._add_preview(
                    denormalize(image[:, :height, :width]), score[:, :height, :width], label[:label_h, :label_w]
                )
            score = F.interpolate(
                score[None, :, :height, :width], (label_h, label_w), mode="bilinear", align_corners=False
            )
            self.val_miou.update(score[0].argmax(0), label[:label_h, :label_w])

    def _add_preview(self, picture: torch.Tensor, score: torch.Tensor, label: torch.Tensor) -> None:
        """Draws ``score`` ``[C, h, w]``'s classes and ``label`` (resized to ``h, w``) on ``picture``."""
        label = F.interpolate(label[None, None].float(), score.shape[-2:], mode="nearest")[0, 0].long().cpu()
        num_classes, ignore_index = self.hparams.num_classes, self.model.ignore_index
        self.preview.append(draw_semantic(picture, score.argmax(0).cpu(), num_classes, ignore_index=ignore_index))
        self.preview_truth.append(draw_semantic(picture, label, num_classes, ignore_index=ignore_index))

    def on_validation_epoch_end(self) -> None:
        summary = self.val_miou.summary()  # synchronised over processes by torchmetrics
        table = self.val_miou.table(count=10)
        self.val_miou.reset()
        self.log_dict({f"val/{k}": summary[k] for k in ("mIoU", "mAcc", "aAcc")}, prog_bar=True)
        self.per_category_tables["val/IoU_per_class"] = markdown_table(summary["per_category"], ("IoU", "Acc"))
        log_dir = self.trainer.log_dir  # a collective call under DDP: every rank makes it
        if self.trainer.sanity_checking or not self.trainer.is_global_zero:
            return
        rank_zero_info(f"step {self.global_step}: semantic segmentation\n{table}")
        if log_dir is not None:
            merge_metrics_json("segm_sem", summary, Path(log_dir) / "metrics.json")

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        groups = param_groups(self.model, hp.lr, hp.weight_decay, decay_norms_and_biases=hp.decay_norms_and_biases)
        optimizer = adamw(self, groups, lr=hp.lr, betas=hp.betas)
        total = int(self.trainer.estimated_stepping_batches)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_poly_factor(step, total, hp.warmup_iters, hp.warmup_ratio, hp.poly_power)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    @torch.no_grad()
    def draw_prediction(self, image: torch.Tensor, datamodule: pl.LightningDataModule) -> torch.Tensor:
        """Segments ``image`` ``[3,H,W]`` uint8 (the validation resize of the datamodule's ``scale``) and draws
        the classes over it at its size."""
        inputs = ValTransform(datamodule.hparams.scale).image_pipeline(tv_tensors.Image(image))
        scores = self(inputs[None].to(self.device))[0]
        scores = F.interpolate(scores[None], image.shape[-2:], mode="bilinear", align_corners=False)[0]
        return draw_semantic(
            image, scores.argmax(0).cpu(), self.hparams.num_classes, ignore_index=self.model.ignore_index
        )
