"""Shared by the DETR tests: facebookresearch/detr checkpoints and vision_tx's mask head in transformers'
names, transformers' configuration, and a random padded batch with targets."""

from __future__ import annotations

import re

import torch

# facebookresearch/detr name -> transformers name (DetrForObjectDetection / DetrForSegmentation), applied
# in order; ``(detr\.)?`` keeps DETRsegm's prefix. nn.MultiheadAttention's packed q/k/v rows are split
# separately. Names from transformers' convert_detr_*_to_pytorch scripts and its Detr* modules.
_OFFICIAL_TO_TRANSFORMERS = [
    (r"^(detr\.)?backbone\.0\.body\.conv1\.", r"\1model.backbone.model.embedder.embedder.convolution."),
    (r"^(detr\.)?backbone\.0\.body\.bn1\.", r"\1model.backbone.model.embedder.embedder.normalization."),
    (
        r"^(detr\.)?backbone\.0\.body\.layer(\d)\.(\d+)\.conv(\d)\.",
        lambda m: (
            f"{m[1] or ''}model.backbone.model.encoder.stages.{int(m[2]) - 1}.layers.{m[3]}"
            f".layer.{int(m[4]) - 1}.convolution."
        ),
    ),
    (
        r"^(detr\.)?backbone\.0\.body\.layer(\d)\.(\d+)\.bn(\d)\.",
        lambda m: (
            f"{m[1] or ''}model.backbone.model.encoder.stages.{int(m[2]) - 1}.layers.{m[3]}"
            f".layer.{int(m[4]) - 1}.normalization."
        ),
    ),
    (
        r"^(detr\.)?backbone\.0\.body\.layer(\d)\.(\d+)\.downsample\.([01])\.",
        lambda m: (
            f"{m[1] or ''}model.backbone.model.encoder.stages.{int(m[2]) - 1}.layers.{m[3]}.shortcut."
            + ("convolution." if m[4] == "0" else "normalization.")
        ),
    ),
    (r"^(detr\.)?input_proj\.", r"\1model.input_projection."),
    (r"^(detr\.)?query_embed\.", r"\1model.query_position_embeddings."),
    (r"^(detr\.)?transformer\.(encoder|decoder)\.", r"\1model.\2."),
    (r"\.out_proj\.", ".o_proj."),
    (r"\.multihead_attn\.", ".encoder_attn."),
    (r"\.linear(\d)\.", r".mlp.fc\1."),
    (r"(decoder\.layers\.\d+)\.norm2\.", r"\1.encoder_attn_layer_norm."),
    (r"(decoder\.layers\.\d+)\.norm3\.", r"\1.final_layer_norm."),
    (r"(encoder\.layers\.\d+)\.norm2\.", r"\1.final_layer_norm."),
    (r"\.norm1\.", ".self_attn_layer_norm."),
    (r"decoder\.norm\.", "decoder.layernorm."),
    (r"^(detr\.)?class_embed\.", r"\1class_labels_classifier."),
    (r"^(detr\.)?bbox_embed\.", r"\1bbox_predictor."),
    # DETRsegm's heads.
    (r"^bbox_attention\.([qk])_linear\.", r"bbox_attention.\1_proj."),
    (r"^mask_head\.lay([12])\.", r"mask_head.conv\1.conv."),
    (r"^mask_head\.gn([12])\.", r"mask_head.conv\1.norm."),
    (r"^mask_head\.lay([345])\.", lambda m: f"mask_head.fpn_stages.{int(m[1]) - 3}.refine.conv."),
    (r"^mask_head\.gn([345])\.", lambda m: f"mask_head.fpn_stages.{int(m[1]) - 3}.refine.norm."),
    (r"^mask_head\.adapter(\d)\.", lambda m: f"mask_head.fpn_stages.{int(m[1]) - 1}.fpn_adapter."),
    (r"^mask_head\.out_lay\.", "mask_head.output_conv."),
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


def _rename(key: str, renames: list) -> str:
    for pattern, replacement in renames:
        key = re.sub(pattern, replacement, key)
    return key


def heads_to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys under ``bbox_attention.`` and ``mask_head.`` in transformers' names."""
    return {_rename(k, _MASK_HEAD_TO_TRANSFORMERS): v for k, v in state.items()}


def official_to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A facebookresearch/detr DETR or DETRsegm state dict in transformers' names."""
    converted = {}
    for key, value in state.items():
        key = _rename(key, _OFFICIAL_TO_TRANSFORMERS)
        if key.endswith(("in_proj_weight", "in_proj_bias")):
            prefix, kind = key.rsplit(".in_proj_", 1)
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3)):
                converted[f"{prefix}.{name}.{kind}"] = part
        else:
            converted[key] = value
    return converted


def padded_batch(
    size: tuple[int, int],
    second_size: tuple[int, int],
    num_boxes: tuple[int, int],
    num_classes: int,
    with_masks: bool = False,
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
    """transformers' ``DetrConfig`` of a randomly initialised ResNet-50 DETR returning ``stages``, without auxiliary
    loss."""
    import transformers

    return transformers.DetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=transformers.ResNetConfig(out_features=stages),
        num_labels=num_classes,
        auxiliary_loss=False,
        **overrides,
    )
