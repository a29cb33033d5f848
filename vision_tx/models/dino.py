"""DINO (Zhang et al., 2022): a backbone, a multi-scale neck and a deformable transformer whose queries
start from the encoder's best proposals, trained with contrastive denoising.

With ``query_selection="two_stage"`` and ``num_denoising=0`` it is Deformable DETR (Zhu et al., 2021)
with two-stage proposals and iterative box refinement.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import nn

from vision_tx.attention import splat_bilinear
from vision_tx.backbones import build_backbone
from vision_tx.backbones.base import norms_and_biases_and
from vision_tx.heads.detr.criterion import normalize_targets
from vision_tx.heads.detr.matcher import HungarianMatcher
from vision_tx.heads.detr.mlp import MLP
from vision_tx.heads.detr.postprocess import postprocess_sigmoid_detections, postprocess_sigmoid_per_query
from vision_tx.heads.dino.criterion import DINOCriterion
from vision_tx.heads.dino.denoising import ContrastiveDenoising, DenoisingQueries
from vision_tx.heads.dino.transformer import (
    DeformableDecoder,
    DeformableDecoderLayer,
    DeformableEncoder,
    DeformableEncoderLayer,
    box_sine_embedding,
)
from vision_tx.models.detr import checked_pixel_mask
from vision_tx.models.dino_official import convert_official_dino, is_official_dino
from vision_tx.necks.multiscale import MultiScaleLevels, MultiScaleProjection

QUERY_SELECTIONS = ("mixed", "two_stage")


class DeformableQueryDetector(nn.Module):
    """What DINO and RT-DETR share past their encoders: the protocol methods of a detector whose refining
    deformable decoder (``self.decoder``) scores every query with sigmoid logits, trained by
    ``self.criterion``; ``self.num_detections`` and ``self.nms_threshold`` set its post-processing."""

    class_keys = (r"^class_embed\.", r"^denoising\.label_embed\.")  # a row per class (fine-tuning: load_weights)

    def loss(self, outputs: dict, targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The criterion's losses for the outputs of :meth:`forward`; ``targets`` as the data pipeline gives
        them (normalised here, see :func:`~vision_tx.heads.detr.normalize_targets`)."""
        return self.criterion(outputs, normalize_targets(targets))

    def postprocess(self, outputs: dict, image_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Detections in pixels of images of ``image_sizes [B,2]`` (h, w): ``scores``, ``labels``, xyxy ``boxes``."""
        return postprocess_sigmoid_detections(outputs, image_sizes, self.num_detections, self.nms_threshold)

    def postprocess_per_query(self, outputs: dict, image_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Every query's best class, its score and box, in query order (for per-query pictures)."""
        return postprocess_sigmoid_per_query(outputs, image_sizes)

    def cross_attention(self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None) -> dict[str, Any]:
        """The outputs for ``images [B,3,H,W]`` and each query's map ``attention [B, queries, h, w]`` of the last
        decoder layer (see :func:`deformable_cross_attention`)."""
        return deformable_cross_attention(self, self.decoder, images, pixel_mask)

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters the optimiser does not decay (timm's convention): norms, biases and the backbone's exemptions."""
        return norms_and_biases_and(self, "backbone")

    def build_query_heads(self, num_classes: int, hidden_dim: int, num_decoder_layers: int) -> None:
        """One class and box head per decoder layer and a last one for the encoder's proposals, and the
        proposals' projection (``enc_output``, ``enc_output_norm``); :func:`init_heads` initialises the heads."""
        self.class_embed = nn.ModuleList(nn.Linear(hidden_dim, num_classes) for _ in range(num_decoder_layers + 1))
        self.bbox_embed = nn.ModuleList(MLP(hidden_dim, hidden_dim, 4, 3) for _ in range(num_decoder_layers + 1))
        self.enc_output = nn.Linear(hidden_dim, hidden_dim)
        self.enc_output_norm = nn.LayerNorm(hidden_dim)

    def decode(
        self, queries: torch.Tensor, query_pos: torch.Tensor | None, boxes: torch.Tensor, memory: torch.Tensor,
        levels: MultiScaleLevels, targets: list[dict] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, DenoisingQueries | None]:
        """The denoising queries (in training with ``targets``) put before the matching ``queries [B,Q,D]`` and
        their ``boxes [B,Q,4]``, the decoder over ``memory [B,S,D]``, and every layer's class head:
        ``(logits [L,B,N+Q,C], layer_boxes [L,B,N+Q,4], denoising or None)``."""
        denoising = self.denoising(targets, boxes.shape[1]) if targets is not None and self.denoising is not None else None
        attn_mask = None
        if denoising is not None:
            queries = torch.cat([denoising.content.to(queries.dtype), queries], 1)
            boxes = torch.cat([denoising.boxes.to(boxes.dtype), boxes], 1)
            attn_mask = denoising.attn_mask
        hidden, layer_boxes = self.decoder(
            queries, boxes, memory, levels.shapes, levels.padding_mask, levels.valid_ratios, self.bbox_embed,
            query_pos, attn_mask, self.look_forward_twice and self.training,
        )
        return torch.stack([head(h) for head, h in zip(self.class_embed, hidden)]), layer_boxes, denoising


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
    1e-3; Deformable DETR's are 10000, -0.5, no norm and 1e-5. ``nms_threshold`` (off by default,
    as in the paper) adds per-class non-maximum suppression to :meth:`postprocess`, for short trainings
    whose queries still duplicate each other. :meth:`loss` computes ``DINOCriterion(num_classes,
    HungarianMatcher(**matcher_kwargs), **criterion_kwargs)`` (DINO's matcher and weights when not given).
    """

    backbone_out_indices = (1, 2, 3)  # strides 8, 16 and 32
    score_threshold = 0.3  # for pictures: sigmoid scores run lower (the official DINO demo draws above 0.3)

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
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
        num_detections: int = 100,
        nms_threshold: float | None = None,
    ) -> None:
        super().__init__()
        if query_selection not in QUERY_SELECTIONS:
            raise ValueError(f"vision_tx/models/dino.py: query_selection must be one of {QUERY_SELECTIONS}, got {query_selection!r}")
        if query_selection == "two_stage" and num_denoising:
            raise ValueError("vision_tx/models/dino.py: denoising needs query_selection='mixed' (set num_denoising=0)")
        self.backbone = backbone
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.query_selection = query_selection
        self.look_forward_twice = look_forward_twice
        self.num_detections = num_detections
        self.nms_threshold = nms_threshold
        self.neck = MultiScaleProjection(
            backbone.out_channels, hidden_dim, num_levels, temperature=position_temperature, offset=position_offset
        )
        self.encoder = DeformableEncoder(
            DeformableEncoderLayer(hidden_dim, num_heads, num_levels, num_points, dim_feedforward, dropout), num_encoder_layers
        )
        self.decoder = DeformableDecoder(
            DeformableDecoderLayer(hidden_dim, num_heads, num_levels, num_points, dim_feedforward, dropout),
            num_decoder_layers, hidden_dim, query_pos_from_boxes=query_selection == "mixed", final_norm=decoder_norm,
            eps=inverse_sigmoid_eps,
        )
        self.build_query_heads(num_classes, hidden_dim, num_decoder_layers)
        if query_selection == "two_stage":
            self.pos_trans = nn.Linear(2 * hidden_dim, 2 * hidden_dim)
            self.pos_trans_norm = nn.LayerNorm(2 * hidden_dim)
        else:
            self.query_embed = nn.Embedding(num_queries, hidden_dim)
        self.denoising = (
            ContrastiveDenoising(num_classes, hidden_dim, num_denoising, label_noise_ratio, box_noise_scale, inverse_sigmoid_eps)
            if num_denoising
            else None
        )
        matcher = HungarianMatcher(**matcher_kwargs) if matcher_kwargs else None
        self.criterion = DINOCriterion(num_classes, matcher, **(criterion_kwargs or {}))
        init_heads(self.class_embed, self.bbox_embed)

    def forward(
        self, images: torch.Tensor, pixel_mask: torch.Tensor | None = None, targets: list[dict[str, torch.Tensor]] | None = None
    ) -> dict:
        """``images [B,3,H,W]``, ``pixel_mask [B,H,W]`` (True on padding), ``targets`` (as for :meth:`loss`;
        used in training for the denoising queries) -> ``{"pred_logits" [B,Q,C], "pred_boxes" [B,Q,4],
        "aux_outputs", "enc_outputs"}`` and in training with targets ``"dn_outputs"``."""
        pixel_mask = checked_pixel_mask(images, pixel_mask, "vision_tx/models/dino.py")
        levels = self.neck(list(self.backbone(images).values()), pixel_mask)
        memory = self.encoder(levels.tokens, levels.position, levels.padding_mask, levels.shapes, levels.valid_ratios)
        return self.forward_decoder(memory, levels, normalize_targets(targets) if self.training and targets is not None else None)

    def forward_decoder(self, memory: torch.Tensor, levels: MultiScaleLevels, targets: list[dict] | None = None) -> dict:
        """Query selection from the encoder's ``memory [B,S,D]``, the decoder and the heads."""
        _, _, proposal_logits, proposal_boxes = select_proposals(
            memory, levels, self.enc_output, self.enc_output_norm, self.class_embed[-1], self.bbox_embed[-1], self.num_queries,
            class_agnostic=self.query_selection == "two_stage",
        )
        boxes = proposal_boxes.detach()
        query_pos = None
        if self.query_selection == "two_stage":
            query_pos, queries = self.pos_trans_norm(self.pos_trans(box_sine_embedding(boxes, memory.shape[-1] // 2))).chunk(2, -1)
        else:
            queries = self.query_embed.weight[None, : boxes.shape[1]].expand(len(boxes), -1, -1)
        logits, layer_boxes, denoising = self.decode(queries, query_pos, boxes, memory, levels, targets)
        enc_logits = proposal_logits[..., :1] if self.query_selection == "two_stage" else proposal_logits
        return decoder_outputs(logits, layer_boxes, enc_logits, proposal_boxes, denoising)

    @classmethod
    def for_conversion(cls, backbone: str, num_classes: int | None = None) -> "DINO":
        """The model an official checkpoint with backbone ``backbone`` loads into (COCO's 91 classes by default)."""
        return cls(build_backbone(backbone, out_indices=cls.backbone_out_indices), num_classes or 91)

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Reads IDEA-Research/DINO checkpoints (see :func:`convert_official_dino`); native keys pass."""
        return convert_official_dino(state_dict, self) if is_official_dino(state_dict) else dict(state_dict)


@torch.no_grad()
def deformable_cross_attention(
    model: nn.Module, decoder: DeformableDecoder, images: torch.Tensor, pixel_mask: torch.Tensor | None = None
) -> dict[str, Any]:
    """``model``'s outputs for ``images [B,3,H,W]`` and the deformable cross-attention of each query in the last
    layer of ``decoder`` (DINO, RT-DETR): the weights of its sampling points (every head, level and point) drawn on
    the finest level's grid by :func:`~vision_tx.attention.splat_bilinear` and averaged over heads,
    ``{"outputs", "attention" [B, queries, h, w]}``."""
    cross = decoder.layers[-1].cross_attn
    recorded: list[tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]] = []

    def record(module: nn.Module, args: tuple, _output: torch.Tensor) -> None:
        query, reference, _value, shapes = args[:4]
        recorded.append((*module.sampling(query, reference, shapes), shapes))

    handle = cross.register_forward_hook(record)
    try:
        outputs = model(images, pixel_mask)
    finally:
        handle.remove()
    locations, weights, shapes = recorded[-1]
    batch, queries, heads = weights.shape[:3]
    maps = splat_bilinear(locations.flatten(0, 1).flatten(1, -2), weights.flatten(0, 1).flatten(1), shapes[0])
    return {"outputs": outputs, "attention": maps.view(batch, queries, *shapes[0]) / heads}


def init_heads(class_heads: nn.ModuleList, box_heads: nn.ModuleList) -> None:
    """Every class starts at probability 0.01 (sigmoid losses) and every box head predicts no change."""
    prior = -math.log((1 - 0.01) / 0.01)
    for head in class_heads:
        nn.init.constant_(head.bias, prior)
    for head in box_heads:
        nn.init.zeros_(head.layers[-1].weight)
        nn.init.zeros_(head.layers[-1].bias)


def select_proposals(
    memory: torch.Tensor, levels: MultiScaleLevels, enc_output: nn.Module, enc_output_norm: nn.Module, class_head: nn.Module,
    box_head: nn.Module, num_queries: int, class_agnostic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The encoder's ``num_queries`` best proposals (DINO, RT-DETR): every valid token of ``memory [B,S,D]``
    is projected (``enc_output``, ``enc_output_norm``), scored by ``class_head`` and given the box
    ``box_head`` predicts around its anchor. Ranked by the best class score (by class 0 when
    ``class_agnostic``). Returns the projected tokens ``[B,S,D]``, the picked indices ``[B,K]``, class
    logits ``[B,K,C]`` and boxes ``[B,K,4]`` (with gradient), ``K = min(num_queries, S)``."""
    anchors, valid = proposal_anchors(levels)
    features = memory.masked_fill(~valid[..., None], 0.0)
    features = enc_output_norm(enc_output(features))
    logits = class_head(features)
    box_logits = box_head(features) + anchors
    score = logits[..., 0] if class_agnostic else logits.max(-1).values
    top = score.topk(min(num_queries, score.shape[1]), dim=1).indices
    picked_logits = torch.gather(logits, 1, top[..., None].expand(-1, -1, logits.shape[-1]))
    picked_boxes = torch.gather(box_logits, 1, top[..., None].expand(-1, -1, 4)).sigmoid()
    return features, top, picked_logits, picked_boxes


def decoder_outputs(
    logits: torch.Tensor, boxes: torch.Tensor, proposal_logits: torch.Tensor, proposal_boxes: torch.Tensor,
    denoising: DenoisingQueries | None,
) -> dict:
    """Every decoder layer's ``logits [L,B,N+Q,C]`` and ``boxes [L,B,N+Q,4]`` (the ``N`` denoising queries
    first), the selected proposals' -> the criterion's dict: ``pred_logits``, ``pred_boxes`` (last
    layer), ``aux_outputs`` (earlier layers), ``enc_outputs`` and, with denoising, ``dn_outputs``."""
    outputs = {"enc_outputs": {"pred_logits": proposal_logits, "pred_boxes": proposal_boxes}}
    if denoising is not None:
        split = denoising.content.shape[1]
        outputs["dn_outputs"] = {"pred_logits": logits[:, :, :split], "pred_boxes": boxes[:, :, :split], "queries": denoising}
        logits, boxes = logits[:, :, split:], boxes[:, :, split:]
    outputs.update({"pred_logits": logits[-1], "pred_boxes": boxes[-1]})
    outputs["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])]
    return outputs


def proposal_anchors(levels: MultiScaleLevels) -> tuple[torch.Tensor, torch.Tensor]:
    """One anchor box per token: centred on its pixel (relative to the level's unpadded area), of
    side 0.05 * 2**level. Returns their inverse-sigmoid ``[B,S,4]`` (inf where invalid) and
    ``valid [B,S]``: not padding and strictly inside (0.01, 0.99)."""
    anchors, start = [], 0
    batch = levels.tokens.shape[0]
    dtype, device = levels.tokens.dtype, levels.tokens.device
    for level, (height, width) in enumerate(levels.shapes):
        padding = levels.padding_mask[:, start : start + height * width].view(batch, height, width)
        start += height * width
        valid_size = torch.stack([(~padding[:, 0, :]).sum(1), (~padding[:, :, 0]).sum(1)], -1).to(dtype)  # (w, h)
        y, x = torch.meshgrid(torch.arange(height, dtype=dtype, device=device), torch.arange(width, dtype=dtype, device=device), indexing="ij")
        centres = (torch.stack([x, y], -1).flatten(0, 1)[None] + 0.5) / valid_size[:, None]
        sizes = torch.full_like(centres, 0.05 * 2.0**level)
        anchors.append(torch.cat([centres, sizes], -1))
    anchors = torch.cat(anchors, 1)
    valid = ((anchors > 0.01) & (anchors < 0.99)).all(-1) & ~levels.padding_mask
    logits = torch.log(anchors / (1 - anchors)).masked_fill(~valid[..., None], float("inf"))
    return logits, valid
