"""A backbone followed by torchvision's feature pyramid: the ``body + fpn`` torchvision detectors expect."""

from __future__ import annotations

from collections import OrderedDict

from torch import Tensor, nn
from torchvision.ops import FeaturePyramidNetwork
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool


class BackboneWithFPN(nn.Module):
    """``images [N,3,H,W] -> {"res2".."res5", "pool"}`` maps of ``out_channels`` channels each.

    Works as the ``backbone`` argument of torchvision's ``FasterRCNN``/``MaskRCNN``/``RetinaNet``
    (they read ``out_channels``). ``extra_max_pool`` adds the stride-64 ``pool`` level they use.
    """

    def __init__(self, backbone: nn.Module, out_channels: int = 256, extra_max_pool: bool = True) -> None:
        super().__init__()
        self.body = backbone
        self.fpn = FeaturePyramidNetwork(
            list(backbone.out_channels), out_channels, extra_blocks=LastLevelMaxPool() if extra_max_pool else None
        )
        self.out_channels = out_channels

    def forward(self, images: Tensor) -> OrderedDict[str, Tensor]:
        return self.fpn(OrderedDict(self.body(images)))
