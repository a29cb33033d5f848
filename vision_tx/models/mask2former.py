"""Mask2Former (Cheng et al., "Masked-attention Mask Transformer for Universal Image Segmentation", 2022):
one model for semantic, panoptic and instance segmentation on any backbone's pyramid."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import masks_to_boxes

from vision_tx.attention import record_attention
from vision_tx.backbones import build_backbone
from vision_tx.backbones.base import Backbone, norms_and_biases_and
from vision_tx.heads.mask2former import (
    Mask2FormerCriterion,
    MaskedAttentionDecoder,
    MaskHungarianMatcher,
    PixelDecoder,
    instance_inference,
    panoptic_inference,
    resize_masks,
    semantic_inference,
)
from vision_tx.heads.mask2former.postprocess import (  # the batch forms
    instance_detections,
    panoptic_segments,
)
from vision_tx.models.mask2former_official import convert_official_mask2former, is_official_mask2former


def semantic_targets(labels: torch.Tensor, ignore_index: int = 255) -> list[dict[str, torch.Tensor]]:
    """Label maps ``labels [B,H,W]`` -> per image ``{"labels" [K], "masks" bool [K,H,W]}``: one mask per class present
    (``ignore_index`` pixels belong to no mask), as the official semantic dataset mapper."""
    targets = []
    for label in labels:
        classes = label.unique()
        classes = classes[classes != ignore_index]
        targets.append({"labels": classes, "masks": label[None] == classes[:, None, None]})
    return targets


def mask_boxes(masks: torch.Tensor) -> torch.Tensor:
    """Bool ``masks [N,H,W]`` -> their boxes ``[N,4]`` (absolute xyxy, pixel edges; zeros for an empty mask)."""
    boxes = masks.new_zeros((len(masks), 4), dtype=torch.float32)
    present = masks.flatten(1).any(1)
    if present.any():
        boxes[present] = masks_to_boxes(masks[present]) + boxes.new_tensor([0.0, 0.0, 1.0, 1.0])
    return boxes


class Mask2Former(nn.Module):
    """``images [B,3,H,W]`` -> ``{"pred_logits" [B,Q,C+1], "pred_masks" [B,Q,H/4,W/4], "aux_outputs": [...]}``.

    A detector of the protocol (docs/CONVENTIONS.md, "Detectors"): the instance and panoptic tasks call
    ``forward(images, pixel_mask)``, ``loss``, ``postprocess`` (the instances with their masks' boxes) and
    ``postprocess_panoptic``; the semantic task calls ``predict``. The backbone must return four maps
    (strides 4 to 32 on the usual pyramid); the pixel decoder reads the last three with its deformable
    encoder and the first through its FPN step. The defaults are the paper's (100 queries, 9 decoder
    layers, 6 encoder layers, width 256). :meth:`loss` computes
    ``Mask2FormerCriterion(num_classes, MaskHungarianMatcher(**matcher_kwargs), **criterion_kwargs)`` (the
    matcher's costs are the criterion's weights when ``matcher_kwargs`` is not given, as the paper's) on mask
    targets or semantic label maps.
    """

    backbone_out_indices = (0, 1, 2, 3)
    score_threshold = 0.5  # pictures draw the instances scoring above it
    class_keys = (r"^predictor\.class_embed\.",)  # the tensors with a row per class (fine-tuning: load_weights)
    # Named sizes (``detector=`` or ``head=`` of the task modules): the paper's (the defaults below), and a
    # narrow one (width 64, 2 encoder and 3 decoder layers, 16 queries) that learns the toy sets on a CPU.
    variants: dict[str, dict[str, Any]] = {
        "mask2former": {},
        "mask2former_toy": dict(
            num_queries=16,
            hidden_dim=64,
            mask_dim=64,
            num_heads=4,
            num_decoder_layers=3,
            dim_feedforward=256,
            num_encoder_layers=2,
            encoder_dim_feedforward=256,
            num_groups=16,
        ),
    }

    def __init__(
        self,
        backbone: Backbone,
        num_classes: int,
        *,
        matcher_kwargs: dict[str, Any] | None = None,
        criterion_kwargs: dict[str, Any] | None = None,
        num_queries: int = 100,
        hidden_dim: int = 256,
        mask_dim: int = 256,
        num_heads: int = 8,
        num_decoder_layers: int = 9,
        dim_feedforward: int = 2048,
        num_encoder_layers: int = 6,
        encoder_dim_feedforward: int = 1024,
        num_points: int = 4,
        num_groups: int = 32,
        dropout: float = 0.0,
        ignore_index: int = 255,
        object_mask_threshold: float = 0.8,
        overlap_threshold: float = 0.8,
        test_topk: int = 100,
    ) -> None:
        super().__init__()
        channels = list(backbone.out_channels)
        if len(channels) != 4:
            raise ValueError(
                f"{__name__}: the backbone returns {len(channels)} maps, Mask2Former reads 4 (out_indices=(0, 1, 2, 3))"
            )
        self.backbone = backbone
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.object_mask_threshold, self.overlap_threshold, self.test_topk = (
            object_mask_threshold,
            overlap_threshold,
            test_topk,
        )
        self.pixel_decoder = PixelDecoder(
            channels,
            hidden_dim,
            mask_dim,
            num_encoder_layers,
            num_heads,
            num_points,
            encoder_dim_feedforward,
            dropout,
            num_groups=num_groups,
        )
        self.predictor = MaskedAttentionDecoder(
            hidden_dim,
            num_classes,
            hidden_dim,
            num_queries,
            num_heads,
            dim_feedforward,
            num_decoder_layers,
            mask_dim,
            dropout=dropout,
        )
        matcher = MaskHungarianMatcher(**matcher_kwargs) if matcher_kwargs else None
        self.criterion = Mask2FormerCriterion(num_classes, matcher, **(criterion_kwargs or {}))

    def forward(
        self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None, targets: list[dict] | None = None
    ) -> dict:
        """``images [B,3,H,W]``; ``pixel_mask [B,H,W]`` (True on padding) only records each image's unpadded
        ``sizes [B,2]`` in the outputs (as the official model, the network reads the padding as image);
        ``targets`` are not read. The outputs also hold the padded ``input_size`` (h, w)."""
        return self.decode(images, pixel_mask, *self.pixel_decoder(list(self.backbone(images).values())))

    def decode(
        self,
        images: torch.Tensor,
        pixel_mask: torch.Tensor | None,
        mask_features: torch.Tensor,
        levels: list[torch.Tensor],
    ) -> dict:
        """The masked-attention decoder's outputs from the pixel decoder's ``mask_features`` and ``levels``."""
        outputs = self.predictor(levels, mask_features)
        if pixel_mask is None:
            sizes = torch.tensor(list(images.shape[-2:]), device=images.device).repeat(
                images.shape[0], 1
            )  # no len(): see export.py
        else:
            sizes = torch.stack([(~pixel_mask[:, :, 0]).sum(1), (~pixel_mask[:, 0, :]).sum(1)], -1)
        return {**outputs, "sizes": sizes, "input_size": tuple(images.shape[-2:])}

    def loss(self, outputs: dict, targets: list[dict[str, torch.Tensor]] | torch.Tensor) -> dict[str, torch.Tensor]:
        """The set loss against ``targets`` (per image ``labels`` and bool ``masks``, top-left aligned, zero-padded
        here to the padded input; other keys, such as the pipeline's boxes, are not read) or label maps ``[B,H,W]``."""
        if isinstance(targets, torch.Tensor):
            targets = semantic_targets(targets, self.ignore_index)
        if "input_size" in outputs:
            height, width = outputs["input_size"]
            targets = [
                {**t, "masks": F.pad(t["masks"], (0, width - t["masks"].shape[-1], 0, height - t["masks"].shape[-2]))}
                for t in targets
            ]
        return self.criterion(outputs, targets)

    @torch.no_grad()
    def predict(
        self,
        images: torch.Tensor,
        mode: str = "whole",
        crop_size: Sequence[int] = (512, 512),
        stride: Sequence[int] = (341, 341),
        scales: Sequence[float] = (1.0,),
        flip: bool = False,
    ) -> torch.Tensor:
        """Semantic class scores ``[B,C,H,W]`` at the input size, averaged over ``scales`` and flips
        (the signature of ``UperNetSegmentor.predict``; only ``mode="whole"``)."""
        if mode != "whole":
            raise ValueError(f"{__name__}: inference mode {mode!r} is not supported, only 'whole'")
        size = images.shape[-2:]
        total = images.new_zeros(images.shape[0], self.num_classes, *size)
        for scale in scales:
            scaled = (
                images
                if scale == 1
                else F.interpolate(images, [int(s * scale + 0.5) for s in size], mode="bilinear", align_corners=False)
            )
            for flipped in (False, True) if flip else (False,):
                outputs = self(scaled.flip(-1) if flipped else scaled)
                masks = F.interpolate(
                    outputs["pred_masks"], size=scaled.shape[-2:], mode="bilinear", align_corners=False
                )
                scores = semantic_inference(outputs["pred_logits"], masks)
                scores = scores.flip(-1) if flipped else scores
                total += F.interpolate(scores, size=size, mode="bilinear", align_corners=False)
        return total / (len(scales) * (2 if flip else 1))

    detection_outputs = ("scores", "labels", "masks")  # the keys of :meth:`detections`, in the exported order

    def detections(self, outputs: dict, image_sizes: torch.Tensor) -> dict[str, torch.Tensor]:
        """Batch instances (export-safe, :func:`~vision_tx.heads.mask2former.postprocess.instance_detections`, what
        :meth:`postprocess` gives per image) with masks at the batch's input size (``outputs["input_size"]``: the
        exported model's images are unpadded, so ``image_sizes [B,2]`` is that size on every row)."""
        size = outputs["input_size"]
        masks = resize_masks(outputs["pred_masks"], size, size)
        return instance_detections(outputs["pred_logits"], masks, self.test_topk)

    def panoptic_segments(
        self, outputs: dict, size: tuple[int, int], thing: torch.Tensor, known: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Batch segment maps of unpadded images of ``size`` (h, w) (export-safe, what :meth:`postprocess_panoptic`
        gives per image: :func:`~vision_tx.heads.mask2former.postprocess.panoptic_segments`); ``thing``: bool by class,
        ``known`` unread (every class may form a segment)."""
        masks = resize_masks(outputs["pred_masks"], size, size)
        thresholds = self.object_mask_threshold, self.overlap_threshold
        return panoptic_segments(outputs["pred_logits"], masks, thing, *thresholds)

    def postprocess(self, outputs: dict, image_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Per image the instances (see ``postprocess_instances``) at ``image_sizes [B,2]`` (h, w), with their
        ``boxes [N,4]`` (absolute xyxy): the detection tasks' format."""
        results = self.postprocess_instances(outputs, outputs["sizes"], image_sizes)
        return [{**r, "boxes": mask_boxes(r["masks"])} for r in results]

    def postprocess_per_query(self, outputs: dict, image_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Every query's best real class, its probability and the box of its mask (positive logits at
        ``image_sizes [B,2]``), in query order (for per-query pictures)."""
        results = []
        for logits, masks in self._per_image(outputs, outputs["sizes"], image_sizes):
            scores, labels = logits.softmax(-1)[:, :-1].max(-1)
            results.append({"scores": scores, "labels": labels, "boxes": mask_boxes(masks > 0)})
        return results

    def cross_attention(self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None) -> dict[str, Any]:
        """The outputs for ``images [B,3,H,W]`` and the last decoder layer's masked cross-attention, averaged over
        heads: ``{"outputs": ..., "attention": [B, queries, h, w]}`` over the pyramid level that layer reads."""
        cross = self.predictor.layers[-1].cross_attn
        mask_features, levels = self.pixel_decoder(list(self.backbone(images).values()))
        with record_attention({"cross": cross}) as records:
            outputs = self.decode(images, pixel_mask, mask_features, levels)
        level = levels[(len(self.predictor.layers) - 1) % len(levels)]
        weights = records["cross"][-1].mean(1)  # [B, Q, h*w]
        return {"outputs": outputs, "attention": weights.unflatten(-1, level.shape[-2:])}

    def _per_image(self, outputs: dict, sizes: torch.Tensor, orig_sizes: torch.Tensor):
        for logits, masks, size, orig_size in zip(
            outputs["pred_logits"], outputs["pred_masks"], sizes.tolist(), orig_sizes.tolist()
        ):
            yield logits, resize_masks(masks, size, orig_size)

    def postprocess_panoptic(
        self, outputs: dict, sizes: torch.Tensor, orig_sizes: torch.Tensor, is_thing: Mapping[int, bool]
    ) -> list[dict]:
        """Per image ``{"segment_ids" [H0,W0], "segments_info"}`` (see ``panoptic_inference``); ``sizes`` and
        ``orig_sizes [B,2]``: (h, w) of the unpadded input and of the original image."""
        return [
            panoptic_inference(logits, masks, is_thing, self.object_mask_threshold, self.overlap_threshold)
            for logits, masks in self._per_image(outputs, sizes, orig_sizes)
        ]

    def postprocess_instances(
        self, outputs: dict, sizes: torch.Tensor, orig_sizes: torch.Tensor, thing_classes: set[int] | None = None
    ) -> list[dict[str, torch.Tensor]]:
        """Per image ``{"scores", "labels", "masks" bool [N,H0,W0]}`` (see ``instance_inference``)."""
        return [
            instance_inference(logits, masks, self.test_topk, thing_classes)
            for logits, masks in self._per_image(outputs, sizes, orig_sizes)
        ]

    @classmethod
    def for_conversion(cls, backbone: str, num_classes: int | None = None) -> Mask2Former:
        """The model an official checkpoint with backbone ``backbone`` loads into (COCO panoptic's 133 classes by
        default)."""
        return cls(build_backbone(backbone, out_indices=cls.backbone_out_indices), num_classes or 133)

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters the optimiser does not decay (timm's convention): norms, biases and the backbone's
        exemptions."""
        return norms_and_biases_and(self, "backbone")

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reads facebookresearch/Mask2Former checkpoints (see :func:`convert_official_mask2former`); native keys
        pass."""
        if not is_official_mask2former(state_dict):
            return dict(state_dict)
        return convert_official_mask2former(state_dict, self.backbone, len(self.pixel_decoder.lateral_convs))
