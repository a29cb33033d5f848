"""Every constructor default of RT-DETR, Mask2Former, DETR and UperNet (and of their criteria and matchers)
against the value in the official config file or training command, each row naming the file it was read
from (DINO's table is ``tests/models/test_dino.py::test_defaults_are_the_official_dino_4scale_config``). A
default that has no official counterpart is listed as vision_tx's own, so that a new default must join one
table or the other."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from vision_tx.heads.detr.criterion import SetCriterion
from vision_tx.heads.dfine import DFINECriterion
from vision_tx.heads.mask2former import Mask2FormerCriterion
from vision_tx.heads.rtdetr.criterion import RTDETRCriterion
from vision_tx.models import DETR, DFINE, RTDETR, Mask2Former
from vision_tx.models.segmentor import UperNetSegmentor

RT_YML = "lyuwenyu/RT-DETR rtdetr_pytorch/configs/rtdetr/include/rtdetr_r50vd.yml"
RT_DECODER = (
    "lyuwenyu/RT-DETR rtdetr_pytorch/src/zoo/rtdetr/rtdetr_decoder.py (RTDETRTransformer's defaults, kept by the yml)"
)
RT_ENCODER = (
    "lyuwenyu/RT-DETR rtdetr_pytorch/src/zoo/rtdetr/hybrid_encoder.py "
    "(CSPRepLayer of round(3 * depth_mult) blocks, depth_mult 1)"
)
M2F_YML = "facebookresearch/Mask2Former configs/ade20k/semantic-segmentation/maskformer2_R50_bs16_160k.yaml"
M2F_PIXEL = "facebookresearch/Mask2Former mask2former/modeling/pixel_decoder/msdeformattn.py"
M2F_MODEL = "facebookresearch/Mask2Former mask2former/maskformer_model.py (the matcher's costs are the loss weights)"
D2_DEFAULTS = (
    "facebookresearch/detectron2 detectron2/config/defaults.py "
    "(TEST.DETECTIONS_PER_IMAGE, kept by Mask2Former's configs)"
)
DETR_MAIN = "facebookresearch/detr main.py (the argument defaults of the training command)"
DETR_MODEL = "facebookresearch/detr models/detr.py (build: weight_dict)"
MMSEG = "open-mmlab/mmsegmentation configs/_base_/models/upernet_swin.py"
MMSEG_HEAD = "open-mmlab/mmsegmentation mmseg/models/decode_heads/decode_head.py (BaseDecodeHead's defaults)"
DF_YML = "Peterande/D-FINE configs/dfine/include/dfine_hgnetv2.yml (D-FINE-L: dfine_hgnetv2_l_coco.yml keeps it)"
DF_DECODER = "Peterande/D-FINE src/zoo/dfine/dfine_decoder.py (DFINETransformer's defaults, kept by the yml)"
DF_LQE = "Peterande/D-FINE src/zoo/dfine/dfine_decoder.py: TransformerDecoder's LQE(4, 64, 2, reg_max)"
DF_CRITERION = "Peterande/D-FINE src/zoo/dfine/dfine_criterion.py: loss_local(T=5)"
DEIM_YML = "ShihuaHuang95/DEIM (DEIMCriterion: gamma 1.5 in the DEIM configs, mal_alpha None, its default)"
OWN = "vision_tx's own option (no official counterpart)"

# name -> (official value, the file it comes from), per constructor.
TABLES: dict[str, tuple[Callable[..., Any], dict[str, tuple[Any, str]]]] = {
    "RTDETR": (
        RTDETR.build,
        {
            "num_queries": (300, RT_YML),
            "hidden_dim": (256, RT_YML),
            "num_heads": (8, RT_YML),
            "num_encoder_layers": (1, RT_YML),
            "encoder_feedforward": (1024, RT_YML),
            "expansion": (1.0, RT_YML),
            "num_blocks": (3, RT_ENCODER),
            "num_decoder_layers": (6, RT_YML),
            "dim_feedforward": (1024, RT_DECODER),
            "dropout": (0.0, RT_YML),
            "num_levels": (3, RT_YML),
            "num_points": (4, RT_DECODER),
            "learn_query_content": (False, RT_DECODER),
            "num_denoising": (100, RT_YML),
            "label_noise_ratio": (0.5, RT_DECODER),
            "box_noise_scale": (1.0, RT_DECODER),
            "look_forward_twice": (True, f"{RT_DECODER}: each layer's box loss reads the previous layer's refined box"),
            "num_detections": (300, f"{RT_YML}: RTDETRPostProcessor.num_top_queries"),
            "nms_threshold": (None, OWN),
            "share_scores": (False, OWN),
            "box_refinement": (False, OWN),
        },
    ),
    "RTDETRCriterion": (
        RTDETRCriterion,
        {
            "weight_vfl": (1.0, RT_YML),
            "weight_bbox": (5.0, RT_YML),
            "weight_giou": (2.0, RT_YML),
            "vfl_alpha": (0.75, RT_YML),
            "vfl_gamma": (2.0, RT_YML),
            "focal_alpha": (0.25, f"{RT_YML}: the matcher's alpha"),
            "focal_gamma": (2.0, f"{RT_YML}: the matcher's gamma"),
            "class_loss": ("vfl", f"{RT_YML}: losses ['vfl', 'boxes']"),
            "mal_alpha": (None, DEIM_YML),
            "mal_gamma": (1.5, DEIM_YML),
        },
    ),
    "DFINE": (
        DFINE.build,
        {
            "num_queries": (300, DF_YML),
            "hidden_dim": (256, DF_YML),
            "num_heads": (8, DF_YML),
            "num_encoder_layers": (1, DF_YML),
            "encoder_feedforward": (1024, DF_YML),
            "expansion": (1.0, DF_YML),
            "num_blocks": (3, f"{DF_YML}: round(3 * depth_mult 1)"),
            "num_decoder_layers": (6, DF_YML),
            "dim_feedforward": (1024, DF_DECODER),
            "dropout": (0.0, DF_YML),
            "num_levels": (3, DF_YML),
            "num_points": ((3, 6, 3), DF_YML),
            "reg_max": (32, DF_YML),
            "reg_scale": (4.0, DF_YML),
            "up": (0.5, f"{DF_DECODER}: self.up = nn.Parameter(torch.tensor([0.5]))"),
            "lqe_top_k": (4, DF_LQE),
            "lqe_hidden_dim": (64, DF_LQE),
            "lqe_layers": (2, DF_LQE),
            "learn_query_content": (False, DF_DECODER),
            "num_denoising": (100, DF_YML),
            "label_noise_ratio": (0.5, DF_YML),
            "box_noise_scale": (1.0, DF_YML),
            "num_detections": (300, f"{DF_YML}: DFINEPostProcessor.num_top_queries"),
            "nms_threshold": (None, OWN),
            "share_scores": (False, OWN),
        },
    ),
    "DFINECriterion": (
        DFINECriterion,
        {
            "weight_vfl": (1.0, DF_YML),
            "weight_bbox": (5.0, DF_YML),
            "weight_giou": (2.0, DF_YML),
            "weight_fgl": (0.15, DF_YML),
            "weight_ddf": (1.5, DF_YML),
            "reg_max": (32, DF_YML),
            "temperature": (5.0, DF_CRITERION),
            "union_matching": (
                True,
                "Peterande/D-FINE src/zoo/dfine/dfine_criterion.py: _get_go_indices for boxes and local",
            ),
        },
    ),
    "Mask2Former": (
        Mask2Former,
        {
            "num_queries": (100, M2F_YML),
            "hidden_dim": (256, M2F_YML),
            "mask_dim": (256, M2F_YML),
            "num_heads": (8, M2F_YML),
            "num_decoder_layers": (9, f"{M2F_YML}: DEC_LAYERS 10, the initial prediction and 9 layers"),
            "dim_feedforward": (2048, M2F_YML),
            "num_encoder_layers": (6, M2F_YML),
            "encoder_dim_feedforward": (1024, f"{M2F_PIXEL}: from_config"),
            "num_points": (4, f"{M2F_PIXEL}: enc_n_points"),
            "num_groups": (32, f"{M2F_PIXEL}: nn.GroupNorm(32, conv_dim)"),
            "dropout": (0.0, M2F_YML),
            "ignore_index": (255, M2F_YML),
            "object_mask_threshold": (0.8, M2F_YML),
            "overlap_threshold": (0.8, M2F_YML),
            "test_topk": (100, D2_DEFAULTS),
        },
    ),
    "Mask2FormerCriterion": (
        Mask2FormerCriterion,
        {
            "weight_ce": (2.0, M2F_YML),
            "weight_mask": (5.0, M2F_YML),
            "weight_dice": (5.0, M2F_YML),
            "eos_coef": (0.1, M2F_YML),
            "num_points": (12544, M2F_YML),
            "oversample_ratio": (3.0, M2F_YML),
            "importance_sample_ratio": (0.75, M2F_YML),
        },
    ),
    "DETR": (
        DETR,
        {
            "num_queries": (100, DETR_MAIN),
            "hidden_dim": (256, DETR_MAIN),
            "num_heads": (8, DETR_MAIN),
            "num_encoder_layers": (6, DETR_MAIN),
            "num_decoder_layers": (6, DETR_MAIN),
            "dim_feedforward": (2048, DETR_MAIN),
            "dropout": (0.1, DETR_MAIN),
            "aux_loss": (True, DETR_MAIN),
            "grad_checkpointing": (False, OWN),
        },
    ),
    "SetCriterion": (
        SetCriterion,
        {
            "weight_ce": (1.0, DETR_MODEL),
            "weight_bbox": (5.0, DETR_MAIN),
            "weight_giou": (2.0, DETR_MAIN),
            "eos_coef": (0.1, DETR_MAIN),
            "weight_mask": (1.0, DETR_MAIN),
            "weight_dice": (1.0, DETR_MAIN),
        },
    ),
    "UperNetSegmentor": (
        UperNetSegmentor,
        {
            "channels": (512, MMSEG),
            "pool_scales": ((1, 2, 3, 6), MMSEG),
            "aux_channels": (256, MMSEG),
            "aux_in_index": (2, MMSEG),
            "aux_loss_weight": (0.4, MMSEG),
            "dropout": (0.1, MMSEG),
            "ignore_index": (255, MMSEG_HEAD),
            "align_corners": (False, MMSEG),
        },
    ),
}
# The matchers each criterion builds when given none: attribute -> (official value, file).
MATCHERS: dict[str, tuple[Callable[[], Any], dict[str, tuple[Any, str]]]] = {
    "RTDETRCriterion": (
        lambda: RTDETRCriterion(5).matcher,
        {
            "cost_class": (2.0, RT_YML),
            "cost_bbox": (5.0, RT_YML),
            "cost_giou": (2.0, RT_YML),
            "focal_alpha": (0.25, RT_YML),
            "focal_gamma": (2.0, RT_YML),
        },
    ),
    "DFINECriterion": (
        lambda: DFINECriterion(5).matcher,
        {
            "cost_class": (2.0, DF_YML),
            "cost_bbox": (5.0, DF_YML),
            "cost_giou": (2.0, DF_YML),
            "focal_alpha": (0.25, DF_YML),
            "focal_gamma": (2.0, DF_YML),
        },
    ),
    "Mask2FormerCriterion": (
        lambda: Mask2FormerCriterion(5).matcher,
        {
            "cost_class": (2.0, M2F_MODEL),
            "cost_mask": (5.0, M2F_MODEL),
            "cost_dice": (5.0, M2F_MODEL),
            "num_points": (12544, M2F_MODEL),
        },
    ),
    "SetCriterion": (
        lambda: SetCriterion(5).matcher,
        {
            "cost_class": (1.0, DETR_MAIN),
            "cost_bbox": (5.0, DETR_MAIN),
            "cost_giou": (2.0, DETR_MAIN),
            "focal_alpha": (None, DETR_MAIN),
        },
    ),
}
NOT_SETTINGS = {"matcher_kwargs", "criterion_kwargs", "matcher"}  # what builds the matcher and criterion, no setting


def disagreements(actual: dict[str, Any], table: dict[str, tuple[Any, str]]) -> list[str]:
    """One line per entry of ``table`` whose value differs from ``actual``'s, naming the official file."""
    return [
        f"{name} = {actual[name]!r}, official {value!r} ({source})"
        for name, (value, source) in table.items()
        if actual[name] != value
    ]


@pytest.mark.parametrize("name", sorted(TABLES))
def test_constructor_defaults_are_the_official_values(name: str) -> None:
    constructor, table = TABLES[name]
    defaults = {
        k: p.default
        for k, p in inspect.signature(constructor).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    assert set(defaults) - NOT_SETTINGS == set(table)  # every default has its row
    assert not disagreements(defaults, table)


@pytest.mark.parametrize("name", sorted(MATCHERS))
def test_default_matchers_are_the_official_ones(name: str) -> None:
    build, table = MATCHERS[name]
    matcher = build()
    assert not disagreements({k: getattr(matcher, k) for k in table}, table)
