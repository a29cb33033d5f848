"""IDEA-Research/DINO checkpoints (e.g. ``checkpoint0011_4scale.pth``, ``checkpoint0029_4scale_swin.pth``)
in vision_tx's DINO layout."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn

from vision_tx.models.query_detector import renamed_key, with_backbone_state

# Official name (a regular expression on the key) -> vision_tx's; the first match wins.
_RENAMES = (
    (r"^transformer\.level_embed$", "neck.level_embed"),
    (r"^input_proj\.", "neck.input_proj."),
    (r"^transformer\.tgt_embed\.", "query_embed."),
    (r"^transformer\.(enc_output|enc_output_norm)\.", r"\1."),
    (r"^label_enc\.", "denoising.label_embed."),
    (r"^transformer\.decoder\.(ref_point_head|norm)\.", r"decoder.\1."),
    (r"^transformer\.encoder\.layers\.(\d+)\.norm2\.", r"encoder.layers.\1.ffn.norm."),
    (r"^transformer\.encoder\.layers\.(\d+)\.(linear[12])\.", r"encoder.layers.\1.ffn.\2."),
    (r"^transformer\.encoder\.", "encoder."),
    # The decoder layer's norms: the official norm2 follows self-attention, norm1 cross-attention.
    (r"^transformer\.decoder\.layers\.(\d+)\.norm2\.", r"decoder.layers.\1.norm1."),
    (r"^transformer\.decoder\.layers\.(\d+)\.norm1\.", r"decoder.layers.\1.norm2."),
    (r"^transformer\.decoder\.layers\.(\d+)\.norm3\.", r"decoder.layers.\1.ffn.norm."),
    (r"^transformer\.decoder\.layers\.(\d+)\.(linear[12])\.", r"decoder.layers.\1.ffn.\2."),
    (r"^transformer\.decoder\.layers\.", "decoder.layers."),
)


def is_official_dino(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """True for a ``state_dict`` in IDEA-Research/DINO's layout."""
    return "transformer.level_embed" in state_dict or "label_enc.weight" in state_dict


def convert_official_dino(state_dict: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Renames an official DINO ``state_dict`` to the keys of ``model`` (a :class:`vision_tx.models.DINO`).

    - The decoder layers' class and box heads are one shared module in the official model (also
      listed under ``transformer.decoder.``); each layer's head here starts as a copy of it. The
      encoder's proposal heads ``transformer.enc_out_{class,bbox}_embed`` are the last heads here.
    - ``label_enc`` has a row per class plus one the denoising never draws (``dn_labelbook_size``), dropped
      here: the rest has a row per official class, so that ``load_weights(..., class_keys=DINO.class_keys)``
      leaves a model of another number of classes (one more included) its own rows, and names them.
    - ``ref_point_head`` reads the sine embedding of (y, x, w, h) officially, of (x, y, w, h) here:
      the first two blocks of its input columns are swapped.
    - The backbone (``backbone.0.`` for Swin, ``backbone.0.body.`` for ResNet) goes through the
      backbone's own ``convert_state_dict``.
    """
    num_layers = len(model.decoder.layers)
    backbone_state, converted = {}, {}
    for key, value in state_dict.items():
        if key.startswith("backbone."):
            backbone_state[re.sub(r"^0\.(body\.)?", "", key.removeprefix("backbone."))] = value
            continue
        if key.startswith(("transformer.decoder.class_embed.", "transformer.decoder.bbox_embed.")):
            continue  # the same tensors as class_embed.* and bbox_embed.*
        match = re.match(r"^transformer\.enc_out_(class|bbox)_embed\.", key)
        if match:
            converted[f"{match.group(1)}_embed.{num_layers}.{key[match.end() :]}"] = value
            continue
        if key == "label_enc.weight":
            value = value[:-1]
        if key == "transformer.decoder.ref_point_head.layers.0.weight":
            quarter = value.shape[1] // 4
            value = torch.cat([value[:, quarter : 2 * quarter], value[:, :quarter], value[:, 2 * quarter :]], 1)
        converted[renamed_key(key, _RENAMES)] = value
    return with_backbone_state(converted, backbone_state, model)
