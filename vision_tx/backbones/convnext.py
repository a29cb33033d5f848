"""ConvNeXt (Liu et al., 2022, https://arxiv.org/abs/2201.03545): a ResNet modernised towards Swin.

Each block is a 7x7 depthwise convolution, a LayerNorm and an inverted-bottleneck MLP (``C -> 4C -> C``,
GELU), scaled per channel by a learned layer scale, as a residual branch with stochastic depth.
A 4x4 stride-4 convolution is the stem, a LayerNorm and a 2x2 stride-2 convolution enter each later stage.

A small-data variant (not the paper's, off by default): ``norm="batchnorm"`` puts BatchNorm where the
paper has LayerNorm, and ``downsample="maxpool"`` enters each later stage through a 2x2 max-pool, the norm
and a 1x1 convolution. Together they let a few hundred images teach shapes from scratch, where the
paper's form only memorises them (figures: docs/LEARNING.md, "classification_toy").

Native layout: ``stem`` (``proj``, ``norm``), ``stages.{i}`` with its ``downsample`` (``norm``, ``conv``),
``blocks`` (timm's names: ``conv_dw``, ``norm``, ``mlp.fc1/fc2``, ``gamma``) and, in the dense form, an
``out_norm`` per returned stage; the classifier pools, then applies ``head.norm`` and ``head.fc``.
:meth:`ConvNeXt.convert_state_dict` maps timm's and the official facebookresearch layouts onto it.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vision_tx.backbones.layers import Mlp, PatchEmbed, Stage, StagedBackbone, drop_path, init_weights
from vision_tx.backbones.registry import register_backbone, register_classifier
from vision_tx.ops.conv import Conv2d

# Widths, depths and the stochastic depth of the ImageNet-1K recipe of each size (the paper's Section 3 and Table 9).
# convnext_toy is the small-data form at a third of Tiny's width (BatchNorm, max-pool downsampling, 1-1-2-1 blocks),
# which learns the toy sets on a CPU in minutes (classification_toy, the main job rtdetr_convnext_toy).
VARIANTS: dict[str, dict] = {
    "convnext_tiny": dict(depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), drop_path_rate=0.1),
    "convnext_small": dict(depths=(3, 3, 27, 3), dims=(96, 192, 384, 768), drop_path_rate=0.4),
    "convnext_base": dict(depths=(3, 3, 27, 3), dims=(128, 256, 512, 1024), drop_path_rate=0.5),
    "convnext_large": dict(depths=(3, 3, 27, 3), dims=(192, 384, 768, 1536), drop_path_rate=0.5),
    "convnext_toy": dict(
        depths=(1, 1, 2, 1), dims=(32, 64, 128, 256), drop_path_rate=0.0, norm="batchnorm", downsample="maxpool"
    ),
}


NORMS = ("layernorm", "batchnorm")
DOWNSAMPLES = ("conv", "maxpool")


class ChannelsLastBatchNorm(nn.Module):
    """BatchNorm over the channels of a ``[N,H,W,C]`` map (the form of the maps between ConvNeXt's layers).

    It holds a plain ``BatchNorm2d`` rather than being one, so that ``SyncBatchNorm.convert_sync_batchnorm``
    (Lightning's ``sync_batchnorm``) swaps the inner norm and keeps the channel permutation around it.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


def channel_norm(norm: str, dim: int) -> nn.Module:
    """The norm over the ``dim`` channels of a ``[N,H,W,C]`` map, by ``norm``: the paper's LayerNorm (``"layernorm"``)
    or BatchNorm."""
    if norm not in NORMS:
        raise ValueError(f"{__name__}: norm must be one of {NORMS}, got {norm!r}")
    return nn.LayerNorm(dim, eps=1e-6) if norm == "layernorm" else ChannelsLastBatchNorm(dim)


class Downsample(nn.Module):
    """Norm, then a 2x2 stride-2 convolution: ``[N,H,W,C] -> [N, ceil(H/2), ceil(W/2), C']`` (odd maps zero-padded)."""

    def __init__(self, in_dim: int, out_dim: int, norm: str = "layernorm") -> None:
        super().__init__()
        self.norm = channel_norm(norm, in_dim)
        self.conv = nn.Conv2d(in_dim, out_dim, kernel_size=2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x).permute(0, 3, 1, 2)
        x = F.pad(x, (0, x.shape[-1] % 2, 0, x.shape[-2] % 2))
        return self.conv(x.contiguous(memory_format=torch.channels_last)).permute(0, 2, 3, 1)


class MaxPoolDownsample(nn.Module):
    """2x2 stride-2 max-pool, norm, 1x1 convolution: ``[N,H,W,C] -> [N, ceil(H/2), ceil(W/2), C']``.

    The small-data variant's entry to a stage: the strongest response of each 2x2 window goes on,
    so a corner or an edge found anywhere in it survives the halving."""

    def __init__(self, in_dim: int, out_dim: int, norm: str = "layernorm") -> None:
        super().__init__()
        self.norm = channel_norm(norm, in_dim)
        self.conv = Conv2d(in_dim, out_dim, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(x.permute(0, 3, 1, 2), kernel_size=2, ceil_mode=True).permute(0, 2, 3, 1)
        return self.conv(self.norm(x).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)).permute(
            0, 2, 3, 1
        )


class ConvNeXtBlock(nn.Module):
    """7x7 depthwise convolution, norm, ``C -> 4C -> C`` MLP, layer scale, stochastic depth:
    ``[N,H,W,C] -> [N,H,W,C]``."""

    def __init__(self, dim: int, layer_scale: float | None, drop_path_rate: float, norm: str = "layernorm") -> None:
        super().__init__()
        self.drop_path_rate = drop_path_rate
        self.conv_dw = Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = channel_norm(norm, dim)
        self.mlp = Mlp(dim, 4 * dim)
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale)) if layer_scale is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x is [N, H, W, C] in memory, so the permuted view is a channels-last map for the convolution.
        branch = self.mlp(self.norm(self.conv_dw(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)))
        if self.gamma is None:
            return x + drop_path(branch, self.drop_path_rate, self.training)
        if not self.training or self.drop_path_rate == 0.0:
            return torch.addcmul(x, branch, self.gamma)  # scale and add in one pass over the map
        return x + drop_path(branch * self.gamma, self.drop_path_rate, self.training)


