"""Peterande/D-FINE checkpoints (e.g. ``dfine_l_coco.pth``) in vision_tx's D-FINE layout: D-FINE's own names are
renamed to RT-DETR's official ones, which :func:`~vision_tx.models.rtdetr_official.convert_official_rtdetr` reads."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn

from vision_tx.models.query_detector import renamed_key
from vision_tx.models.rtdetr_official import convert_official_rtdetr

# D-FINE's name -> RT-DETR's official name (or vision_tx's, where RT-DETR has no such tensor); the first match wins.
_RENAMES = (
    (r"^encoder\.input_proj\.(\d+)\.conv\.", r"encoder.input_proj.\1.0."),
    (r"^encoder\.input_proj\.(\d+)\.norm\.", r"encoder.input_proj.\1.1."),
    (r"^encoder\.(fpn|pan)_blocks\.(\d+)\.cv1\.", r"encoder.\1_blocks.\2.conv1."),
    (r"^encoder\.(fpn|pan)_blocks\.(\d+)\.cv2\.0\.", r"encoder.\1_blocks.\2.csp_rep1."),
    (r"^encoder\.(fpn|pan)_blocks\.(\d+)\.cv2\.1\.", r"encoder.\1_blocks.\2.conv2."),
    (r"^encoder\.(fpn|pan)_blocks\.(\d+)\.cv3\.0\.", r"encoder.\1_blocks.\2.csp_rep2."),
    (r"^encoder\.(fpn|pan)_blocks\.(\d+)\.cv3\.1\.", r"encoder.\1_blocks.\2.conv3."),
    (r"^encoder\.(fpn|pan)_blocks\.(\d+)\.cv4\.", r"encoder.\1_blocks.\2.conv4."),
    (r"^encoder\.downsample_convs\.(\d+)\.0\.cv(\d)\.", r"encoder.downsample_convs.\1.conv\2."),
    (r"^decoder\.enc_output\.proj\.", "decoder.enc_output.0."),
    (r"^decoder\.enc_output\.norm\.", "decoder.enc_output.1."),
    (r"^decoder\.decoder\.lqe_layers\.", "decoder.lqe_layers."),
)
# Tensors vision_tx derives instead of loading: the second references to up and reg_scale (the decoder's own,
# equal to ``decoder.up`` and ``decoder.reg_scale``), the points' scales, the anchors of a fixed image size.
_DERIVED = re.compile(
    r"^decoder\.decoder\.(up|reg_scale)$|\.cross_attn\.num_points_scale$|^decoder\.(anchors|valid_mask)$"
)


def is_official_dfine(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """True for a ``state_dict`` in Peterande/D-FINE's layout."""
    return "decoder.enc_score_head.weight" in state_dict and "decoder.pre_bbox_head.layers.0.weight" in state_dict


def convert_official_dfine(state_dict: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Renames an official D-FINE ``state_dict`` to the keys of ``model`` (a :class:`vision_tx.models.DFINE`): the
    GELAN blocks' ``cv1``..``cv4`` (``cv2``, ``cv3``: a CSP layer and a conv) and SCDown's ``cv1``, ``cv2`` take
    transformers' names, the rest is RT-DETR's layout (enc heads as the last heads, the denoising padding row
    dropped, the backbone through its own converter). The derived tensors (``_DERIVED``) are dropped."""
    renamed = {renamed_key(key, _RENAMES): value for key, value in state_dict.items() if not _DERIVED.search(key)}
    return convert_official_rtdetr(renamed, model)
