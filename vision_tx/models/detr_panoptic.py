"""DETR for panoptic segmentation (Carion et al., 2020, sec. 4.4): DETR plus a mask per query."""

from __future__ import annotations

import re
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from vision_tx.backbones.base import norms_and_biases_and
from vision_tx.heads.detr.mask_head import AttentionMaps, MaskHead
from vision_tx.heads.detr.postprocess import panoptic_segments, postprocess_panoptic, upsampled_masks

_REQUIRED_STRIDES = [4, 8, 16, 32]
# facebookresearch/detr's names (models/segmentation.py) -> this layout.
_OFFICIAL_HEAD_KEYS = [
    (r"^bbox_attention\.q_linear\.", "bbox_attention.q_proj."),
    (r"^bbox_attention\.k_linear\.", "bbox_attention.k_proj."),
    (r"^mask_head\.lay(\d)\.", lambda m: f"mask_head.blocks.{int(m[1]) - 1}.0."),
    (r"^mask_head\.gn(\d)\.", lambda m: f"mask_head.blocks.{int(m[1]) - 1}.1."),
    (r"^mask_head\.adapter(\d)\.", lambda m: f"mask_head.adapters.{int(m[1]) - 1}."),
    (r"^mask_head\.out_lay\.", "mask_head.out_conv."),
]


class DETRPanoptic(nn.Module):
    """DETR whose last decoder layer's queries also predict a mask each.

    ``detr`` is a :class:`~vision_tx.models.DETR` (built by the panoptic task from ``DETECTORS``, or by the
    converter): this model reads its ``forward_features``, ``predict``, ``input_proj`` and ``backbone``.
    Each query's attention maps over the encoder output (``bbox_attention``), with the projected
    stride-32 features, go through :class:`MaskHead`, which adds the backbone's stride 16, 8 and 4
    maps, so the backbone must return all four stages (``out_indices=(0, 1, 2, 3)``).
    ``freeze_detr=True`` freezes the detector, as in DETR's second training stage, where only the
    mask head learns; the frozen detector then runs without building a graph. ``postprocess_kwargs`` go
    to :meth:`postprocess_panoptic` (the signature of ``heads.detr.postprocess_panoptic`` holds their defaults).
    """

    class_keys = (r"^detr\.class_embed\.",)  # the tensors with a row per class (fine-tuning: load_weights)
    backbone_prefix = "detr.backbone."  # where the backbone's parameters sit

    def __init__(
        self,
        detr: nn.Module,
        freeze_detr: bool = False,
        num_attention_heads: int = 8,
        postprocess_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        channels = list(detr.backbone.out_channels)
        strides = list(getattr(detr.backbone, "strides", _REQUIRED_STRIDES[-len(channels) :]))
        if strides != _REQUIRED_STRIDES:
            raise ValueError(
                f"{__name__}: the mask head needs the backbone's maps at strides "
                f"{_REQUIRED_STRIDES} (out_indices=(0, 1, 2, 3)), but it returns strides {strides}"
            )
        self.detr = detr
        if freeze_detr:
            detr.requires_grad_(False)
        hidden_dim = detr.input_proj.out_channels
        self.bbox_attention = AttentionMaps(hidden_dim, hidden_dim, num_attention_heads)
        self.mask_head = MaskHead(hidden_dim + num_attention_heads, channels[2::-1], hidden_dim)
        self.postprocess_kwargs = dict(postprocess_kwargs or {})

    @property
    def num_classes(self) -> int:
        """The detector's real classes (its class head adds no-object)."""
        return self.detr.num_classes

    def forward(
        self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None, targets: list[dict] | None = None
    ) -> dict:
        """``images [B,3,H,W]``, ``pixel_mask [B,H,W]`` bool (True on padding) -> DETR's outputs plus
        ``"pred_masks"``: mask logits ``[B,Q,H/4,W/4]`` of the last decoder layer's queries."""
        detr_learns = torch.is_grad_enabled() and any(p.requires_grad for p in self.detr.parameters())
        with nullcontext() if detr_learns else torch.no_grad():
            features = self.detr.forward_features(images, pixel_mask)
            outputs = self.detr.predict(features.hidden)
        attention_maps = self.bbox_attention(features.hidden[-1], features.memory, features.mask)
        stride16, stride8, stride4 = features.backbone_maps[2::-1]
        outputs["pred_masks"] = self.mask_head(features.projected, attention_maps, [stride16, stride8, stride4])
        return outputs

    def loss(self, outputs: dict, targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """DETR's criterion, which adds the mask losses when ``outputs`` and ``targets`` hold masks."""
        return self.detr.loss(outputs, targets)

    def postprocess(self, outputs: dict, image_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """DETR's box detections (the panoptic segments come from ``postprocess_panoptic``)."""
        return self.detr.postprocess(outputs, image_sizes)

    @property
    def detection_outputs(self) -> tuple[str, ...]:
        """The keys of :meth:`detections`: DETR's."""
        return self.detr.detection_outputs

    def detections(self, outputs: dict, image_sizes: torch.Tensor) -> dict[str, torch.Tensor]:
        """DETR's batch box detections (see ``DETR.detections``)."""
        return self.detr.detections(outputs, image_sizes)

    def panoptic_segments(
        self, outputs: dict, size: tuple[int, int], thing: torch.Tensor, known: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Batch segment maps of unpadded images of ``size`` (h, w) (export-safe, what :meth:`postprocess_panoptic`
        gives per image: ``heads.detr.postprocess.panoptic_segments`` with ``postprocess_kwargs``); ``thing`` and
        ``known``: bool by class (``heads.detr.postprocess.thing_table``)."""
        masks = upsampled_masks(outputs["pred_masks"], size)
        return panoptic_segments(outputs["pred_logits"], masks, thing, known, **self.postprocess_kwargs)

    def postprocess_panoptic(
        self, outputs: dict, sizes: torch.Tensor, orig_sizes: torch.Tensor, is_thing: Mapping[int, bool]
    ) -> list[dict[str, Any]]:
        """Per image ``{"segment_ids" [H0,W0], "segments_info"}`` (see ``heads.detr.postprocess_panoptic``);
        ``sizes`` and ``orig_sizes [B,2]``: (h, w) of the unpadded input and of the original image."""
        return postprocess_panoptic(outputs, sizes, orig_sizes, is_thing, **self.postprocess_kwargs)

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters the optimiser does not decay (timm's convention): norms, biases and the detector's
        exemptions."""
        return norms_and_biases_and(self, "detr")

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reads facebookresearch/detr panoptic checkpoints (``detr-r50-panoptic-*.pth``); native keys pass.

        Their detector sits under ``detr.`` in DETR's official layout (converted by
        :meth:`DETR.convert_state_dict`); ``bbox_attention`` names its projections ``q_linear`` and
        ``k_linear``, and ``mask_head`` its layers ``lay1-5``, ``gn1-5``, ``adapter1-3`` and ``out_lay``.
        Keys outside ``bbox_attention`` and ``mask_head`` without the ``detr.`` prefix are read as
        the detector's too, so a detection checkpoint initialises the detector alone.
        """
        detector, converted = {}, {}
        for key, value in state_dict.items():
            if key.startswith(("bbox_attention.", "mask_head.")):
                for pattern, replacement in _OFFICIAL_HEAD_KEYS:
                    key = re.sub(pattern, replacement, key)
                converted[key] = value
            else:
                detector[key.removeprefix("detr.")] = value
        converted.update({f"detr.{k}": v for k, v in self.detr.convert_state_dict(detector).items()})
        return converted
