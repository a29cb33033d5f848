"""lyuwenyu/RT-DETR checkpoints (rtdetr_pytorch, e.g. ``rtdetr_r50vd_6x_coco_from_paddle.pth``) in vision_tx's
RT-DETR layout."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn

from vision_tx.models.query_detector import renamed_key, with_backbone_state

# Official name (a regular expression on the key) -> vision_tx's; the first match wins. The hybrid
# encoder (``encoder.``) has the official names but for its one AIFI stack.
_RENAMES = (
    (r"^encoder\.encoder\.0\.layers\.", "encoder.encoder.layers."),
    (r"^decoder\.input_proj\.(\d+)\.conv\.", r"decoder_input_proj.\1.0."),
    (r"^decoder\.input_proj\.(\d+)\.norm\.", r"decoder_input_proj.\1.1."),
    (r"^decoder\.decoder\.layers\.(\d+)\.(linear[12])\.", r"decoder.layers.\1.ffn.\2."),
    (r"^decoder\.decoder\.layers\.(\d+)\.norm3\.", r"decoder.layers.\1.ffn.norm."),
    (r"^decoder\.decoder\.layers\.", "decoder.layers."),
    (r"^decoder\.query_pos_head\.", "decoder.ref_point_head."),
    (r"^decoder\.enc_output\.0\.", "enc_output."),
    (r"^decoder\.enc_output\.1\.", "enc_output_norm."),
    (r"^decoder\.denoising_class_embed\.", "denoising.label_embed."),
    (r"^decoder\.tgt_embed\.", "query_embed."),
    (r"^decoder\.dec_score_head\.", "class_embed."),
    (r"^decoder\.dec_bbox_head\.", "bbox_embed."),
)


def is_official_rtdetr(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """True for a ``state_dict`` in lyuwenyu/RT-DETR's layout."""
    return "decoder.enc_score_head.weight" in state_dict


def convert_official_rtdetr(state_dict: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Renames an official RT-DETR ``state_dict`` to the keys of ``model`` (a :class:`vision_tx.models.RTDETR`).

    - The encoder's proposal heads ``decoder.enc_{score,bbox}_head`` are the last class and box heads here.
    - ``denoising_class_embed`` has a last padding row (``padding_idx=num_classes``), dropped here (padding
      slots are zeroed instead): the rest has a row per official class, so that ``load_weights(...,
      class_keys=RTDETR.class_keys)`` leaves a model of another number of classes its own rows, and names them.
    - The backbone (``backbone.``) goes through the backbone's own ``convert_state_dict``; the
      official PResNet-vd has no vision_tx counterpart, so its tensors only load into a backbone that reads them.
    """
    num_layers = len(model.decoder.layers)
    backbone_state, converted = {}, {}
    for key, value in state_dict.items():
        if key.startswith("backbone."):
            backbone_state[key.removeprefix("backbone.")] = value
            continue
        match = re.match(r"^decoder\.enc_(score|bbox)_head\.", key)
        if match:
            converted[f"{'class' if match.group(1) == 'score' else 'bbox'}_embed.{num_layers}.{key[match.end() :]}"] = (
                value
            )
            continue
        if key == "decoder.denoising_class_embed.weight":
            value = value[:-1]
        converted[renamed_key(key, _RENAMES)] = value
    return with_backbone_state(converted, backbone_state, model)
