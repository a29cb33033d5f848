"""Deformable DETR and DINO's head: deformable attention, encoder, refining decoder, denoising queries, set loss."""

from vision_tx.heads.dino.criterion import DINOCriterion
from vision_tx.heads.dino.deformable_attention import MultiScaleDeformableAttention
from vision_tx.heads.dino.denoising import ContrastiveDenoising, DenoisingQueries, denoising_attention_mask
from vision_tx.heads.dino.transformer import (
    DeformableDecoder,
    DeformableDecoderLayer,
    DeformableEncoder,
    DeformableEncoderLayer,
    box_sine_embedding,
    inverse_sigmoid,
)

__all__ = [
    "ContrastiveDenoising",
    "DINOCriterion",
    "DeformableDecoder",
    "DeformableDecoderLayer",
    "DeformableEncoder",
    "DeformableEncoderLayer",
    "DenoisingQueries",
    "MultiScaleDeformableAttention",
    "box_sine_embedding",
    "denoising_attention_mask",
    "inverse_sigmoid",
]