def _init_convnext(module: nn.Module) -> None:
    """The official initialisation: truncated normal (std 0.02) convolutions and linears, zero biases."""
    if isinstance(module, nn.Conv2d):
        nn.init.trunc_normal_(module.weight, std=0.02)
        nn.init.zeros_(module.bias)
    else:
        init_weights(module)


@register_backbone(VARIANTS)
class ConvNeXt(StagedBackbone):
    """ConvNeXt dense-prediction backbone:
    ``images [N,3,H,W] -> {"res2": [N,C,H/4,W/4], ..., "res5": [N,8C,H/32,W/32]}``.

    Any input size works (the image is padded to a multiple of 4, odd maps before each downsampling;
    output sizes are ``ceil`` divisions). Each returned stage has its own LayerNorm (``out_norm``, the
    official detection and segmentation backbones' ``norm{i}``) unless ``output_norm`` is False.
    """

    def __init__(
        self,
        depths: Sequence[int],
        dims: Sequence[int],
        drop_path_rate: float,
        layer_scale: float | None = 1e-6,
        in_chans: int = 3,
        out_indices: Sequence[int] = (0, 1, 2, 3),
        frozen_stages: int = -1,
        grad_checkpointing: bool = False,
        output_norm: bool = True,
        norm: str = "layernorm",
        downsample: str = "conv",
    ) -> None:
        super().__init__()
        if len(depths) != len(dims):
            raise ValueError(f"{__name__}: depths {tuple(depths)} and dims {tuple(dims)} differ in length")
        if downsample not in DOWNSAMPLES:
            raise ValueError(f"{__name__}: downsample must be one of {DOWNSAMPLES}, got {downsample!r}")
        entry = Downsample if downsample == "conv" else MaxPoolDownsample
        self.num_stages = len(depths)
        valid = out_indices and all(0 <= i < self.num_stages for i in out_indices)
        num_built = max(out_indices) + 1 if valid else self.num_stages  # bad indices are reported by _init_outputs
        rates = torch.linspace(0, drop_path_rate, sum(depths), device="cpu").tolist()
        self.stem = PatchEmbed(4, in_chans, dims[0], norm_eps=None)
        self.stem.norm = channel_norm(norm, dims[0])  # PatchEmbed's own norm is a LayerNorm or none
        self.stages = nn.ModuleList(
            Stage(
                entry(dims[i - 1], dims[i], norm) if i > 0 else None,
                [
                    ConvNeXtBlock(dims[i], layer_scale, rate, norm)
                    for rate in rates[sum(depths[:i]) : sum(depths[: i + 1])]
                ],
                channel_norm(norm, dims[i]) if output_norm and i in out_indices else None,
            )
            for i in range(num_built)
        )
        self._init_outputs(dims, [4 * 2**i for i in range(self.num_stages)], out_indices, frozen_stages)
        self.set_grad_checkpointing(grad_checkpointing)
        self.apply(_init_convnext)

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Maps timm's and the official (facebookresearch/ConvNeXt) layouts onto this model's keys.

        timm: ``stem.0/1`` and ``stages.{i}.downsample.0/1`` are numbered where here they are named.
        Official classification: ``downsample_layers.0`` is the stem, ``downsample_layers.{i}`` enter
        stage ``i``, blocks are ``stages.{i}.{j}`` with ``dwconv``, ``pwconv1``, ``pwconv2``, and the
        final ``norm`` and ``head`` become ``head.norm`` and ``head.fc``. Official detection/segmentation
        (``backbone.`` prefix): only the backbone is kept, its ``norm{i}`` become ``stages.{i}.out_norm``.
        Native keys pass unchanged.
        """
        if any(key.startswith("backbone.") for key in state_dict):
            state_dict = {
                key[len("backbone.") :]: value for key, value in state_dict.items() if key.startswith("backbone.")
            }
        return {_native_key(key): value for key, value in state_dict.items()}


_RENAMES = [
    (r"^stem\.0\.", "stem.proj."),
    (r"^stem\.1\.", "stem.norm."),
    (r"^downsample_layers\.0\.0\.", "stem.proj."),
    (r"^downsample_layers\.0\.1\.", "stem.norm."),
    (r"^downsample_layers\.(\d+)\.", r"stages.\1.downsample."),
    (r"^(stages\.\d+\.downsample)\.0\.", r"\1.norm."),
    (r"^(stages\.\d+\.downsample)\.1\.", r"\1.conv."),
    (r"^stages\.(\d+)\.(\d+)\.", r"stages.\1.blocks.\2."),
    (r"\.dwconv\.", ".conv_dw."),
    (r"\.pwconv1\.", ".mlp.fc1."),
    (r"\.pwconv2\.", ".mlp.fc2."),
    (r"^norm\.", "head.norm."),
    (r"^head\.(weight|bias)$", r"head.fc.\1"),
    (r"^norm(\d+)\.", r"stages.\1.out_norm."),
]


def _native_key(key: str) -> str:
    for pattern, replacement in _RENAMES:
        key = re.sub(pattern, replacement, key)
    return key


@register_classifier(VARIANTS)
class ConvNeXtClassifier(ConvNeXt):
    """The ImageNet form: ``images [N,3,H,W] -> logits [N,num_classes]``: last stage, global average pool, ``head``
    (LayerNorm, then the linear classifier)."""

    def __init__(self, num_classes: int = 1000, **kwargs) -> None:
        super().__init__(out_indices=(len(kwargs["depths"]) - 1,), output_norm=False, **kwargs)
        dim = self.out_channels[-1]
        norm = nn.BatchNorm1d(dim) if kwargs.get("norm") == "batchnorm" else nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Sequential(OrderedDict(norm=norm, fc=nn.Linear(dim, num_classes)))
        self.head.apply(init_weights)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """Last-stage features before the head ``[N, C, H/32, W/32]``."""
        x = self.stem(images)
        for stage in self.stages:
            x = stage(x)
        return x.permute(0, 3, 1, 2)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(images).mean((2, 3)))
