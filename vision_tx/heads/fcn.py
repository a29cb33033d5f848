"""FCN head (Long et al., 2015) as UperNet's auxiliary head, and the conv-BN-ReLU block both heads use."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from vision_tx.ops.conv import Conv2d


class ConvBNReLU(nn.Sequential):
    """``conv (no bias) -> BatchNorm -> ReLU`` with "same" padding; submodules ``conv``, ``bn``, ``act``.

    On several GPUs, ``SegmentationModule(sync_batchnorm=True)`` swaps the BatchNorm for ``SyncBatchNorm``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 1) -> None:
        super().__init__(
            OrderedDict(
                conv=nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False),
                bn=nn.BatchNorm2d(out_channels),
                act=nn.ReLU(inplace=True),
            )
        )
        nn.init.kaiming_normal_(self.conv.weight, mode="fan_out", nonlinearity="relu")


def init_classifier(classifier: nn.Conv2d) -> None:
    """mmsegmentation's initialisation of a 1x1 ``classifier``: weights from N(0, 0.01), zero bias."""
    nn.init.normal_(classifier.weight, std=0.01)
    nn.init.zeros_(classifier.bias)


class FCNHead(nn.Module):
    """``num_convs`` 3x3 conv-BN-ReLU, dropout and a 1x1 classifier on one feature map.

    ``[B, in_channels, H, W] -> logits [B, num_classes, H, W]``. The defaults are mmsegmentation's
    UperNet auxiliary head (``FCNHead``, ``num_convs=1``, ``concat_input=False``).
    """

    def __init__(
        self, in_channels: int, num_classes: int, channels: int = 256, num_convs: int = 1, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            *(ConvBNReLU(in_channels if i == 0 else channels, channels, 3) for i in range(num_convs))
        )
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = Conv2d(channels if num_convs else in_channels, num_classes, 1)
        init_classifier(self.classifier)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.convs(features)))
