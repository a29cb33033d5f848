"""What the query-based detectors share: DINO's and RT-DETR's base class (the protocol methods, the query
heads, the decoding with denoising queries, the constructor's common parts), the encoder's proposals and
their anchors, the criterion's dict of every layer's outputs, the cross-attention pictures, and the input
check of every detector (DETR's included) and the helpers of their official checkpoints' converters."""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import torch
from torch import nn

from vision_tx.attention import splat_bilinear
from vision_tx.backbones import build_backbone
from vision_tx.backbones.base import norms_and_biases_and
from vision_tx.heads.detr.criterion import normalize_targets
from vision_tx.heads.detr.matcher import HungarianMatcher
from vision_tx.heads.detr.mlp import MLP
from vision_tx.heads.detr.postprocess import checked_sizes, per_image, postprocess_sigmoid_per_query, sigmoid_detections
from vision_tx.heads.dino.denoising import ContrastiveDenoising, DenoisingQueries
from vision_tx.heads.dino.transformer import DeformableDecoder
from vision_tx.heads.rtdetr.hybrid_encoder import HybridEncoder
from vision_tx.necks.multiscale import MultiScaleLevels, flatten_levels


def checked_pixel_mask(images: torch.Tensor, pixel_mask: torch.Tensor | None, where: str) -> torch.Tensor:
    """``pixel_mask`` (all False when None) after checking ``images [B,3,H,W]`` and ``pixel_mask`` bool
    ``[B,H,W]``; errors name ``where``."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"{where}: images must be [B,3,H,W], got {list(images.shape)}")
    if pixel_mask is None:
        return images.new_zeros(images.shape[0], *images.shape[2:], dtype=torch.bool)
    if pixel_mask.dtype != torch.bool or pixel_mask.shape != (images.shape[0], *images.shape[2:]):
        raise ValueError(
            f"{where}: pixel_mask must be bool [B,H,W] = {[images.shape[0], *images.shape[2:]]}, "
            f"got {pixel_mask.dtype} {list(pixel_mask.shape)}"
        )
    return pixel_mask



class DeformableQueryDetector(nn.Module):
    """What DINO and RT-DETR share past their encoders: the protocol methods of a detector whose refining
    deformable decoder (``self.decoder``) scores every query with sigmoid logits, trained by
    ``self.criterion``; ``self.num_detections``, ``self.nms_threshold`` and ``self.share_scores`` set its
    post-processing (:meth:`detections`)."""

    class_keys = (r"^class_embed\.", r"^denoising\.label_embed\.")  # a row per class (fine-tuning: load_weights)

    def __init__(
        self, backbone: nn.Module, num_classes: int, num_queries: int, look_forward_twice: bool, num_detections: int,
        nms_threshold: float | None, share_scores: bool,
    ) -> None:
        """The constructors' common start: the settings every query detector reads (see DINO's and RT-DETR's)."""
        super().__init__()
        self.backbone = backbone
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.look_forward_twice = look_forward_twice
        self.num_detections = num_detections
        self.nms_threshold = nms_threshold
        self.share_scores = share_scores

    def level_strides(self, num_levels: int) -> list[int]:
        """The pixel strides of the decoder's ``num_levels`` levels: the backbone's, then twice the last per extra level."""
        strides = [int(s) for s in self.backbone.strides]
        return strides + [strides[-1] * 2 ** (i + 1) for i in range(num_levels - len(strides))]

    def build_training_parts(
        self, hidden_dim: int, num_denoising: int, label_noise_ratio: float, box_noise_scale: float, eps: float,
        criterion_class: Callable[..., nn.Module], matcher_kwargs: dict[str, Any] | None, criterion_kwargs: dict[str, Any] | None,
    ) -> None:
        """The constructors' common end, after the heads: the denoising queries (none when ``num_denoising``
        is 0; noised boxes stored through ``inverse_sigmoid(eps)``), ``criterion_class(num_classes,
        HungarianMatcher(**matcher_kwargs), **criterion_kwargs)`` (the criterion's own matcher when no
        ``matcher_kwargs``), and the heads' initialisation (:func:`init_heads`)."""
        self.denoising = (
            ContrastiveDenoising(self.num_classes, hidden_dim, num_denoising, label_noise_ratio, box_noise_scale, eps=eps)
            if num_denoising
            else None
        )
        matcher = HungarianMatcher(**matcher_kwargs) if matcher_kwargs else None
        self.criterion = criterion_class(self.num_classes, matcher, **(criterion_kwargs or {}))
        init_heads(self.class_embed, self.bbox_embed)

    def loss(self, outputs: dict, targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The criterion's losses for the outputs of :meth:`forward`; ``targets`` as the data pipeline gives
        them (normalised here, see :func:`~vision_tx.heads.detr.normalize_targets`)."""
        return self.criterion(outputs, normalize_targets(targets))

    detection_outputs = ("boxes", "scores", "labels")  # the keys of :meth:`detections`, in the exported order

    def detections(self, outputs: dict, image_sizes: torch.Tensor) -> dict[str, torch.Tensor]:
        """Batch detections in pixels of images of ``image_sizes [B,2]`` (h, w), NMS padding last (export-safe,
        :func:`~vision_tx.heads.detr.postprocess.sigmoid_detections` with this detector's settings)."""
        return sigmoid_detections(outputs, image_sizes, self.num_detections, self.nms_threshold, self.share_scores)

    @torch.no_grad()
    def postprocess(self, outputs: dict, image_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Detections in pixels of images of ``image_sizes [B,2]`` (h, w): ``scores``, ``labels``, xyxy ``boxes``
        (:meth:`detections` per image, without the padding)."""
        return per_image(self.detections(outputs, checked_sizes(image_sizes, outputs)))

    def postprocess_per_query(self, outputs: dict, image_sizes: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Every query's best class, its score and box, in query order (for per-query pictures)."""
        return postprocess_sigmoid_per_query(outputs, image_sizes, self.share_scores)

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

    def with_denoising(
        self, queries: torch.Tensor, boxes: torch.Tensor, targets: list[dict] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, DenoisingQueries | None]:
        """The denoising queries (in training with ``targets``) put before ``queries [B,Q,D]`` and their boxes
        before ``boxes [B,Q,4]``: ``(queries [B,N+Q,D], boxes [B,N+Q,4], attn_mask or None, denoising or None)``."""
        denoising = self.denoising(targets, boxes.shape[1]) if targets is not None and self.denoising is not None else None
        if denoising is None:
            return queries, boxes, None, None
        queries = torch.cat([denoising.content.to(queries.dtype), queries], 1)
        boxes = torch.cat([denoising.boxes.to(boxes.dtype), boxes], 1)
        return queries, boxes, denoising.attn_mask, denoising

    def decode(
        self, queries: torch.Tensor, query_pos: torch.Tensor | None, boxes: torch.Tensor, memory: torch.Tensor,
        levels: MultiScaleLevels, targets: list[dict] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, DenoisingQueries | None]:
        """The denoising queries (in training with ``targets``) put before the matching ``queries [B,Q,D]`` and
        their ``boxes [B,Q,4]``, the decoder over ``memory [B,S,D]``, and every layer's class head:
        ``(logits [L,B,N+Q,C], layer_boxes [L,B,N+Q,4], denoising or None)``."""
        queries, boxes, attn_mask, denoising = self.with_denoising(queries, boxes, targets)
        hidden, layer_boxes = self.decoder(
            queries, boxes, memory, levels.shapes, levels.padding_mask, levels.valid_ratios, self.bbox_embed,
            query_pos, attn_mask, self.look_forward_twice and self.training,
        )
        return torch.stack([head(h) for head, h in zip(self.class_embed, hidden)]), layer_boxes, denoising


class HybridEncoderDetector(DeformableQueryDetector):
    """What RT-DETR and D-FINE share before their decoders: the backbone's stride 8, 16 and 32 maps through a
    hybrid encoder (``encoder_class``), projected into the decoder's levels, and the queries selected from
    the memory's best proposals. Subclasses build their decoder and heads and define :meth:`forward_decoder`."""

    backbone_out_indices = (1, 2, 3)  # strides 8, 16 and 32
    encoder_class: type[nn.Module] = HybridEncoder
    score_threshold = 0.5  # for pictures (RT-DETR's official demo draws above 0.6)
    query_embed: nn.Embedding | None

    def build_encoder(
        self, hidden_dim: int, num_heads: int, num_encoder_layers: int, encoder_feedforward: int, expansion: float,
        num_blocks: int, dropout: float, num_levels: int,
    ) -> None:
        """The hybrid encoder over the backbone's maps and the decoder's input projections (``num_levels`` levels:
        a 1x1 conv + BatchNorm per map, a 3x3 stride-2 conv + BatchNorm per extra level)."""
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
        pixel_mask = checked_pixel_mask(images, pixel_mask, type(self).__module__)
        maps = self.encoder(list(self.backbone(images).values()), pixel_mask)
        targets = normalize_targets(targets) if self.training and targets is not None else None
        return self.forward_decoder(self.memory(maps, pixel_mask), targets)

    def memory(self, maps: list[torch.Tensor], pixel_mask: torch.Tensor) -> MultiScaleLevels:
        """The decoder's levels: the encoder's ``maps [B,D,h,w]`` projected (and the extra levels)."""
        levels = [projection(x) for projection, x in zip(self.decoder_input_proj, maps)]
        for projection in self.decoder_input_proj[len(maps):]:
            levels.append(projection(maps[-1] if len(levels) == len(maps) else levels[-1]))
        return flatten_levels(levels, pixel_mask, strides=self.level_strides(len(levels)))

    def select_queries(self, levels: MultiScaleLevels) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ``num_queries`` best proposals of the memory ``levels``: ``(queries [B,Q,D], boxes [B,Q,4])`` to start
        the decoder (the proposals' tokens and boxes, without gradient; a learned content with ``query_embed``),
        and every proposal's ``logits`` and ``boxes`` for the encoder's loss."""
        features, top, proposal_logits, proposal_boxes = select_proposals(
            levels.tokens, levels, self.enc_output, self.enc_output_norm, self.class_embed[-1], self.bbox_embed[-1], self.num_queries
        )
        boxes = proposal_boxes.detach()
        if self.query_embed is None:
            queries = torch.gather(features, 1, top[..., None].expand(-1, -1, features.shape[-1])).detach()
        else:
            queries = self.query_embed.weight[None, : boxes.shape[1]].expand(boxes.shape[0], -1, -1)  # not len(): an exported batch stays a symbol
        return queries, boxes, proposal_logits, proposal_boxes

    @classmethod
    def for_conversion(cls, backbone: str, num_classes: int | None = None) -> "HybridEncoderDetector":
        """The model an official checkpoint with backbone ``backbone`` loads into (the official COCO models'
        80 classes, contiguous indices, by default)."""
        return cls(build_backbone(backbone, out_indices=cls.backbone_out_indices), num_classes or 80)


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
    """One anchor box per token: centred on its pixel (relative to the level's unpadded area, ``valid_ratios``), of
    side 0.05 * 2**level. Returns their inverse-sigmoid ``[B,S,4]`` (inf where invalid) and
    ``valid [B,S]``: not padding and strictly inside (0.01, 0.99)."""
    anchors = []
    dtype, device = levels.tokens.dtype, levels.tokens.device
    for level, (height, width) in enumerate(levels.shapes):
        ratio = levels.valid_ratios[:, level]
        valid_size = torch.stack([ratio[:, 0] * width, ratio[:, 1] * height], -1)  # (w, h) in cells
        y, x = torch.meshgrid(torch.arange(height, dtype=dtype, device=device), torch.arange(width, dtype=dtype, device=device), indexing="ij")
        centres = (torch.stack([x, y], -1).flatten(0, 1)[None] + 0.5) / valid_size[:, None]
        sizes = torch.full_like(centres, 0.05 * 2.0**level)
        anchors.append(torch.cat([centres, sizes], -1))
    anchors = torch.cat(anchors, 1)
    valid = ((anchors > 0.01) & (anchors < 0.99)).all(-1) & ~levels.padding_mask
    logits = torch.log(anchors / (1 - anchors)).masked_fill(~valid[..., None], float("inf"))
    return logits, valid


def renamed_key(key: str, renames: tuple[tuple[str, str], ...]) -> str:
    """``key`` renamed by the first ``(pattern, replacement)`` of ``renames`` whose pattern it matches."""
    for pattern, replacement in renames:
        renamed, count = re.subn(pattern, replacement, key)
        if count:
            return renamed
    return key


def with_backbone_state(converted: dict[str, torch.Tensor], backbone_state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """``converted`` plus ``backbone_state`` read by the backbone's own ``convert_state_dict`` (if it has one), under ``backbone.``."""
    convert_backbone = getattr(model.backbone, "convert_state_dict", None)
    if convert_backbone is not None:
        backbone_state = convert_backbone(backbone_state)
    converted.update({f"backbone.{k}": v for k, v in backbone_state.items()})
    return converted
