"""facebookresearch/Mask2Former checkpoint names (``maskformer_model.py``, ``msdeformattn.py``,
``mask2former_transformer_decoder.py``) -> vision_tx's Mask2Former."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

_PIXEL = r"^sem_seg_head\.pixel_decoder\."
_PREDICTOR = r"^sem_seg_head\.predictor\."
# Applied in order to every head key.
_HEAD_KEYS = [
    (_PIXEL + r"input_proj\.", "pixel_decoder.projection.input_proj."),
    (_PIXEL + r"transformer\.level_embed$", "pixel_decoder.projection.level_embed"),
    (_PIXEL + r"transformer\.encoder\.layers\.(\d+)\.linear(\d)\.", r"pixel_decoder.encoder.layers.\1.ffn.linear\2."),
    (_PIXEL + r"transformer\.encoder\.layers\.(\d+)\.norm2\.", r"pixel_decoder.encoder.layers.\1.ffn.norm."),
    (_PIXEL + r"transformer\.encoder\.", "pixel_decoder.encoder."),
    (_PIXEL + r"mask_features\.", "pixel_decoder.mask_features."),
    (_PREDICTOR + r"transformer_self_attention_layers\.(\d+)\.self_attn\.", r"predictor.layers.\1.self_attn."),
    (_PREDICTOR + r"transformer_self_attention_layers\.(\d+)\.norm\.", r"predictor.layers.\1.norm2."),
    (_PREDICTOR + r"transformer_cross_attention_layers\.(\d+)\.multihead_attn\.", r"predictor.layers.\1.cross_attn."),
    (_PREDICTOR + r"transformer_cross_attention_layers\.(\d+)\.norm\.", r"predictor.layers.\1.norm1."),
    (_PREDICTOR + r"transformer_ffn_layers\.(\d+)\.", r"predictor.layers.\1.ffn."),
    (_PREDICTOR, "predictor."),
]
# The detectron2 Conv2d of the FPN step: its weight, and its GroupNorm as ``.norm``.
_FPN = re.compile(_PIXEL + r"(adapter|layer)_(\d+)\.(weight|norm\.weight|norm\.bias)$")


def is_official_mask2former(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """True for a ``state_dict`` in facebookresearch/Mask2Former's layout (it has ``sem_seg_head.predictor.`` keys)."""
    return any(key.startswith("sem_seg_head.predictor.") for key in state_dict)


def convert_official_mask2former(
    state_dict: Mapping[str, torch.Tensor], backbone: torch.nn.Module, num_fpn_levels: int
) -> dict[str, torch.Tensor]:
    """Renames an official checkpoint's ``model`` dict, ``state_dict``. ``backbone.*`` goes through the converter of
    ``backbone`` (the model's backbone module; the D2SwinTransformer is the mmdetection Swin layout);
    ``adapter_k``/``layer_k`` (k = 1 for the finest map) become ``lateral_convs``/``output_convs``, stored coarsest
    first (index ``num_fpn_levels - k``, ``num_fpn_levels`` the pixel decoder's lateral levels); the criterion's
    ``empty_weight`` is dropped (recomputed from ``eos_coef``)."""
    backbone_keys, converted = {}, {}
    for key, value in state_dict.items():
        if key.startswith("backbone."):
            backbone_keys[key.removeprefix("backbone.")] = value
            continue
        if key == "criterion.empty_weight":
            continue
        fpn = _FPN.match(key)
        if fpn:
            kind, index, part = fpn[1], num_fpn_levels - int(fpn[2]), fpn[3]
            module = "lateral_convs" if kind == "adapter" else "output_convs"
            converted[
                f"pixel_decoder.{module}.{index}.{'0.weight' if part == 'weight' else '1.' + part.split('.')[1]}"
            ] = value
            continue
        for pattern, replacement in _HEAD_KEYS:
            key = re.sub(pattern, replacement, key)
        converted[key] = value
    convert = getattr(backbone, "convert_state_dict", None)
    converted.update({f"backbone.{k}": v for k, v in (convert(backbone_keys) if convert else backbone_keys).items()})
    return converted
