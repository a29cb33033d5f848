"""What the query-based detectors share: DINO's and RT-DETR's base class (the protocol methods, the query
heads, the decoding with denoising queries, the constructor's common parts), the encoder's proposals and
their anchors, the criterion's dict of every layer's outputs, the cross-attention pictures, and the input
check of every detector (DETR's included) and the helpers of their official checkpoints' converters."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

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
from vision_tx.necks.multiscale import MultiScaleLevels, flatten_levels
from vision_tx.ops.conv import Conv2d


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


class QueryHeads(NamedTuple):
    """A query detector's heads: a class head and a box head per decoder layer and a last pair that scores and
    places the encoder's proposals (``class_embed``, ``bbox_embed``), and the proposals' projection
    (``enc_output``, ``enc_output_norm``); the detector keeps each under its own name."""

    class_embed: nn.ModuleList
    bbox_embed: nn.ModuleList
    enc_output: nn.Linear
    enc_output_norm: nn.LayerNorm


def query_heads(
    *, num_classes: int, hidden_dim: int, num_decoder_layers: int, layer_box_outputs: int = 4
) -> QueryHeads:
    """The heads of a decoder of ``num_decoder_layers`` layers of width ``hidden_dim`` for ``num_classes`` classes,
    initialised by :func:`init_heads`: each decoder layer's box head gives ``layer_box_outputs`` numbers (4: the change
    of a box; D-FINE: the distribution of each edge's distance), the proposals' box head 4."""
    class_embed = nn.ModuleList(nn.Linear(hidden_dim, num_classes) for _ in range(num_decoder_layers + 1))
    box_outputs = [layer_box_outputs] * num_decoder_layers + [4]
    bbox_embed = nn.ModuleList(MLP(hidden_dim, hidden_dim, outputs, 3) for outputs in box_outputs)
    init_heads(class_embed, bbox_embed)
    return QueryHeads(class_embed, bbox_embed, nn.Linear(hidden_dim, hidden_dim), nn.LayerNorm(hidden_dim))


def denoising_queries(
    *,
    num_classes: int,
    hidden_dim: int,
    num_denoising: int,
    label_noise_ratio: float,
    box_noise_scale: float,
    eps: float,
) -> ContrastiveDenoising | None:
    """The contrastive denoising queries (:class:`ContrastiveDenoising`; none when ``num_denoising`` is 0) of
    ``num_classes`` classes and width ``hidden_dim``, their labels flipped at ``label_noise_ratio`` and boxes jittered
    by ``box_noise_scale``, the noised boxes stored through ``inverse_sigmoid(eps)`` (``eps`` keeps them finite)."""
    if not num_denoising:
        return None
    return ContrastiveDenoising(num_classes, hidden_dim, num_denoising, label_noise_ratio, box_noise_scale, eps=eps)


def detector_criterion(
    criterion_class: Callable[..., nn.Module],
    *,
    num_classes: int,
    matcher_kwargs: dict[str, Any] | None,
    criterion_kwargs: dict[str, Any] | None,
) -> nn.Module:
    """``criterion_class(num_classes, HungarianMatcher(**matcher_kwargs), **criterion_kwargs)`` for ``num_classes``
    classes: the criterion's own matcher when no ``matcher_kwargs``, its own weights when no ``criterion_kwargs``."""
    matcher = HungarianMatcher(**matcher_kwargs) if matcher_kwargs else None
    return criterion_class(num_classes, matcher, **(criterion_kwargs or {}))


