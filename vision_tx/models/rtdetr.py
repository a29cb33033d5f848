"""RT-DETR (Zhao et al., DETRs Beat YOLOs on Real-time Object Detection, 2024): a backbone, the efficient
hybrid encoder (attention within the top level, convolutional cross-scale fusion) and DINO's refining
deformable decoder, whose queries start from the encoder's best proposals (IoU-aware selection:
trained with the varifocal loss), with contrastive denoising."""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from vision_tx.backbones import build_backbone
from vision_tx.heads.detr.criterion import normalize_targets
from vision_tx.heads.dino.transformer import DeformableDecoder, DeformableDecoderLayer
from vision_tx.heads.rtdetr.criterion import RTDETRCriterion
from vision_tx.heads.rtdetr.hybrid_encoder import HybridEncoder
from vision_tx.models.query_detector import DeformableQueryDetector, checked_pixel_mask, decoder_outputs, select_proposals
from vision_tx.models.rtdetr_official import convert_official_rtdetr, is_official_rtdetr
from vision_tx.necks.multiscale import MultiScaleLevels, flatten_levels


class RTDETR(DeformableQueryDetector):
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
    layer's box head. Defaults: RT-DETR-R50's. ``nms_threshold`` adds per-class NMS to :meth:`postprocess`.
    :meth:`loss` computes ``RTDETRCriterion(num_classes, HungarianMatcher(**matcher_kwargs), **criterion_kwargs)``
    (RT-DETR's matcher and weights when not given).
    """

    backbone_out_indices = (1, 2, 3)  # strides 8, 16 and 32
    encoder_class = HybridEncoder
    score_threshold = 0.5  # for pictures (the official demo draws above 0.6)

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
    ) -> None:
        super().__init__(backbone, num_classes, num_queries, look_forward_twice, num_detections, nms_threshold)
        self.build_encoder(hidden_dim, num_heads, num_encoder_layers, encoder_feedforward, expansion, num_blocks, dropout, num_levels)
        self.decoder = DeformableDecoder(
            DeformableDecoderLayer(hidden_dim, num_heads, num_levels, num_points, dim_feedforward, dropout),
            num_decoder_layers, hidden_dim, query_pos_from_boxes=True, final_norm=False, eps=1e-5, box_encoding="linear",
        )
        self.build_query_heads(num_classes, hidden_dim, num_decoder_layers)
        self.query_embed = nn.Embedding(num_queries, hidden_dim) if learn_query_content else None
        # RT-DETR stores the noised boxes through inverse_sigmoid's default eps 1e-5, not DINO's 1e-3
        self.build_training_parts(
            hidden_dim, num_denoising, label_noise_ratio, box_noise_scale, 1e-5, RTDETRCriterion, matcher_kwargs, criterion_kwargs
        )

    def build_encoder(
        self, hidden_dim: int, num_heads: int, num_encoder_layers: int, encoder_feedforward: int, expansion: float,
        num_blocks: int, dropout: float, num_levels: int,
    ) -> None:
        """The hybrid encoder over the backbone's maps and the decoder's input projections (``num_levels`` levels)."""
        in_channels = list(self.backbone.out_channels)
        if num_levels < len(in_channels):
            raise ValueError(f"{type(self).__module__}: num_levels={num_levels} is below the {len(in_channels)} backbone maps")
        self.encoder = self.encoder_class(
            in_channels, hidden_dim, num_heads, encoder_feedforward, dropout, num_encoder_layers, expansion=expansion, num_blocks=num_blocks
        )
        projections = [nn.Sequential(nn.Conv2d(hidden_dim, hidden_dim, 1, bias=False), nn.BatchNorm2d(hidden_dim)) for _ in in_channels]
        projections += [
            nn.Sequential(nn.Conv2d(hidden_dim, hidden_dim, 3, 2, 1, bias=False), nn.BatchNorm2d(hidden_dim))
            for _ in range(num_levels - len(in_channels))
        ]
        self.decoder_input_proj = nn.ModuleList(projections)

    def forward(
        self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None, targets: list[dict[str, torch.Tensor]] | None = None
    ) -> dict:
        """``images [B,3,H,W]``, ``pixel_mask [B,H,W]`` (True on padding), ``targets`` (as for :meth:`loss`;
        used in training for the denoising queries) -> ``{"pred_logits" [B,Q,C], "pred_boxes" [B,Q,4],
        "aux_outputs", "enc_outputs"}`` and in training with targets ``"dn_outputs"``."""
        pixel_mask = checked_pixel_mask(images, pixel_mask, __name__)
        maps = self.encoder(list(self.backbone(images).values()), pixel_mask)
        targets = normalize_targets(targets) if self.training and targets is not None else None
        return self.forward_decoder(self.memory(maps, pixel_mask), targets)

    def memory(self, maps: list[torch.Tensor], pixel_mask: torch.Tensor) -> MultiScaleLevels:
        """The decoder's levels: the encoder's ``maps [B,D,h,w]`` projected (and the extra levels)."""
        levels = [projection(x) for projection, x in zip(self.decoder_input_proj, maps)]
        for projection in self.decoder_input_proj[len(maps):]:
            levels.append(projection(maps[-1] if len(levels) == len(maps) else levels[-1]))
        return flatten_levels(levels, pixel_mask)

    def forward_decoder(self, levels: MultiScaleLevels, targets: list[dict] | None = None) -> dict:
        """Query selection from the memory ``levels``, the decoder and the heads."""
        memory = levels.tokens
        features, top, proposal_logits, proposal_boxes = select_proposals(
            memory, levels, self.enc_output, self.enc_output_norm, self.class_embed[-1], self.bbox_embed[-1], self.num_queries
        )
        boxes = proposal_boxes.detach()
        if self.query_embed is None:
            queries = torch.gather(features, 1, top[..., None].expand(-1, -1, features.shape[-1])).detach()
        else:
            queries = self.query_embed.weight[None, : boxes.shape[1]].expand(len(boxes), -1, -1)
        logits, layer_boxes, denoising = self.decode(queries, None, boxes, memory, levels, targets)
        return decoder_outputs(logits, layer_boxes, proposal_logits, proposal_boxes, denoising)

    @classmethod
    def for_conversion(cls, backbone: str, num_classes: int | None = None) -> "RTDETR":
        """The model an official checkpoint with backbone ``backbone`` loads into (the official COCO models'
        80 classes, contiguous indices, by default)."""
        return cls(build_backbone(backbone, out_indices=cls.backbone_out_indices), num_classes or 80)

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reads lyuwenyu/RT-DETR checkpoints (see :func:`convert_official_rtdetr`); native keys pass."""
        return convert_official_rtdetr(state_dict, self) if is_official_rtdetr(state_dict) else dict(state_dict)
