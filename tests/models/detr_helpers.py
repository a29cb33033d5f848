"""Shared by the DETR tests: DETR and DETRPanoptic weights in transformers' and facebookresearch/detr's
names, and a random padded batch with targets (weights are moved off their initial values by
``tests.parity.perturb_``)."""

from __future__ import annotations

import re

import torch

# vision_tx name -> transformers name, applied in order (transformer q/k/v rows are split separately).
_TO_TRANSFORMERS = [
    (r"^backbone\.stem\.0\.", "model.backbone.model.embedder.embedder.convolution."),
    (r"^backbone\.stem\.1\.", "model.backbone.model.embedder.embedder.normalization."),
    (r"^backbone\.stages\.(\d+)\.(\d+)\.conv(\d)\.", lambda m: f"model.backbone.model.encoder.stages.{m[1]}.layers.{m[2]}.layer.{int(m[3]) - 1}.convolution."),
    (r"^backbone\.stages\.(\d+)\.(\d+)\.bn(\d)\.", lambda m: f"model.backbone.model.encoder.stages.{m[1]}.layers.{m[2]}.layer.{int(m[3]) - 1}.normalization."),
    (r"^backbone\.stages\.(\d+)\.(\d+)\.downsample\.0\.", r"model.backbone.model.encoder.stages.\1.layers.\2.shortcut.convolution."),
    (r"^backbone\.stages\.(\d+)\.(\d+)\.downsample\.1\.", r"model.backbone.model.encoder.stages.\1.layers.\2.shortcut.normalization."),
    (r"^input_proj\.", "model.input_projection."),
    (r"^query_embed\.", "model.query_position_embeddings."),
    (r"^transformer\.(encoder|decoder)\.", r"model.\1."),
    (r"\.out_proj\.", ".o_proj."),
    (r"\.cross_attn\.", ".encoder_attn."),
    (r"\.linear(\d)\.", r".mlp.fc\1."),
    (r"(decoder\.layers\.\d+)\.norm2\.", r"\1.encoder_attn_layer_norm."),
    (r"(decoder\.layers\.\d+)\.norm3\.", r"\1.final_layer_norm."),
    (r"(encoder\.layers\.\d+)\.norm2\.", r"\1.final_layer_norm."),
    (r"\.norm1\.", ".self_attn_layer_norm."),
    (r"decoder\.norm\.", "decoder.layernorm."),
    (r"^class_embed\.", "class_labels_classifier."),
    (r"^bbox_embed\.", "bbox_predictor."),
]


# DETRPanoptic's heads -> transformers' DetrForSegmentation (bbox_attention's names are the same).
_MASK_HEAD_TO_TRANSFORMERS = [
    (r"^mask_head\.blocks\.([01])\.0\.", lambda m: f"mask_head.conv{int(m[1]) + 1}.conv."),
    (r"^mask_head\.blocks\.([01])\.1\.", lambda m: f"mask_head.conv{int(m[1]) + 1}.norm."),
    (r"^mask_head\.blocks\.(\d)\.0\.", lambda m: f"mask_head.fpn_stages.{int(m[1]) - 2}.refine.conv."),
    (r"^mask_head\.blocks\.(\d)\.1\.", lambda m: f"mask_head.fpn_stages.{int(m[1]) - 2}.refine.norm."),
    (r"^mask_head\.adapters\.(\d)\.", r"mask_head.fpn_stages.\1.fpn_adapter."),
    (r"^mask_head\.out_conv\.", "mask_head.output_conv."),
]

# DETRPanoptic's heads -> facebookresearch/detr's DETRsegm (models/segmentation.py).
_MASK_HEAD_TO_OFFICIAL = [
    (r"^bbox_attention\.([qk])_proj\.", r"bbox_attention.\1_linear."),
    (r"^mask_head\.blocks\.(\d)\.0\.", lambda m: f"mask_head.lay{int(m[1]) + 1}."),
    (r"^mask_head\.blocks\.(\d)\.1\.", lambda m: f"mask_head.gn{int(m[1]) + 1}."),
    (r"^mask_head\.adapters\.(\d)\.", lambda m: f"mask_head.adapter{int(m[1]) + 1}."),
    (r"^mask_head\.out_conv\.", "mask_head.out_lay."),
]


