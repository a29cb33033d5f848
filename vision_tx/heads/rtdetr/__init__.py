"""RT-DETR's head (Zhao et al., DETRs Beat YOLOs on Real-time Object Detection, 2024): the efficient hybrid
encoder and the varifocal set loss. Its decoder, query selection and denoising are DINO's
(:mod:`vision_tx.heads.dino`)."""

from vision_tx.heads.rtdetr.aifi import AIFI, AIFILayer, sincos_position_embedding
from vision_tx.heads.rtdetr.conv import ConvNorm, CSPRepLayer, RepVGGBlock
from vision_tx.heads.rtdetr.criterion import RTDETRCriterion, paired_box_iou
from vision_tx.heads.rtdetr.hybrid_encoder import HybridEncoder

__all__ = [
    "AIFI",
    "AIFILayer",
    "CSPRepLayer",
    "ConvNorm",
    "HybridEncoder",
    "RTDETRCriterion",
    "RepVGGBlock",
    "paired_box_iou",
    "sincos_position_embedding",
]
