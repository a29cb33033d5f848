"""ResNet-50/101 (He et al., 2016) from torchvision, as a :class:`Backbone` and as a classifier.

The dense form is the DETR backbone: BatchNorm frozen into a fixed affine map
(``torchvision.ops.FrozenBatchNorm2d``) and the stem plus ``layer1`` frozen by default. Weights
come only from a file through ``load_weights``, which reads torchvision's ResNet state dicts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import resnet
from torchvision.ops import FrozenBatchNorm2d

from vision_tx.backbones.base import Backbone
from vision_tx.backbones.registry import register_backbone, register_classifier

_BLOCKS_PER_STAGE = {50: [3, 4, 6, 3], 101: [3, 4, 23, 3]}
VARIANTS: dict[str, dict] = {f"resnet{depth}": dict(depth=depth) for depth in _BLOCKS_PER_STAGE}
_TORCHVISION_PREFIXES = {"conv1.": "stem.0.", "bn1.": "stem.1.", **{f"layer{i + 1}.": f"stages.{i}." for i in range(4)}}


@register_backbone(VARIANTS)
class ResNet(Backbone):
    """Bottleneck ResNet: ``images [N,3,H,W] -> {"res2": [N,256,H/4,W/4], ..., "res5": [N,2048,H/32,W/32]}``.

    ``stem`` is conv1/bn1/relu/maxpool and ``stages`` are torchvision's ``layer1..4``. With
    ``frozen_bn`` every BatchNorm is a ``FrozenBatchNorm2d`` (statistics and affine fixed, as DETR
    trains with batches of 2-4 images per GPU), which the forward folds into the preceding conv.
    Feature maps are channels-last (NHWC in memory; oneDNN's convolutions need no layout reorders).
    """

    def __init__(
        self,
        depth: int = 50,
        out_indices: Sequence[int] = (0, 1, 2, 3),
        frozen_stages: int = 1,
        frozen_bn: bool = True,
    ) -> None:
        super().__init__()
        if depth not in _BLOCKS_PER_STAGE:
            raise ValueError(f"{__name__}: depth must be one of {sorted(_BLOCKS_PER_STAGE)}, got {depth}")
        net = resnet.ResNet(
            resnet.Bottleneck, _BLOCKS_PER_STAGE[depth], norm_layer=FrozenBatchNorm2d if frozen_bn else None
        )
        self.stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
        self.stages = nn.ModuleList([net.layer1, net.layer2, net.layer3, net.layer4])
        self._init_outputs([256, 512, 1024, 2048], [4, 8, 16, 32], out_indices, frozen_stages)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        conv, norm, _, pool = self.stem
        images = images.contiguous(memory_format=torch.channels_last)
        x = pool(F.relu(_conv_norm(conv, norm, images), inplace=True))
        outputs: dict[str, torch.Tensor] = OrderedDict()
        for index, stage in enumerate(self.stages):
            for block in stage:
                x = _bottleneck(block, x)
            if index in self.out_indices:
                outputs[f"res{index + 2}"] = x
        return outputs

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Renames torchvision's keys (``conv1``, ``bn1``, ``layerN``) to this layout; native keys pass.

        ``num_batches_tracked`` is dropped where BatchNorm is frozen (it has no such buffer).
        """
        expected = self.state_dict()
        converted = {}
        for key, value in state_dict.items():
            for old, new in _TORCHVISION_PREFIXES.items():
                if key.startswith(old):
                    key = new + key[len(old) :]
                    break
            if key.endswith("num_batches_tracked") and key not in expected:
                continue
            converted[key] = value
        return converted


def _conv_norm(conv: nn.Conv2d, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(conv(x))``, with a frozen BatchNorm folded into the conv's weight and bias.

    Folding scales the (small) weight instead of the (large) activation: one pass over the feature
    map instead of three, forward and backward, and the same gradients for ``conv.weight``.
    """
    if not isinstance(norm, FrozenBatchNorm2d):
        return norm(conv(x))
    scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
    shift = norm.bias - norm.running_mean * scale
    weight = (conv.weight * scale[:, None, None, None]).contiguous(memory_format=torch.channels_last)
    return F.conv2d(x, weight, shift, conv.stride, conv.padding, conv.dilation, conv.groups)


def _bottleneck(block: resnet.Bottleneck, x: torch.Tensor) -> torch.Tensor:
    """torchvision's ``Bottleneck.forward`` through :func:`_conv_norm`."""
    shortcut = x if block.downsample is None else _conv_norm(block.downsample[0], block.downsample[1], x)
    out = F.relu(_conv_norm(block.conv1, block.bn1, x), inplace=True)
    out = F.relu(_conv_norm(block.conv2, block.bn2, out), inplace=True)
    return F.relu(_conv_norm(block.conv3, block.bn3, out) + shortcut, inplace=True)


@register_classifier(VARIANTS)
class ResNetClassifier(ResNet):
    """The ImageNet form: ``images [N,3,H,W] -> logits [N,num_classes]`` (global pool + ``fc``), trainable BatchNorm."""

    def __init__(self, depth: int = 50, num_classes: int = 1000) -> None:
        super().__init__(depth, out_indices=(3,), frozen_stages=-1, frozen_bn=False)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(super().forward(images)["res5"].mean((2, 3)))
