"""DETR (Carion et al., 2020): a backbone, a transformer and set prediction of boxes and classes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.attention import record_attention
from vision_tx.backbones import build_backbone
from vision_tx.backbones.base import norms_and_biases_and
from vision_tx.heads.detr.criterion import SetCriterion, normalize_targets
from vision_tx.heads.detr.matcher import HungarianMatcher
from vision_tx.heads.detr.mlp import MLP
from vision_tx.heads.detr.postprocess import checked_sizes, per_image, postprocess_detections, softmax_detections
from vision_tx.heads.detr.transformer import Transformer
from vision_tx.models.query_detector import checked_pixel_mask
from vision_tx.necks.position_encoding import SinePositionEncoding
from vision_tx.ops.conv import Conv2d


@dataclass
class DETRFeatures:
    """DETR's intermediate tensors (``h, w``: the last backbone map's size), e.g. for a mask head."""

    backbone_maps: list[torch.Tensor]  # the backbone's maps, highest resolution first
    projected: torch.Tensor  # [B,D,h,w] the last map after input_proj: the encoder's input
    memory: torch.Tensor  # [B,D,h,w] the encoder's output
    hidden: torch.Tensor  # [L,B,Q,D] every decoder layer's normalised output
    mask: torch.Tensor  # [B,h,w] bool, True on padding


class DETR(nn.Module):
    """End-to-end detector: ``num_queries`` learned queries each predict one box and class.

    ``num_classes`` follows DETR: labels are the dataset's category ids, so the class head has
    ``num_classes`` real classes (``max_id + 1``, 91 for COCO) plus a last no-object class.
    ``backbone`` is any module returning an ordered dict of feature maps with ``out_channels``;
    DETR uses its last (lowest-resolution) map. :meth:`loss` computes ``SetCriterion(num_classes,
    HungarianMatcher(**matcher_kwargs), **criterion_kwargs)`` (the paper's defaults when not given).
    ``grad_checkpointing`` recomputes the transformer layers' activations in the backward pass (the backbone has its
    own option).
    """

    backbone_out_indices = (3,)  # the last stage only
    score_threshold = 0.5  # the score above which pictures draw a detection (softmax over classes)
    class_keys = (r"^class_embed\.",)  # the tensors with a row per class (fine-tuning: load_weights)
    # Named sizes (``DetectionModule(detector=...)``): the paper's (the defaults below), and a narrow, shallow
    # one without dropout that learns the toy sets on a CPU in minutes (10 queries: at most 3 objects an image).
    variants: dict[str, dict[str, Any]] = {
        "detr": {},
        "detr_toy": dict(
            num_queries=10,
            hidden_dim=128,
            num_heads=4,
            num_encoder_layers=2,
            num_decoder_layers=2,
            dim_feedforward=512,
            dropout=0.0,
        ),
    }

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        num_queries: int = 100,
        hidden_dim: int = 256,
        num_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        aux_loss: bool = True,
        matcher_kwargs: dict[str, Any] | None = None,
        criterion_kwargs: dict[str, Any] | None = None,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        matcher = HungarianMatcher(**matcher_kwargs) if matcher_kwargs else None
        self.criterion = SetCriterion(num_classes, matcher, **(criterion_kwargs or {}))
        self.num_classes = num_classes
        self.aux_loss = aux_loss
        self.input_proj = Conv2d(backbone.out_channels[-1], hidden_dim, kernel_size=1)
        self.position_encoding = SinePositionEncoding(hidden_dim // 2)
        self.transformer = Transformer(
            hidden_dim, num_heads, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout, grad_checkpointing
        )
        self.query_embed = nn.Embedding(num_queries, hidden_dim)
        self.class_embed = nn.Linear(hidden_dim, num_classes + 1)
        self.bbox_embed = MLP(hidden_dim, hidden_dim, 4, num_layers=3)

    def forward(
        self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None, targets: list[dict] | None = None
    ) -> dict:
        """``images [B,3,H,W]``, ``pixel_mask [B,H,W]`` bool (True on padding; None: no padding) ->
        ``{"pred_logits": [B,Q,C+1], "pred_boxes": [B,Q,4] normalised cxcywh, "aux_outputs": [...]}``.

        ``aux_outputs`` (with ``aux_loss``) holds the same two keys for each earlier decoder layer.
        ``targets`` is accepted as every detector's is, and unused: DETR's queries do not depend on them.
        """
        return self.predict(self.forward_features(images, pixel_mask).hidden)

    def loss(self, outputs: dict, targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The criterion's losses for the outputs of :meth:`forward`; ``targets`` as the data pipeline gives
        them (normalised here, see :func:`~vision_tx.heads.detr.normalize_targets`)."""
        return self.criterion(outputs, normalize_targets(targets))

    detection_outputs = ("boxes", "scores", "labels")  # the keys of :meth:`detections`, in the exported order

    def detections(self, outputs: dict, image_sizes: torch.Tensor) -> dict[str, torch.Tensor]:
        """Batch detections in pixels of images of ``image_sizes [B,2]`` (h, w), one per query (export-safe,
        :func:`~vision_tx.heads.detr.postprocess.softmax_detections`)."""
        return softmax_detections(outputs, image_sizes)

    @torch.no_grad()
    def postprocess(self, outputs: dict, image_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Detections in pixels of images of ``image_sizes [B,2]`` (h, w): ``scores``, ``labels``, xyxy ``boxes``
        (:meth:`detections` per image)."""
        return per_image(self.detections(outputs, checked_sizes(image_sizes, outputs)))

    def postprocess_per_query(self, outputs: dict, image_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Every query's detection, in query order (:meth:`postprocess` already keeps one per query)."""
        return postprocess_detections(outputs, image_sizes)

    @torch.no_grad()
    def cross_attention(self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None) -> dict[str, Any]:
        """The outputs for ``images [B,3,H,W]`` and the last decoder layer's cross-attention, averaged over
        heads: ``{"outputs": ..., "attention": [B, queries, h, w]}`` over the encoder's feature grid."""
        cross = self.transformer.decoder.layers[-1].cross_attn
        with record_attention({"cross": cross}) as records:
            features = self.forward_features(images, pixel_mask)
        outputs = self.predict(features.hidden)
        weights = records["cross"][-1].mean(1)  # [B, Q, h*w]
        return {"outputs": outputs, "attention": weights.unflatten(-1, features.mask.shape[-2:])}

    @classmethod
    def for_conversion(cls, backbone: str, num_classes: int | None = None) -> DETR:
        """The model an official checkpoint with backbone ``backbone`` loads into (COCO's 91 classes by default)."""
        return cls(build_backbone(backbone), num_classes or 91)

    def forward_features(self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None) -> DETRFeatures:
        """Backbone, input projection and transformer: everything before the prediction heads."""
        pixel_mask = checked_pixel_mask(images, pixel_mask, __name__)
        backbone_maps = list(self.backbone(images).values())
        mask = F.interpolate(pixel_mask[None].float(), size=backbone_maps[-1].shape[-2:])[0].bool()
        projected = self.input_proj(backbone_maps[-1])
        src = projected.flatten(2).transpose(1, 2)
        pos = self.position_encoding(mask).flatten(1, 2).to(src.dtype)
        hidden, memory = self.transformer(src, mask.flatten(1), pos, self.query_embed.weight)
        return DETRFeatures(backbone_maps, projected, memory.transpose(1, 2).unflatten(2, mask.shape[1:]), hidden, mask)

    def predict(self, hidden: torch.Tensor) -> dict:
        """Class and box heads on the decoder outputs ``hidden [L,B,Q,D]``: the dict :meth:`forward` returns."""
        if not self.aux_loss:
            hidden = hidden[-1:]
        logits = self.class_embed(hidden)
        boxes = self.bbox_embed(hidden).sigmoid()
        outputs = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.aux_loss:
            outputs["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])]
        return outputs

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters the optimiser does not decay (timm's convention): norms, biases and the backbone's
        exemptions."""
        return norms_and_biases_and(self, "backbone")

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reads facebookresearch/detr checkpoints (e.g. ``detr-r50-e632da11.pth``); native keys pass.

        Official names differ in two places: the backbone sits under ``backbone.0.body.`` in
        torchvision's layout (renamed by the backbone's own ``convert_state_dict``), and the decoder's
        cross-attention is ``multihead_attn``. The rest (``input_proj``, ``query_embed``,
        ``transformer.*`` with ``nn.MultiheadAttention``'s parameter names, ``class_embed``,
        ``bbox_embed.layers.*``) is this layout already.
        """
        backbone_state, converted = {}, {}
        for key, value in state_dict.items():
            if key.startswith("backbone."):
                backbone_state[key.removeprefix("backbone.").removeprefix("0.body.")] = value
            else:
                converted[key.replace(".multihead_attn.", ".cross_attn.")] = value
        convert_backbone = getattr(self.backbone, "convert_state_dict", None)
        if convert_backbone is not None:
            backbone_state = convert_backbone(backbone_state)
        converted.update({f"backbone.{k}": v for k, v in backbone_state.items()})
        return converted
