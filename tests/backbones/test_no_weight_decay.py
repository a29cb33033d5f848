"""``no_weight_decay()`` of every backbone, classifier and composed model (timm's convention: a set of
parameter names) against the parameters themselves: every name exists, and exactly the norms, biases,
layer scales, position tables and tokens are in it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vision_tx.backbones import build_backbone, build_classifier, list_backbones
from vision_tx.models import DETR, DINO, RTDETR, DETRPanoptic, Mask2Former, UperNetSegmentor

# Position and bias tables and tokens, by the names the papers' official code gives them.
TABLES_AND_TOKENS = ("relative_position_bias_table", "rpb", "pos_embed", "cls_token", "dist_token")
NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm)
SMALL = {
    "swin": dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1)),
    "nat": dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1)),
    "convnext": dict(depths=(1, 1, 1, 1), dims=(8, 8, 8, 8)),
    "vit": dict(depth=1),
    "deit": dict(depth=1),
    "mixer": dict(depth=1),
    "resnet": {},
}


def small(name: str) -> dict:
    return SMALL[name.split("_")[0].removesuffix("50").removesuffix("101")]


def expected_exemptions(model: nn.Module) -> set[str]:
    """Norm parameters, biases, other one-dimensional parameters (layer scales), tables and tokens."""
    norms = {
        f"{module_name}.{name}" if module_name else name
        for module_name, module in model.named_modules()
        if isinstance(module, NORMS)
        for name, _ in module.named_parameters(recurse=False)
    }
    return norms | {
        name
        for name, param in model.named_parameters()
        if name.endswith("bias") or param.ndim <= 1 or name.split(".")[-1] in TABLES_AND_TOKENS
    }


def check(model: nn.Module) -> set[str]:
    names = model.no_weight_decay()
    parameters = {name for name, _ in model.named_parameters()}
    assert names <= parameters, sorted(names - parameters)[:5]
    assert names == expected_exemptions(model), sorted(names ^ expected_exemptions(model))[:5]
    return names


@pytest.mark.parametrize("name", list_backbones())
def test_every_backbone_and_classifier_names_its_exempt_parameters(name: str) -> None:
    torch.manual_seed(0)
    exempt = check(build_classifier(name, 10, **small(name)))
    if not name.startswith("mixer"):
        exempt |= check(build_backbone(name, **small(name)))
    tables = {part for part in TABLES_AND_TOKENS for n in exempt if n.endswith(part)}
    family = {
        "swin": {"relative_position_bias_table"},
        "nat": {"rpb"},
        "vit": {"pos_embed", "cls_token"},
        "deit": {"pos_embed", "cls_token"} | ({"dist_token"} if name.endswith("distilled") else set()),
    }
    assert tables == family.get(name.split("_")[0], set())


def test_composed_models_add_their_own_norms_and_biases_to_the_backbones_exemptions() -> None:
    torch.manual_seed(0)
    swin = dict(embed_dim=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))
    detr = dict(
        num_queries=5, hidden_dim=128, num_heads=8, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=64
    )
    models = {
        "detr": DETR(build_backbone("deit_tiny_distilled", depth=1, out_indices=(3,)), 4, **detr),
        "dino": DINO.build(
            build_backbone("swin_t", out_indices=(1, 2, 3), **swin), 4, **{**detr, "num_decoder_layers": 2}
        ),
        "rtdetr": RTDETR.build(
            build_backbone("swin_t", out_indices=(1, 2, 3), **swin),
            4,
            **{**detr, "num_decoder_layers": 2, "expansion": 0.5, "num_blocks": 1},
        ),
        "panoptic": DETRPanoptic(DETR(build_backbone("swin_t", **swin), 4, **detr)),
        "upernet": UperNetSegmentor(build_backbone("nat_mini", **swin), 5, channels=16, aux_channels=8),
        "mask2former": Mask2Former(
            build_backbone("swin_t", **swin),
            4,
            num_queries=5,
            hidden_dim=32,
            mask_dim=32,
            num_heads=2,
            num_decoder_layers=1,
            dim_feedforward=32,
            num_encoder_layers=1,
            encoder_dim_feedforward=32,
            num_groups=8,
        ),
    }
    for key, model in models.items():
        exempt = check(model)
        assert any(
            n.startswith(("backbone.", "detr.backbone.")) and n.split(".")[-1] in TABLES_AND_TOKENS for n in exempt
        ), key
