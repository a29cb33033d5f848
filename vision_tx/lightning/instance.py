"""LightningModule for instance segmentation: a mask-predicting detector (Mask2Former) scored by COCO mask AP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torchvision.utils import draw_segmentation_masks

from vision_tx.lightning.detection import DetectionModule, denormalize
from vision_tx.metrics.classwise import markdown_table
from vision_tx.metrics.coco import CLASSWISE_COLUMNS, CocoEvaluator
from vision_tx.visualize import palette


def draw_instances(image: torch.Tensor, masks: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``image [3,H,W]`` uint8 with bool ``masks [N,H,W]`` filled in the colours of their ``labels [N]`` (a palette of
    ``num_classes``) -> ``[3,H,W]`` uint8."""
    if len(masks) == 0:
        return image
    colours = palette(num_classes)
    return draw_segmentation_masks(
        image, masks.cpu(), alpha=0.5, colors=[colours[int(c) % num_classes] for c in labels]
    )


class InstanceSegmentationModule(DetectionModule):
    """Instance segmentation of the datamodule's categories (``CocoInstanceDataModule``) by ``detector``
    (default ``mask2former``): the arguments of :class:`DetectionModule`.

    Validation scores COCO mask AP (printed per category, ``val/segm_AP``, ``val/segm_AP50`` ...) besides
    the box AP of the masks' boxes, and writes ``segm_results.json`` and the ``segm`` section of
    ``metrics.json`` in the log folder; pictures show the instances above the detector's score threshold.
    """

    def __init__(self, detector: str = "mask2former", **kwargs: Any) -> None:
        super().__init__(detector=detector, **kwargs)

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self.segm_evaluator = CocoEvaluator(self.trainer.datamodule.val_coco, "segm")

    def validation_step(self, batch: dict[str, Any], batch_index: int) -> dict[str, Any]:
        outputs = super().validation_step(batch, batch_index)
        targets = batch["targets"]
        orig_sizes = torch.stack([t["orig_size"] for t in targets])
        instances = self.model.postprocess(outputs, orig_sizes)
        self.segm_evaluator.update(
            [{"image_id": int(t["image_id"]), **{k: v.cpu() for k, v in r.items()}} for t, r in zip(targets, instances)]
        )
        return outputs

    def _add_preview(self, batch: dict[str, Any], outputs: dict[str, Any]) -> None:
        sizes = torch.stack([t["size"] for t in batch["targets"]])
        num_classes = self.hparams.num_classes
        for image, size, result, target in zip(
            batch["images"], sizes, self.model.postprocess(outputs, sizes), batch["targets"]
        ):
            if len(self.preview) >= self.hparams.num_visualized:
                break
            picture = denormalize(image[:, : size[0], : size[1]])
            shown = result["scores"] > self.visualize_score_threshold
            self.preview.append(draw_instances(picture, result["masks"][shown], result["labels"][shown], num_classes))
            self.preview_truth.append(draw_instances(picture, target["masks"].bool(), target["labels"], num_classes))

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()  # box AP, its files and the pictures
        stats = self.segm_evaluator.compute()  # the same on every rank
        self.log_dict({f"val/segm_{k}": v for k, v in stats.items()})
        self.per_category_tables["val/segm_AP_per_category"] = markdown_table(
            self.segm_evaluator.per_category, CLASSWISE_COLUMNS
        )
        log_dir = self.trainer.log_dir
        if self.trainer.sanity_checking or not self.trainer.is_global_zero or log_dir is None:
            return
        log_dir = Path(log_dir)
        self.segm_evaluator.write_results(log_dir / "segm_results.json")
        self.segm_evaluator.write_metrics(stats, log_dir / "metrics.json")
        rank_zero_info(
            f"step {self.global_step}: COCO mask AP {stats['AP']:.3f}, AP50 {stats['AP50']:.3f}, "
            f"AP75 {stats['AP75']:.3f}\n"
            f"{self.segm_evaluator.table()}\nsegmentations: {log_dir / 'segm_results.json'}"
        )

    @torch.no_grad()
    def draw_prediction(self, image: torch.Tensor, datamodule: pl.LightningDataModule) -> torch.Tensor:
        """Segments the instances of ``image`` ``[3,H,W]`` uint8 (the datamodule's validation resize) and draws them."""
        outputs, _ = self.predict_image(image, datamodule)
        result = self.model.postprocess(outputs, torch.tensor([image.shape[-2:]], device=self.device))[0]
        shown = result["scores"] > self.visualize_score_threshold
        return draw_instances(image, result["masks"][shown], result["labels"][shown], self.hparams.num_classes)
