"""D-FINE (Peng et al., D-FINE: Redefine Regression Task of DETRs as Fine-grained Distribution Refinement, 2024):
RT-DETR whose decoder refines a distribution over each box edge's distance layer by layer (FDR), trained with
the fine-grained localisation loss and the last layer's self-distillation (GO-LSD)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from vision_tx.heads.detr.mlp import MLP
from vision_tx.heads.dfine.criterion import DFINECriterion
from vision_tx.heads.dfine.decoder import FDRDecoder, FDRDecoderLayer
from vision_tx.heads.dfine.encoder import GELANHybridEncoder
from vision_tx.models.dfine_official import convert_official_dfine, is_official_dfine
from vision_tx.models.query_detector import HybridEncoderDetector, decoder_outputs
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

    encoder_class = GELANHybridEncoder
    # Named sizes (``DetectionModule(detector=...)``): D-FINE-L's (the defaults below), and RT-DETR's toy size.
    variants: dict[str, dict[str, Any]] = {
        "dfine": {},
        "dfine_toy": dict(num_queries=30, hidden_dim=64, num_heads=4, encoder_feedforward=256, num_decoder_layers=3, dim_feedforward=256),
    }

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
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
    ) -> None:
        points = [num_points] * num_levels if isinstance(num_points, int) else list(num_points)
        if len(points) != num_levels:
            raise ValueError(f"{__name__}: num_points {points} must give one count per level ({num_levels})")
        super().__init__(backbone, num_classes, num_queries, False, num_detections, nms_threshold, share_scores)
        self.build_encoder(hidden_dim, num_heads, num_encoder_layers, encoder_feedforward, expansion, num_blocks, dropout, num_levels)
        for level in range(len(backbone.out_channels)):  # the encoder's maps are the decoder's levels as they are
            self.decoder_input_proj[level] = nn.Identity()
        self.decoder = FDRDecoder(
            FDRDecoderLayer(hidden_dim, num_heads, points, dim_feedforward, dropout), num_decoder_layers, hidden_dim,
            reg_max, reg_scale, up, lqe_top_k, lqe_hidden_dim, lqe_layers,
        )
        self.build_query_heads(num_classes, hidden_dim, num_decoder_layers)
        for layer in range(num_decoder_layers):  # the edges' distributions
            self.bbox_embed[layer] = MLP(hidden_dim, hidden_dim, 4 * (reg_max + 1), 3)
        self.query_embed = nn.Embedding(num_queries, hidden_dim) if learn_query_content else None
        criterion_kwargs = {"reg_max": reg_max, **(criterion_kwargs or {})}
        self.build_training_parts(
            hidden_dim, num_denoising, label_noise_ratio, box_noise_scale, 1e-5, DFINECriterion, matcher_kwargs, criterion_kwargs
        )

    def forward_decoder(self, levels: MultiScaleLevels, targets: list[dict] | None = None) -> dict:
        """Query selection from the memory ``levels``, the decoder and the heads: RT-DETR's outputs, every
        layer's (and the denoising layers') with ``pred_corners``, ``ref_points`` (the edges' origin), ``up`` and
        ``reg_scale``, and layer 0's direct boxes ``pre_outputs`` (``dn_pre_outputs``)."""
        memory = levels.tokens
        queries, boxes, proposal_logits, proposal_boxes = self.select_queries(levels)
        queries, boxes, attn_mask, denoising = self.with_denoising(queries, boxes, targets)
        decoded = self.decoder(
            queries, boxes, memory, levels.shapes, levels.padding_mask, levels.valid_ratios, self.class_embed, self.bbox_embed, attn_mask
        )
        outputs = decoder_outputs(decoded["logits"], decoded["boxes"], proposal_logits, proposal_boxes, denoising)
        split = 0 if denoising is None else denoising.content.shape[1]
        corners, initial = decoded["corners"], decoded["initial"]
        fixed = {"up": self.decoder.up, "reg_scale": self.decoder.reg_scale}
        for layer, outputs_layer in enumerate([*outputs["aux_outputs"], outputs]):
            outputs_layer.update(pred_corners=corners[layer, :, split:], ref_points=initial[:, split:], **fixed)
        outputs["pre_outputs"] = {"pred_logits": decoded["pre_logits"][:, split:], "pred_boxes": decoded["pre_boxes"][:, split:]}
        if denoising is not None:
            outputs["dn_outputs"].update(
                pred_corners=corners[:, :, :split], ref_points=initial[None, :, :split].expand(len(corners), -1, -1, -1),
                up=self.decoder.up.expand(len(corners), -1), reg_scale=self.decoder.reg_scale.expand(len(corners), -1),
            )
            outputs["dn_pre_outputs"] = {"pred_logits": decoded["pre_logits"][:, :split], "pred_boxes": decoded["pre_boxes"][:, :split]}
        return outputs

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reads Peterande/D-FINE checkpoints (see :func:`convert_official_dfine`); native keys pass."""
        return convert_official_dfine(state_dict, self) if is_official_dfine(state_dict) else dict(state_dict)