def level_projections(*, hidden_dim: int, num_maps: int, num_levels: int, project_maps: bool = True) -> nn.ModuleList:
    """The decoder's input projections of ``num_levels`` levels from an encoder's ``num_maps`` maps of width
    ``hidden_dim``: a 1x1 conv + BatchNorm per map (RT-DETR; ``nn.Identity`` without ``project_maps``: D-FINE reads
    the maps as they are), and a 3x3 stride-2 conv + BatchNorm per extra level."""
    if num_levels < num_maps:
        raise ValueError(f"{__name__}: num_levels={num_levels} is below the {num_maps} backbone maps")

    def projection(kernel: int, stride: int) -> nn.Module:
        convolution = Conv2d(hidden_dim, hidden_dim, kernel, stride, kernel // 2, bias=False)
        return nn.Sequential(convolution, nn.BatchNorm2d(hidden_dim))

    maps = [projection(1, 1) if project_maps else nn.Identity() for _ in range(num_maps)]
    return nn.ModuleList(maps + [projection(3, 2) for _ in range(num_levels - num_maps)])


class DeformableQueryDetector(nn.Module):
    """What DINO, RT-DETR and D-FINE share past their encoders: the protocol methods of a detector whose refining
    deformable decoder (``decoder``) scores every query with sigmoid logits (its :class:`QueryHeads` kept as
    ``class_embed``, ``bbox_embed``, ``enc_output``, ``enc_output_norm``), trained by ``criterion`` with the
    ``denoising`` queries (or None). Each detector's constructor takes these parts, built by its classmethod
    ``build`` from its settings (its ``variants``), and keeps them in the order it builds them (the order of
    the parameters, which an optimiser's saved state follows). ``num_detections``, ``nms_threshold`` and
    ``share_scores`` set its post-processing
    (:meth:`detections`)."""

    class_keys = (r"^class_embed\.", r"^denoising\.label_embed\.")  # a row per class (fine-tuning: load_weights)
    backbone: nn.Module
    decoder: nn.Module
    class_embed: nn.ModuleList
    bbox_embed: nn.ModuleList
    enc_output: nn.Linear
    enc_output_norm: nn.LayerNorm
    denoising: ContrastiveDenoising | None
    criterion: nn.Module

    def __init__(
        self,
        *,
        num_classes: int,
        num_queries: int,
        num_detections: int,
        nms_threshold: float | None,
        share_scores: bool,
        look_forward_twice: bool = False,
    ) -> None:
        """The settings every query detector reads (see each one's ``build``); the parts are the subclass's."""
        super().__init__()
        self.num_classes = num_classes
        self.num_queries = num_queries
        self.look_forward_twice = look_forward_twice
        self.num_detections = num_detections
        self.nms_threshold = nms_threshold
        self.share_scores = share_scores

    def level_strides(self, num_levels: int) -> list[int]:
        """The pixel strides of the decoder's ``num_levels`` levels: the backbone's, then twice the last per extra
        level."""
        strides = [int(s) for s in self.backbone.strides]
        return strides + [strides[-1] * 2 ** (i + 1) for i in range(num_levels - len(strides))]

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
        """Names of the parameters the optimiser does not decay (timm's convention): norms, biases and the backbone's
        exemptions."""
        return norms_and_biases_and(self, "backbone")

    def with_denoising(
        self, queries: torch.Tensor, boxes: torch.Tensor, targets: list[dict] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, DenoisingQueries | None]:
        """The denoising queries (in training with ``targets``) put before ``queries [B,Q,D]`` and their boxes
        before ``boxes [B,Q,4]``: ``(queries [B,N+Q,D], boxes [B,N+Q,4], attn_mask or None, denoising or None)``."""
        denoising = (
            self.denoising(targets, boxes.shape[1]) if targets is not None and self.denoising is not None else None
        )
        if denoising is None:
            return queries, boxes, None, None
        queries = torch.cat([denoising.content.to(queries.dtype), queries], 1)
        boxes = torch.cat([denoising.boxes.to(boxes.dtype), boxes], 1)
        return queries, boxes, denoising.attn_mask, denoising

    def decode(
        self,
        queries: torch.Tensor,
        query_pos: torch.Tensor | None,
        boxes: torch.Tensor,
        memory: torch.Tensor,
        levels: MultiScaleLevels,
        targets: list[dict] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, DenoisingQueries | None]:
        """The denoising queries (in training with ``targets``) put before the matching ``queries [B,Q,D]`` and
        their ``boxes [B,Q,4]``, the decoder over ``memory [B,S,D]``, and every layer's class head:
        ``(logits [L,B,N+Q,C], layer_boxes [L,B,N+Q,4], denoising or None)``."""
        queries, boxes, attn_mask, denoising = self.with_denoising(queries, boxes, targets)
        hidden, layer_boxes = self.decoder(
            queries,
            boxes,
            memory,
            levels.shapes,
            levels.padding_mask,
            levels.valid_ratios,
            self.bbox_embed,
            query_pos,
            attn_mask,
            self.look_forward_twice and self.training,
        )
        return torch.stack([head(h) for head, h in zip(self.class_embed, hidden)]), layer_boxes, denoising


class HybridEncoderDetector(DeformableQueryDetector):
    """What RT-DETR and D-FINE share before their decoders: the backbone's stride 8, 16 and 32 maps through a
    hybrid encoder (``encoder``), projected into the decoder's levels (``decoder_input_proj``, see
    :func:`level_projections`), and the queries selected from the memory's best proposals (their content learned
    with ``query_embed``). Subclasses take their parts and define :meth:`forward_decoder`."""

    backbone_out_indices = (1, 2, 3)  # strides 8, 16 and 32
    score_threshold = 0.5  # for pictures (RT-DETR's official demo draws above 0.6)
    encoder: nn.Module
    decoder_input_proj: nn.ModuleList
    query_embed: nn.Embedding | None

    def forward(
        self,
        images: torch.Tensor,
        pixel_mask: torch.Tensor | None = None,
        targets: list[dict[str, torch.Tensor]] | None = None,
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
        for projection in self.decoder_input_proj[len(maps) :]:
            levels.append(projection(maps[-1] if len(levels) == len(maps) else levels[-1]))
        return flatten_levels(levels, pixel_mask, strides=self.level_strides(len(levels)))

    def select_queries(self, levels: MultiScaleLevels) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ``num_queries`` best proposals of the memory ``levels``: ``(queries [B,Q,D], boxes [B,Q,4])`` to start
        the decoder (the proposals' tokens and boxes, without gradient; a learned content with ``query_embed``),
        and every proposal's ``logits`` and ``boxes`` for the encoder's loss."""
        features, top, proposal_logits, proposal_boxes = select_proposals(
            levels.tokens,
            levels,
            self.enc_output,
            self.enc_output_norm,
            self.class_embed[-1],
            self.bbox_embed[-1],
            self.num_queries,
        )
        boxes = proposal_boxes.detach()
        if self.query_embed is None:
            queries = torch.gather(features, 1, top[..., None].expand(-1, -1, features.shape[-1])).detach()
        else:
            queries = self.query_embed.weight[None, : boxes.shape[1]].expand(
                boxes.shape[0], -1, -1
            )  # not len(): an exported batch stays a symbol
        return queries, boxes, proposal_logits, proposal_boxes

    @classmethod
    def for_conversion(cls, backbone: str, num_classes: int | None = None) -> HybridEncoderDetector:
        """The model an official checkpoint with backbone ``backbone`` loads into (the official COCO models'
        80 classes, contiguous indices, by default)."""
        return cls.build(build_backbone(backbone, out_indices=cls.backbone_out_indices), num_classes or 80)


@torch.no_grad()
def deformable_cross_attention(
    model: nn.Module, decoder: DeformableDecoder, images: torch.Tensor, pixel_mask: torch.Tensor | None = None
) -> dict[str, Any]:
    """``model``'s outputs for ``images [B,3,H,W]`` (and ``pixel_mask [B,H,W]``, if given) and the deformable
    cross-attention of each query in the last layer of ``decoder`` (DINO, RT-DETR): the weights of its sampling points
    (every head, level and point) drawn on the finest level's grid by :func:`~vision_tx.attention.splat_bilinear` and
    averaged over heads, ``{"outputs", "attention" [B, queries, h, w]}``."""
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
    """Every class of ``class_heads`` starts at probability 0.01 (sigmoid losses) and every head of ``box_heads``
    predicts no change."""
    prior = -math.log((1 - 0.01) / 0.01)
    for head in class_heads:
        nn.init.constant_(head.bias, prior)
    for head in box_heads:
        nn.init.zeros_(head.layers[-1].weight)
        nn.init.zeros_(head.layers[-1].bias)


def select_proposals(
    memory: torch.Tensor,
    levels: MultiScaleLevels,
    enc_output: nn.Module,
    enc_output_norm: nn.Module,
    class_head: nn.Module,
    box_head: nn.Module,
    num_queries: int,
    class_agnostic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The encoder's ``num_queries`` best proposals (DINO, RT-DETR): every valid token of ``memory [B,S,D]`` (laid out
    as ``levels`` says) is projected (``enc_output``, ``enc_output_norm``), scored by ``class_head`` and given the box
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
    logits: torch.Tensor,
    boxes: torch.Tensor,
    proposal_logits: torch.Tensor,
    proposal_boxes: torch.Tensor,
    denoising: DenoisingQueries | None,
) -> dict:
    """Every decoder layer's ``logits [L,B,N+Q,C]`` and ``boxes [L,B,N+Q,4]`` (the ``N`` queries of ``denoising``
    first, when not None), the selected proposals' ``proposal_logits [B,K,C]`` and ``proposal_boxes [B,K,4]`` -> the
    criterion's dict: ``pred_logits [B,Q,C]``, ``pred_boxes [B,Q,4]`` (last layer), ``aux_outputs`` (earlier layers),
    ``enc_outputs`` and, with denoising, ``dn_outputs``."""
    outputs = {"enc_outputs": {"pred_logits": proposal_logits, "pred_boxes": proposal_boxes}}
    if denoising is not None:
        split = denoising.content.shape[1]
        outputs["dn_outputs"] = {
            "pred_logits": logits[:, :, :split],
            "pred_boxes": boxes[:, :, :split],
            "queries": denoising,
        }
        logits, boxes = logits[:, :, split:], boxes[:, :, split:]
    outputs.update({"pred_logits": logits[-1], "pred_boxes": boxes[-1]})
    outputs["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])]
    return outputs


def proposal_anchors(levels: MultiScaleLevels) -> tuple[torch.Tensor, torch.Tensor]:
    """One anchor box per token of ``levels``: centred on its pixel (relative to the level's unpadded area,
    ``valid_ratios``), of side 0.05 * 2**level. Returns their inverse-sigmoid ``[B,S,4]`` (inf where invalid) and
    ``valid [B,S]``: not padding and strictly inside (0.01, 0.99)."""
    anchors = []
    dtype, device = levels.tokens.dtype, levels.tokens.device
    for level, (height, width) in enumerate(levels.shapes):
        ratio = levels.valid_ratios[:, level]
        valid_size = torch.stack([ratio[:, 0] * width, ratio[:, 1] * height], -1)  # (w, h) in cells
        y, x = torch.meshgrid(
            torch.arange(height, dtype=dtype, device=device),
            torch.arange(width, dtype=dtype, device=device),
            indexing="ij",
        )
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


def with_backbone_state(
    converted: dict[str, torch.Tensor], backbone_state: dict[str, torch.Tensor], model: nn.Module
) -> dict[str, torch.Tensor]:
    """``converted`` plus ``backbone_state`` read by the own ``convert_state_dict`` of ``model``'s backbone (if it has
    one), under ``backbone.``."""
    convert_backbone = getattr(model.backbone, "convert_state_dict", None)
    if convert_backbone is not None:
        backbone_state = convert_backbone(backbone_state)
    converted.update({f"backbone.{k}": v for k, v in backbone_state.items()})
    return converted
