"""LightningModule for panoptic segmentation: DETR with its mask head, PQ and box AP, COCO panoptic files."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image

from vision_tx.data.coco_panoptic import rgb_to_id, write_panoptic_png, write_panoptic_predictions
from vision_tx.io import gather_by_image_id, merge_metrics_json
from vision_tx.lightning.detection import DetectionModule, denormalize
from vision_tx.metrics.classwise import markdown_table
from vision_tx.metrics.panoptic import PanopticEvaluator
from vision_tx.models import DETECTORS, PANOPTIC_WRAPPERS
from vision_tx.visualize import draw_panoptic

PREDICTIONS = "panoptic_predictions"  # the json and the PNG folder written in the log folder


def _png_bytes(segment_ids: torch.Tensor) -> bytes:
    """``[H, W]`` segment ids as COCO panoptic PNG bytes: compact enough to keep a whole epoch in memory."""
    buffer = io.BytesIO()
    write_panoptic_png(buffer, segment_ids)
    return buffer.getvalue()


def _segment_ids(png: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(png)) as image:
        return rgb_to_id(torch.from_numpy(np.array(image)).permute(2, 0, 1))


class PanopticModule(DetectionModule):
    """Panoptic segmentation of the datamodule's categories by a detector of ``vision_tx.models.PANOPTIC_WRAPPERS``:
    DETR with its mask head (Carion et al., 2020, section 4.4) or Mask2Former, which segments by itself.

    Takes every argument of :class:`DetectionModule` (backbone, detector, matcher, criterion — with
    ``weight_mask`` and ``weight_dice`` for DETR — and optimiser settings), plus, for DETR, ``panoptic_kwargs``
    for ``DETRPanoptic`` and ``postprocess_kwargs`` for ``postprocess_panoptic`` (their signatures hold
    the paper's defaults; Mask2Former takes its thresholds in ``detector_kwargs``). Training is joint by default; DETR's
    two stages are a detection run (``DetectionModule``) and then this module with ``weights: <its checkpoint>`` and
    ``panoptic_kwargs: {freeze_detr: true}``, which trains the mask head alone.

    Validation scores PQ (printed per category) and the box AP of the things, and writes
    ``panoptic_predictions.json`` with the ``panoptic_predictions/`` PNGs (COCO panoptic format),
    ``bbox_results.json`` and ``metrics.json`` (``bbox`` and ``panoptic`` sections) in the log folder.
    """

    deployed_as = "panoptic"  # what vision_tx.export wraps it in: its model's ``panoptic_segments``

    backbone_out_indices = (0, 1, 2, 3)  # the mask head also reads the stride 4, 8 and 16 maps

    def __init__(
        self,
        panoptic_kwargs: dict[str, Any] | None = None,
        postprocess_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        detector = self.hparams.detector
        if self.detector_class not in PANOPTIC_WRAPPERS:
            known = ", ".join(name for name, build in DETECTORS.items() if build.func in PANOPTIC_WRAPPERS)
            raise ValueError(f"PanopticModule: detector {detector!r} does not segment; known: {known}")
        if PANOPTIC_WRAPPERS[self.detector_class] is None and (panoptic_kwargs or postprocess_kwargs):
            raise ValueError(
                f"PanopticModule: detector {detector!r} segments by itself; give its settings in detector_kwargs, "
                "not panoptic_kwargs or postprocess_kwargs"
            )

    @property
    def backbone_prefix(self) -> str:  # type: ignore[override]
        wrapper = PANOPTIC_WRAPPERS[self.detector_class]
        return DetectionModule.backbone_prefix if wrapper is None else wrapper.backbone_prefix

    def build_model(self, backbone: torch.nn.Module) -> torch.nn.Module:
        """The detector wrapped by its ``PANOPTIC_WRAPPERS`` entry (DETR in ``DETRPanoptic``), or as it is when it
        segments by itself."""
        detector, wrapper = super().build_model(backbone), PANOPTIC_WRAPPERS[self.detector_class]
        if wrapper is None:
            return detector
        return wrapper(
            detector, postprocess_kwargs=self.hparams.postprocess_kwargs, **(self.hparams.panoptic_kwargs or {})
        )

    def _postprocess(
        self, outputs: dict[str, Any], sizes: torch.Tensor, orig_sizes: torch.Tensor, is_thing: dict[int, bool]
    ) -> list[dict[str, Any]]:
        return self.model.postprocess_panoptic(outputs, sizes, orig_sizes, is_thing)

    def _draw(self, image: torch.Tensor, panoptic: dict[str, Any]) -> torch.Tensor:
        classes = {int(s["id"]): int(s["category_id"]) for s in panoptic["segments_info"]}
        return draw_panoptic(image, panoptic["segment_ids"].cpu(), classes, self.hparams.num_classes)

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self.panoptic_evaluator = PanopticEvaluator(self.trainer.datamodule.categories)
        self._predictions: dict[int, dict[str, Any]] = {}

    def validation_step(self, batch: dict[str, Any], batch_index: int) -> dict[str, Any]:
        outputs = super().validation_step(batch, batch_index)
        targets, datamodule = batch["targets"], self.trainer.datamodule
        sizes = torch.stack([t["size"] for t in targets])
        orig_sizes = torch.stack([t["orig_size"] for t in targets])
        for target, panoptic in zip(targets, self._postprocess(outputs, sizes, orig_sizes, datamodule.is_thing)):
            image_id, segment_ids = int(target["image_id"]), panoptic["segment_ids"].cpu()
            gt_ids, gt_segments = datamodule.val_dataset.ground_truth(image_id)
            self.panoptic_evaluator.update(image_id, gt_ids, gt_segments, segment_ids, panoptic["segments_info"])
            self._predictions[image_id] = {"png": _png_bytes(segment_ids), "segments_info": panoptic["segments_info"]}
        return outputs

    def _add_preview(self, batch: dict[str, Any], outputs: dict[str, Any]) -> None:
        sizes = torch.stack([t["size"] for t in batch["targets"]])
        datamodule = self.trainer.datamodule
        results = self._postprocess(outputs, sizes, sizes, datamodule.is_thing)
        for image, (height, width), panoptic, target in zip(batch["images"], sizes.tolist(), results, batch["targets"]):
            if len(self.preview) >= self.hparams.num_visualized:
                break
            picture = denormalize(image[:, :height, :width])
            self.preview.append(self._draw(picture, panoptic))
            gt_ids, gt_segments = datamodule.val_dataset.ground_truth(int(target["image_id"]))
            gt_ids = torch.nn.functional.interpolate(gt_ids[None, None].double(), (height, width), mode="nearest")[
                0, 0
            ].long()
            classes = {int(s["id"]): int(s["category_id"]) for s in gt_segments}
            self.preview_truth.append(draw_panoptic(picture, gt_ids, classes, self.hparams.num_classes))

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()  # box AP, its files and the preview picture
        stats = self.panoptic_evaluator.compute()  # the same on every rank
        self.log_dict({f"val/{k}": v for k, v in stats.items() if k != "PQ"})
        self.log("val/PQ", stats["PQ"], prog_bar=True)
        per_category = self.panoptic_evaluator.per_category()
        self.per_category_tables["val/PQ_per_category"] = markdown_table(
            per_category, ("PQ", "SQ", "RQ", "TP", "FP", "FN")
        )
        predictions = gather_by_image_id(self._predictions)  # collective calls: every rank makes them
        log_dir = self.trainer.log_dir
        if self.trainer.sanity_checking or not self.trainer.is_global_zero or log_dir is None:
            return
        log_dir = Path(log_dir)
        categories = self.trainer.datamodule.categories
        write_panoptic_predictions(
            log_dir / f"{PREDICTIONS}.json", log_dir / PREDICTIONS, _decoded(predictions), categories
        )
        merge_metrics_json("panoptic", {**stats, "per_category": per_category}, log_dir / "metrics.json")
        rank_zero_info(
            f"step {self.global_step}: panoptic quality over {len(predictions)} images\n"
            f"{self.panoptic_evaluator.table(count=10)}\n"
            f"predictions: {log_dir / PREDICTIONS}.json and {log_dir / PREDICTIONS}/"
        )

    @torch.no_grad()
    def draw_prediction(self, image: torch.Tensor, datamodule: pl.LightningDataModule) -> torch.Tensor:
        """Segments ``image`` ``[3,H,W]`` uint8 (the datamodule's validation resize) and draws the
        segments coloured by class and outlined."""
        outputs, size = self.predict_image(image, datamodule)
        orig_size = torch.tensor([image.shape[-2:]], device=self.device)
        return self._draw(image, self._postprocess(outputs, size, orig_size, datamodule.is_thing)[0])


def _decoded(predictions: dict[int, dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The gathered predictions in image-id order, as ``write_panoptic_predictions`` takes them."""
    for image_id in sorted(predictions):
        record = predictions[image_id]
        yield {
            "image_id": image_id,
            "segment_ids": _segment_ids(record["png"]),
            "segments_info": record["segments_info"],
        }
