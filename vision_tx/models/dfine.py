"""D-FINE (Peng et al., D-FINE: Redefine Regression Task of DETRs as Fine-grained Distribution Refinement, 2024):
RT-DETR whose decoder refines a distribution over each box edge's distance layer by layer (FDR), trained with
the fine-grained localisation loss and the last layer's self-distillation (GO-LSD)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from vision_tx.heads.dfine.criterion import DFINECriterion
from vision_tx.heads.dfine.decoder import FDRDecoder, FDRDecoderLayer
from vision_tx.heads.dfine.encoder import GELANHybridEncoder
from vision_tx.heads.dino.denoising import ContrastiveDenoising
from vision_tx.models.dfine_official import convert_official_dfine, is_official_dfine
from vision_tx.models.query_detector import (
    HybridEncoderDetector,
    QueryHeads,
    decoder_outputs,
    denoising_queries,
    detector_criterion,
    level_projections,
    query_heads,
)
from vision_tx.necks.multiscale import MultiScaleLevels


class DFINE(HybridEncoderDetector):
    """RT-DETR's detector (backbone, hybrid encoder, query selection, denoising) with D-FINE's decoder
    (:class:`~vision_tx.heads.dfine.decoder.FDRDecoder`): each layer's box head predicts ``4 * (reg_max + 1)``
    edge logits, ``num_points`` deformable samples per head and level (a list: per level), a location-quality
    term (``lqe_*``) added to the class logits, and :class:`~vision_tx.heads.dfine.DFINECriterion` (its FGL and
    DDF weights in ``criterion_kwargs``). Defaults: D-FINE-L's (Peterande/D-FINE
    ``configs/dfine/include/dfine_hgnetv2.yml`` and ``src/zoo/dfine/dfine_decoder.py``): hidden 256, 6 layers,
    300 queries, points 3, 6, 3, ``reg_max`` 32, ``reg_scale`` 4, ``up`` 0.5, LQE top 4 of 64 hidden units in 2
    layers; the encoder's fusion blocks are GELAN blocks (:class:`~vision_tx.heads.dfine.encoder.GELANHybridEncoder`,
    ``expansion`` 1 and ``num_blocks`` 3 for D-FINE-L's ``depth_mult`` 1). The encoder's maps enter the decoder
    unprojected (its extra levels, beyond 3, are RT-DETR's strided convolutions). Every decoder layer is
    evaluated (``eval_idx`` -1, ``layer_scale`` 1, the official defaults). ``nms_threshold`` and ``share_scores``
    as RT-DETR's.
    """

    # Named sizes (``DetectionModule(detector=...)``): D-FINE-L's (the defaults below), and RT-DETR's toy size.
    variants: dict[str, dict[str, Any]] = {
        "dfine": {},
        "dfine_toy": dict(
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
        num_points: int | Sequence[int] = (3, 6, 3),
        reg_max: int = 32,
        reg_scale: float = 4.0,
        up: float = 0.5,
        lqe_top_k: int = 4,
        lqe_hidden_dim: int = 64,
        lqe_layers: int = 2,
        learn_query_content: bool = False,
        num_denoising: int = 100,
        label_noise_ratio: float = 0.5,
        box_noise_scale: float = 1.0,
        matcher_kwargs: dict[str, Any] | None = None,
        criterion_kwargs: dict[str, Any] | None = None,
        num_detections: int = 300,
        nms_threshold: float | None = None,
        share_scores: bool = False,
    ) -> DFINE:
        """D-FINE over ``backbone`` (its stride 8, 16 and 32 maps) from the settings above (a size of ``variants``)."""
        points = [num_points] * num_levels if isinstance(num_points, int) else list(num_points)
        if len(points) != num_levels:
            raise ValueError(f"{__name__}: num_points {points} must give one count per level ({num_levels})")
        in_channels = list(backbone.out_channels)
        return cls(
            backbone=backbone,
            encoder=GELANHybridEncoder(
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
                hidden_dim=hidden_dim, num_maps=len(in_channels), num_levels=num_levels, project_maps=False
            ),
            decoder=FDRDecoder(
                FDRDecoderLayer(
                    dim=hidden_dim,
                    num_heads=num_heads,
                    num_points=points,
                    dim_feedforward=dim_feedforward,
                    dropout=dropout,
                ),
                num_layers=num_decoder_layers,
                dim=hidden_dim,
                reg_max=reg_max,
                reg_scale=reg_scale,
                up=up,
                lqe_top_k=lqe_top_k,
                lqe_hidden_dim=lqe_hidden_dim,
                lqe_layers=lqe_layers,
            ),
            heads=query_heads(  # each layer's box head gives the distributions of the four edges
                num_classes=num_classes,
                hidden_dim=hidden_dim,
                num_decoder_layers=num_decoder_layers,
                layer_box_outputs=4 * (reg_max + 1),
            ),
            query_embed=nn.Embedding(num_queries, hidden_dim) if learn_query_content else None,
            denoising=denoising_queries(
                num_classes=num_classes,
                hidden_dim=hidden_dim,
                num_denoising=num_denoising,
                label_noise_ratio=label_noise_ratio,
                box_noise_scale=box_noise_scale,
                eps=1e-5,
            ),
            criterion=detector_criterion(
                DFINECriterion,
                num_classes=num_classes,
                matcher_kwargs=matcher_kwargs,
                criterion_kwargs={"reg_max": reg_max, **(criterion_kwargs or {})},
            ),
            num_classes=num_classes,
            num_queries=num_queries,
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
        decoder: FDRDecoder,
        heads: QueryHeads,
        query_embed: nn.Embedding | None,
        denoising: ContrastiveDenoising | None,
        criterion: nn.Module,
        num_classes: int,
        num_queries: int,
        num_detections: int,
        nms_threshold: float | None,
        share_scores: bool,
    ) -> None:
        """D-FINE from its parts (what :meth:`build` makes) and settings (see the class)."""
        super().__init__(
            num_classes=num_classes,
            num_queries=num_queries,
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
        self.denoising = denoising
        self.criterion = criterion

    def forward_decoder(self, levels: MultiScaleLevels, targets: list[dict] | None = None) -> dict:
        """Query selection from the memory ``levels``, the decoder and the heads: RT-DETR's outputs, every
        layer's (and the denoising layers') with ``pred_corners``, ``ref_points`` (the edges' origin), ``up`` and
        ``reg_scale``, and layer 0's direct boxes ``pre_outputs`` (``dn_pre_outputs``)."""
        memory = levels.tokens
        queries, boxes, proposal_logits, proposal_boxes = self.select_queries(levels)
        queries, boxes, attn_mask, denoising = self.with_denoising(queries, boxes, targets)
        decoded = self.decoder(
            queries,
            boxes,
            memory,
            levels.shapes,
            levels.padding_mask,
            levels.valid_ratios,
            self.class_embed,
            self.bbox_embed,
            attn_mask,
        )
        outputs = decoder_outputs(decoded["logits"], decoded["boxes"], proposal_logits, proposal_boxes, denoising)
        split = 0 if denoising is None else denoising.content.shape[1]
        corners, initial = decoded["corners"], decoded["initial"]
        fixed = {"up": self.decoder.up, "reg_scale": self.decoder.reg_scale}
        for layer, outputs_layer in enumerate([*outputs["aux_outputs"], outputs]):
            outputs_layer.update(pred_corners=corners[layer, :, split:], ref_points=initial[:, split:], **fixed)
        outputs["pre_outputs"] = {
            "pred_logits": decoded["pre_logits"][:, split:],
            "pred_boxes": decoded["pre_boxes"][:, split:],
        }
        if denoising is not None:
            outputs["dn_outputs"].update(
                pred_corners=corners[:, :, :split],
                ref_points=initial[None, :, :split].expand(len(corners), -1, -1, -1),
                up=self.decoder.up.expand(len(corners), -1),
                reg_scale=self.decoder.reg_scale.expand(len(corners), -1),
            )
            outputs["dn_pre_outputs"] = {
                "pred_logits": decoded["pre_logits"][:, :split],
                "pred_boxes": decoded["pre_boxes"][:, :split],
            }
        return outputs

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reads Peterande/D-FINE checkpoints (see :func:`convert_official_dfine`); native keys pass."""
        return convert_official_dfine(state_dict, self) if is_official_dfine(state_dict) else dict(state_dict)
