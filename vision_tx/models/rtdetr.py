"""RT-DETR (Zhao et al., DETRs Beat YOLOs on Real-time Object Detection, 2024): a backbone, the efficient
hybrid encoder (attention within the top level, convolutional cross-scale fusion) and DINO's refining
deformable decoder, whose queries start from the encoder's best proposals (IoU-aware selection:
trained with the varifocal loss), with contrastive denoising."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vision_tx.heads.dino.denoising import ContrastiveDenoising
from vision_tx.heads.dino.transformer import DeformableDecoder, DeformableDecoderLayer
from vision_tx.heads.rtdetr.box_refinement import RoIBoxRefinement
from vision_tx.heads.rtdetr.criterion import RTDETRCriterion
from vision_tx.heads.rtdetr.hybrid_encoder import HybridEncoder
from vision_tx.models.query_detector import (
    HybridEncoderDetector,
    QueryHeads,
    decoder_outputs,
    denoising_queries,
    detector_criterion,
    level_projections,
    query_heads,
)
from vision_tx.models.rtdetr_official import convert_official_rtdetr, is_official_rtdetr
from vision_tx.necks.multiscale import MultiScaleLevels


class RTDETR(HybridEncoderDetector):
    """Detector over the backbone's stride 8, 16 and 32 maps, ``num_classes`` sigmoid logits per query.

    The hybrid encoder fuses the maps (``num_encoder_layers`` AIFI layers of ``encoder_feedforward``
    hidden units; CSP layers of ``num_blocks`` RepVGG blocks, ``expansion`` wide); each of its maps
    (and ``num_levels - 3`` lower ones, 3x3 stride-2 conv of the last) is projected by a 1x1 conv +
    BatchNorm into the decoder's memory. Every memory token scores a proposal box around its anchor;
    the ``num_queries`` best start the decoder: their boxes as reference boxes (no gradient), their
    projected tokens as content (no gradient; a learned embedding with ``learn_query_content``). The
    decoder's query position is an MLP of each layer's reference box. In training ``num_denoising``
    denoising queries (at most) reconstruct noised targets, and with ``look_forward_twice`` (the
    official code's; transformers' port has it off) each layer's box loss also trains the previous
    layer's box head. ``box_refinement`` adds a :class:`~vision_tx.heads.rtdetr.box_refinement.RoIBoxRefinement` of
    the matching queries' last boxes (detached) from the stride-8 memory: its boxes are the detector's, scored by the
    last layer's logits, and the last layer's become one more auxiliary output (not in the paper). Defaults:
    RT-DETR-R50's. ``nms_threshold`` adds per-class NMS to :meth:`postprocess`;
    ``share_scores`` scores each class by its share of the query's class probabilities (off: the paper's scores; see
    :func:`~vision_tx.heads.detr.postprocess.sigmoid_scores`).
    :meth:`loss` computes ``RTDETRCriterion(num_classes, HungarianMatcher(**matcher_kwargs), **criterion_kwargs)``
    (RT-DETR's matcher and weights when not given).
    """

    # Named sizes (``DetectionModule(detector=...)``): RT-DETR-R50's (the defaults below), and a narrow one
    # (width 64, a 3-layer decoder, 30 queries) that learns the toy sets on a CPU in minutes.
    variants: dict[str, dict[str, Any]] = {
        "rtdetr": {},
        "rtdetr_toy": dict(
            num_queries=30,
            hidden_dim=64,
            num_heads=4,
            encoder_feedforward=256,
            num_decoder_layers=3,
            dim_feedforward=256,
        ),
    }

    @classmethod
    def build(
        cls,
        backbone: nn.Module,
        num_classes: int,
        *,
        num_queries: int = 300,
        hidden_dim: int = 256,
        num_heads: int = 8,
        num_encoder_layers: int = 1,
        encoder_feedforward: int = 1024,
        expansion: float = 1.0,
        num_blocks: int = 3,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 1024,
        dropout: float = 0.0,
        num_levels: int = 3,
        num_points: int = 4,
        learn_query_content: bool = False,
        num_denoising: int = 100,
        label_noise_ratio: float = 0.5,
        box_noise_scale: float = 1.0,
        look_forward_twice: bool = True,
        matcher_kwargs: dict[str, Any] | None = None,
        criterion_kwargs: dict[str, Any] | None = None,
        num_detections: int = 300,
        nms_threshold: float | None = None,
        share_scores: bool = False,
        box_refinement: bool = False,
    ) -> RTDETR:
        """RT-DETR over ``backbone`` (its stride 8, 16 and 32 maps) from the settings above (a size of ``variants``)."""
        in_channels = list(backbone.out_channels)
        return cls(
            backbone=backbone,
            encoder=HybridEncoder(
                in_channels,
                dim=hidden_dim,
                num_heads=num_heads,
                dim_feedforward=encoder_feedforward,
                dropout=dropout,
                num_encoder_layers=num_encoder_layers,
                expansion=expansion,
                num_blocks=num_blocks,
            ),
            decoder_input_proj=level_projections(
                hidden_dim=hidden_dim, num_maps=len(in_channels), num_levels=num_levels
            ),
            decoder=DeformableDecoder(
                DeformableDecoderLayer(
                    dim=hidden_dim,
                    num_heads=num_heads,
                    num_levels=num_levels,
                    num_points=num_points,
                    dim_feedforward=dim_feedforward,
                    dropout=dropout,
                ),
                num_layers=num_decoder_layers,
                dim=hidden_dim,
                query_pos_from_boxes=True,
                final_norm=False,
                eps=1e-5,
                box_encoding="linear",
            ),
            heads=query_heads(num_classes=num_classes, hidden_dim=hidden_dim, num_decoder_layers=num_decoder_layers),
            query_embed=nn.Embedding(num_queries, hidden_dim) if learn_query_content else None,
            box_refinement=RoIBoxRefinement(hidden_dim) if box_refinement else None,
            # RT-DETR stores the noised boxes through inverse_sigmoid's default eps 1e-5, not DINO's 1e-3
            denoising=denoising_queries(
                num_classes=num_classes,
                hidden_dim=hidden_dim,
                num_denoising=num_denoising,
                label_noise_ratio=label_noise_ratio,
                box_noise_scale=box_noise_scale,
                eps=1e-5,
            ),
            criterion=detector_criterion(
                RTDETRCriterion,
                num_classes=num_classes,
                matcher_kwargs=matcher_kwargs,
                criterion_kwargs=criterion_kwargs,
            ),
            num_classes=num_classes,
            num_queries=num_queries,
            look_forward_twice=look_forward_twice,
            num_detections=num_detections,
            nms_threshold=nms_threshold,
            share_scores=share_scores,
        )

    def __init__(
        self,
        *,
        backbone: nn.Module,
        encoder: nn.Module,
        decoder_input_proj: nn.ModuleList,
        decoder: DeformableDecoder,
        heads: QueryHeads,
        query_embed: nn.Embedding | None,
        box_refinement: RoIBoxRefinement | None,
        denoising: ContrastiveDenoising | None,
        criterion: nn.Module,
        num_classes: int,
        num_queries: int,
        look_forward_twice: bool,
        num_detections: int,
        nms_threshold: float | None,
        share_scores: bool,
    ) -> None:
        """RT-DETR from its parts (what :meth:`build` makes) and settings (see the class)."""
        super().__init__(
            num_classes=num_classes,
            num_queries=num_queries,
            look_forward_twice=look_forward_twice,
            num_detections=num_detections,
            nms_threshold=nms_threshold,
            share_scores=share_scores,
        )
        self.backbone = backbone
        self.encoder = encoder
        self.decoder_input_proj = decoder_input_proj
        self.decoder = decoder
        self.class_embed, self.bbox_embed, self.enc_output, self.enc_output_norm = heads
        self.query_embed = query_embed
        self.box_refinement = box_refinement
        self.denoising = denoising
        self.criterion = criterion

    def forward_decoder(self, levels: MultiScaleLevels, targets: list[dict] | None = None) -> dict:
        """Query selection from the memory ``levels``, the decoder and the heads."""
        queries, boxes, proposal_logits, proposal_boxes = self.select_queries(levels)
        logits, layer_boxes, denoising = self.decode(queries, None, boxes, levels.tokens, levels, targets)
        if self.box_refinement is not None:
            num_denoising = 0 if denoising is None else denoising.content.shape[1]
            logits, layer_boxes = self.with_refined_boxes(logits, layer_boxes, levels, num_denoising)
        return decoder_outputs(logits, layer_boxes, proposal_logits, proposal_boxes, denoising)

    def with_refined_boxes(
        self, logits: torch.Tensor, layer_boxes: torch.Tensor, levels: MultiScaleLevels, num_denoising: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``logits [L,B,N+Q,C]`` and ``layer_boxes [L,B,N+Q,4]`` (the ``N = num_denoising`` queries first) with one
        more layer: the ``Q`` matching queries' last boxes refined from the finest memory level, the denoising
        queries' repeated (refining them too costs as much again and did not pay on the toy set), all without their
        gradient, scored by the last layer's logits."""
        height, width = levels.shapes[0]
        finest = levels.tokens[:, : height * width].transpose(1, 2).unflatten(2, (height, width))
        last = layer_boxes[-1].detach()
        refined = self.box_refinement(last[:, num_denoising:], finest, levels.valid_ratios[:, 0])
        return torch.cat([logits, logits[-1:]]), torch.cat(
            [layer_boxes, torch.cat([last[:, :num_denoising], refined], 1)[None]]
        )

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reads lyuwenyu/RT-DETR checkpoints (see :func:`convert_official_rtdetr`); native keys pass."""
        return convert_official_rtdetr(state_dict, self) if is_official_rtdetr(state_dict) else dict(state_dict)