def _rename(key: str, renames: list) -> str:
    for pattern, replacement in renames:
        key = re.sub(pattern, replacement, key)
    return key


def _panoptic(state: dict[str, torch.Tensor], convert_detr, head_renames: list) -> dict[str, torch.Tensor]:
    """DETRPanoptic's state: the ``detr.`` part through ``convert_detr``, the heads through ``head_renames``."""
    detector = {k.removeprefix("detr."): v for k, v in state.items() if k.startswith("detr.")}
    converted = {f"detr.{k}": v for k, v in convert_detr(detector).items()}
    converted.update({_rename(k, head_renames): v for k, v in state.items() if not k.startswith("detr.")})
    return converted


def heads_to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys under ``bbox_attention.`` and ``mask_head.`` in transformers' names."""
    return {_rename(k, _MASK_HEAD_TO_TRANSFORMERS): v for k, v in state.items()}


def panoptic_to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _panoptic(state, to_transformers, _MASK_HEAD_TO_TRANSFORMERS)


def panoptic_to_official(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _panoptic(state, to_official, _MASK_HEAD_TO_OFFICIAL)


def to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    converted = {}
    for key, value in state.items():
        key = _rename(key, _TO_TRANSFORMERS)
        if key.endswith(("in_proj_weight", "in_proj_bias")):
            prefix, kind = key.rsplit(".in_proj_", 1)
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3)):
                converted[f"{prefix}.{name}.{kind}"] = part
        else:
            converted[key] = value
    return converted


def to_official(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """facebookresearch/detr's names: torchvision ResNet under backbone.0.body, cross-attention as multihead_attn."""
    renames = [
        (r"^backbone\.stem\.0\.", "backbone.0.body.conv1."),
        (r"^backbone\.stem\.1\.", "backbone.0.body.bn1."),
        (r"^backbone\.stages\.(\d)\.", lambda m: f"backbone.0.body.layer{int(m[1]) + 1}."),
        (r"\.cross_attn\.", ".multihead_attn."),
    ]
    return {_rename(key, renames): value for key, value in state.items()}


def padded_batch(
    size: tuple[int, int], second_size: tuple[int, int], num_boxes: tuple[int, int], num_classes: int, with_masks: bool = False
) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]]:
    """Two random ``size`` images, the second one padding around a ``second_size`` image, and their
    targets: ``labels``, normalised cxcywh ``boxes`` and, ``with_masks``, unpadded random ``masks``."""
    generator = torch.Generator().manual_seed(2)
    images = torch.randn(2, 3, *size, generator=generator)
    pixel_mask = torch.zeros(2, *size, dtype=torch.bool)
    pixel_mask[1, second_size[0] :, :] = True
    pixel_mask[1, :, second_size[1] :] = True
    images[pixel_mask[:, None].expand_as(images)] = 0
    targets = []
    for num, image_size in zip(num_boxes, (size, second_size)):
        centers = 0.3 + 0.4 * torch.rand(num, 2, generator=generator)
        sizes = 0.05 + 0.3 * torch.rand(num, 2, generator=generator)
        labels = torch.randint(1, num_classes, (num,), generator=generator)
        target = {"labels": labels, "boxes": torch.cat([centers, sizes], 1)}
        if with_masks:
            target["masks"] = torch.rand(num, *image_size, generator=generator) > 0.7
        targets.append(target)
    return images, pixel_mask, targets


def transformers_config(num_classes: int, stages: list[str], **overrides: object):
    """transformers' ``DetrConfig`` of a randomly initialised ResNet-50 DETR returning ``stages``, without auxiliary loss."""
    import transformers

    return transformers.DetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=transformers.ResNetConfig(out_features=stages),
        num_labels=num_classes,
        auxiliary_loss=False,
        **overrides,
    )
