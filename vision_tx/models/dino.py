"""DINO (Zhang et al., 2022): a backbone, a multi-scale neck and a deformable transformer whose queries
start from the encoder's best proposals, trained with contrastive denoising.

With ``query_selection="two_stage"`` and ``num_denoising=0`` it is Deformable DETR (Zhu et al., 2021)
with two-stage proposals and iterative box refinement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vision_tx.backbones import build_backbone
from vision_tx.heads.detr.criterion import normalize_targets
from vision_tx.heads.dino.criterion import DINOCriterion
from vision_tx.heads.dino.denoising import ContrastiveDenoising
from vision_tx.heads.dino.transformer import (
    DeformableDecoder,
    DeformableDecoderLayer,
    DeformableEncoder,
    DeformableEncoderLayer,
    box_sine_embedding,
)
from vision_tx.models.dino_official import convert_official_dino, is_official_dino
from vision_tx.models.query_detector import (
    DeformableQueryDetector,
    QueryHeads,
    checked_pixel_mask,
    decoder_outputs,
    denoising_queries,
    detector_criterion,
    query_heads,
    select_proposals,
)
from vision_tx.necks.multiscale import MultiScaleLevels, MultiScaleProjection

QUERY_SELECTIONS = ("mixed", "two_stage")


class DINO(DeformableQueryDetector):
    """Detector over the backbone's maps (e.g. strides 8, 16, 32) and ``num_levels`` levels in all.

    ``num_classes`` sigmoid logits per query (labels are category ids, so ``max_id + 1``; no
    no-object class). The encoder scores every token as a proposal box around its pixel; the
    ``num_queries`` best become the decoder's initial boxes. ``query_selection``: ``"mixed"`` (DINO)
    takes the content of the queries from a learned embedding and their position from their boxes
    at every layer; ``"two_stage"`` (Deformable DETR) takes both from the proposals' boxes, ranked
    by a class-agnostic score. In training, denoising queries reconstruct noised targets:
    ``num_denoising`` is the official ``dn_number``, ``num_denoising // K`` groups of ``K`` positive and
    ``K`` negative queries for at most ``K`` targets per image (:class:`ContrastiveDenoising`);
    ``look_forward_twice`` lets each layer's box loss reach the previous layer's box head.
    Defaults: DINO's 4-scale setting as the official training command runs it (IDEA-Research/DINO
    ``scripts/DINO_train.sh``: ``config/DINO/DINO_4scale.py`` with ``dn_box_noise_scale=1.0``, which
    overrides the config file's 0.4), with its sine position encoding (``position_temperature`` 20,
    ``position_offset`` 0), the decoder's final LayerNorm (``decoder_norm``) and ``inverse_sigmoid_eps``
    1e-3; Deformable DETR's are 10000, -0.5, no norm and 1e-5. :meth:`postprocess` keeps the
    ``num_detections`` best (query, class) pairs, 300 as the config's ``num_select`` (Deformable DETR keeps 100;
    COCO's evaluation keeps up to 100 an image per class, so the 300 lift its AP). ``nms_threshold`` (off by default,
    as in the paper) adds per-class non-maximum suppression to :meth:`postprocess`, for short trainings
    whose queries still duplicate each other; ``share_scores`` as RT-DETR's. ``exact_valid_ratios`` (off: the official
    convention) places a box coordinate on each level through the image's exact share of the pixels the level's cells
    cover, as RT-DETR does (docs/RTDETR.md), in place of the share of cells the padding mask leaves valid: for images
    padded to their batch at a few hundred pixels, where a coarse cell is a large part of the image. :meth:`loss`
    computes ``DINOCriterion(num_classes, HungarianMatcher(**matcher_kwargs), **criterion_kwargs)`` (DINO's matcher and
    weights when not given).
    """

    backbone_out_indices = (1, 2, 3)  # strides 8, 16 and 32
    score_threshold = 0.3  # for pictures: sigmoid scores run lower (the official DINO demo draws above 0.3)
    # Named sizes (``DetectionModule(detector=...)``): the defaults below, and a narrow one (width 64, 2 + 3
    # layers, 30 queries) that learns the toy sets on a CPU in minutes.
    variants: dict[str, dict[str, Any]] = {
        "dino": {},
        "dino_toy": dict(
            num_queries=30,
            hidden_dim=64,
            num_heads=4,
            num_encoder_layers=2,
            num_decoder_layers=3,
            dim_feedforward=256,
            num_detections=100,  # the toy figures in docs/LEARNING.md were measured with 100
        ),
    }

    @classmethod
    def build(
        cls,
        backbone: nn.Module,
        num_classes: int,
        *,
        num_queries: int = 900,
        hidden_dim: int = 256,
        num_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.0,
        num_levels: int = 4,
        num_points: int = 4,
        query_selection: str = "mixed",
        num_denoising: int = 100,
        label_noise_ratio: float = 0.5,
        box_noise_scale: float = 1.0,
        look_forward_twice: bool = True,
        position_temperature: float = 20.0,
        position_offset: float = 0.0,
        decoder_norm: bool = True,
        inverse_sigmoid_eps: float = 1e-3,
        matcher_kwargs: dict[str, Any] | None = None,
        criterion_kwargs: dict[str, Any] | None = None,
        num_detections: int = 300,
        nms_threshold: float | None = None,
        share_scores: bool = False,
        exact_valid_ratios: bool = False,
    ) -> DINO:
        """DINO over ``backbone`` (its stride 8, 16 and 32 maps) from the settings above (a size of ``variants``)."""
        if query_selection not in QUERY_SELECTIONS:
            raise ValueError(f"{__name__}: query_selection must be one of {QUERY_SELECTIONS}, got {query_selection!r}")
        if query_selection == "two_stage" and num_denoising:
            raise ValueError(f"{__name__}: denoising needs query_selection='mixed' (set num_denoising=0)")
        two_stage = query_selection == "two_stage"
        neck = MultiScaleProjection(
            backbone.out_channels, hidden_dim, num_levels, temperature=position_temperature, offset=position_offset
        )
        layer = dict(
            dim=hidden_dim,
            num_heads=num_heads,
            num_levels=num_levels,
            num_points=num_points,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
        )
        encoder = DeformableEncoder(DeformableEncoderLayer(**layer), num_layers=num_encoder_layers)
        decoder = DeformableDecoder(
            DeformableDecoderLayer(**layer),
            num_layers=num_decoder_layers,
            dim=hidden_dim,
            query_pos_from_boxes=not two_stage,
            final_norm=decoder_norm,
            eps=inverse_sigmoid_eps,
        )
        heads = query_heads(num_classes=num_classes, hidden_dim=hidden_dim, num_decoder_layers=num_decoder_layers)
        pos_trans = nn.Linear(2 * hidden_dim, 2 * hidden_dim) if two_stage else None
        pos_trans_norm = nn.LayerNorm(2 * hidden_dim) if two_stage else None
        return cls(
            backbone=backbone,
            neck=neck,
            encoder=encoder,
            decoder=decoder,
            heads=heads,
            query_embed=None if two_stage else nn.Embedding(num_queries, hidden_dim),
            pos_trans=pos_trans,
            pos_trans_norm=pos_trans_norm,
            denoising=denoising_queries(
                num_classes=num_classes,
                hidden_dim=hidden_dim,
                num_denoising=num_denoising,
                label_noise_ratio=label_noise_ratio,
                box_noise_scale=box_noise_scale,
                eps=inverse_sigmoid_eps,
            ),
            criterion=detector_criterion(
                DINOCriterion, num_classes=num_classes, matcher_kwargs=matcher_kwargs, criterion_kwargs=criterion_kwargs
            ),
            num_classes=num_classes,
            num_queries=num_queries,
            look_forward_twice=look_forward_twice,
            exact_valid_ratios=exact_valid_ratios,
            num_detections=num_detections,
            nms_threshold=nms_threshold,
            share_scores=share_scores,
        )

    def __init__(
        self,
        *,
        backbone: nn.Module,
        neck: MultiScaleProjection,
        encoder: DeformableEncoder,
        decoder: DeformableDecoder,
        heads: QueryHeads,
        query_embed: nn.Embedding | None,
        pos_trans: nn.Linear | None,
        pos_trans_norm: nn.LayerNorm | None,
        denoising: ContrastiveDenoising | None,
        criterion: nn.Module,
        num_classes: int,
        num_queries: int,
        look_forward_twice: bool,
        exact_valid_ratios: bool,
        num_detections: int,
        nms_threshold: float | None,
        share_scores: bool,
    ) -> None:
        """DINO from its parts (what :meth:`build` makes) and settings (see the class): mixed query selection with
        the learned content ``query_embed``, two-stage (Deformable DETR) with the proposals' projection ``pos_trans``
        and ``pos_trans_norm`` in its place."""
        if (query_embed is None) == (pos_trans is None) or (pos_trans is None) != (pos_trans_norm is None):
            raise ValueError(f"{__name__}: give query_embed (mixed selection) or pos_trans and pos_trans_norm")
        super().__init__(
            num_classes=num_classes,
            num_queries=num_queries,
            look_forward_twice=look_forward_twice,
            num_detections=num_detections,
            nms_threshold=nms_threshold,
            share_scores=share_scores,
        )
        self.query_selection = "mixed" if pos_trans is None else "two_stage"
        self.exact_valid_ratios = exact_valid_ratios
        self.backbone = backbone
        self.neck = neck
        self.encoder = encoder
        self.decoder = decoder
        self.class_embed, self.bbox_embed, self.enc_output, self.enc_output_norm = heads
        self.pos_trans = pos_trans
        self.pos_trans_norm = pos_trans_norm
        self.query_embed = query_embed
        self.denoising = denoising
        self.criterion = criterion

    def forward(
        self,
        images: torch.Tensor,
        pixel_mask: torch.Tensor | None = None,
        targets: list[dict[str, torch.Tensor]] | None = None,
    ) -> dict:
        """``images [B,3,H,W]``, ``pixel_mask [B,H,W]`` (True on padding), ``targets`` (as for :meth:`loss`;
        used in training for the denoising queries) -> ``{"pred_logits" [B,Q,C], "pred_boxes" [B,Q,4],
        "aux_outputs", "enc_outputs"}`` and in training with targets ``"dn_outputs"``."""
        pixel_mask = checked_pixel_mask(images, pixel_mask, __name__)
        strides = self.level_strides(len(self.neck.input_proj)) if self.exact_valid_ratios else None
        levels = self.neck(list(self.backbone(images).values()), pixel_mask, strides)
        memory = self.encoder(levels.tokens, levels.position, levels.padding_mask, levels.shapes, levels.valid_ratios)
        targets = normalize_targets(targets) if self.training and targets is not None else None
        return self.forward_decoder(dataclasses.replace(levels, tokens=memory), targets)

    def forward_decoder(self, levels: MultiScaleLevels, targets: list[dict] | None = None) -> dict:
        """Query selection from the encoder's memory ``levels`` (``tokens [B,S,D]`` the encoder's), the decoder
        and the heads."""
        memory = levels.tokens
        _, _, proposal_logits, proposal_boxes = select_proposals(
            memory,
            levels,
            self.enc_output,
            self.enc_output_norm,
            self.class_embed[-1],
            self.bbox_embed[-1],
            self.num_queries,
            class_agnostic=self.query_selection == "two_stage",
        )
        boxes = proposal_boxes.detach()
        query_pos = None
        if self.query_selection == "two_stage":
            query_pos, queries = self.pos_trans_norm(
                self.pos_trans(box_sine_embedding(boxes, memory.shape[-1] // 2))
            ).chunk(2, -1)
        else:
            queries = self.query_embed.weight[None, : boxes.shape[1]].expand(
                boxes.shape[0], -1, -1
            )  # not len(): an exported batch stays a symbol
        logits, layer_boxes, denoising = self.decode(queries, query_pos, boxes, memory, levels, targets)
        enc_logits = proposal_logits[..., :1] if self.query_selection == "two_stage" else proposal_logits
        return decoder_outputs(logits, layer_boxes, enc_logits, proposal_boxes, denoising)

    @classmethod
    def for_conversion(cls, backbone: str, num_classes: int | None = None) -> DINO:
        """The model an official checkpoint with backbone ``backbone`` loads into (COCO's 91 classes by default)."""
        return cls.build(build_backbone(backbone, out_indices=cls.backbone_out_indices), num_classes or 91)

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reads IDEA-Research/DINO checkpoints (see :func:`convert_official_dino`); native keys pass."""
        return convert_official_dino(state_dict, self) if is_official_dino(state_dict) else dict(state_dict)
