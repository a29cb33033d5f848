"""D-FINE's head (Peng et al., 2024): fine-grained distribution refinement of the box edges, its decoder and
its localisation losses, and its encoder's GELAN fusion. Its query selection and denoising are RT-DETR's."""

from vision_tx.heads.dfine.criterion import DFINECriterion
from vision_tx.heads.dfine.decoder import FDRDecoder, FDRDecoderLayer, PointsPerLevelAttention
from vision_tx.heads.dfine.encoder import GELANBlock, GELANHybridEncoder, SCDown
from vision_tx.heads.dfine.fdr import (
    Gate,
    LocationQuality,
    distances_to_boxes,
    edge_targets,
    integral,
    weighting_function,
)

__all__ = [
    "DFINECriterion",
    "FDRDecoder",
    "FDRDecoderLayer",
    "GELANBlock",
    "GELANHybridEncoder",
    "Gate",
    "LocationQuality",
    "PointsPerLevelAttention",
    "SCDown",
    "distances_to_boxes",
    "edge_targets",
    "integral",
    "weighting_function",
]
