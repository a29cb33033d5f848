"""Task heads: DETR (``vision_tx.heads.detr``), UperNet and the auxiliary FCN head."""

from vision_tx.heads.fcn import FCNHead
from vision_tx.heads.upernet import UperNetHead

__all__ = ["FCNHead", "UperNetHead"]
