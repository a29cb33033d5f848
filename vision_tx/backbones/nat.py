"""Neighborhood Attention Transformer (Hassani et al., 2022, https://arxiv.org/abs/2204.07143).

Every block attends, per token, to the ``k x k`` tokens around it (:func:`vision_tx.ops.na2d`, with a
learned relative position bias of ``(2k-1)^2`` entries per head); with per-block dilations this is
DiNAT (Hassani & Shi, 2022). The image enters through two overlapping 3x3 stride-2 convolutions
and levels are joined by a 3x3 stride-2 convolution that doubles the channels.

Native layout: ``stem`` (the tokenizer), ``stages.{i}`` with the downsampler that *enters* stage
``i`` (``stages.{i}.downsample``, ``i > 0``), its ``blocks`` and its output norm
(``stages.{i}.out_norm``); the classifier adds ``head``. :meth:`NAT.convert_state_dict` maps the
official SHI-Labs classification and detection/segmentation layouts onto it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import stochastic_depth

from vision_tx.backbones.base import norms_and_biases
from vision_tx.backbones.layers import ClassifierMixin, Mlp, Stage, StagedBackbone, add_chunked, init_weights
from vision_tx.backbones.registry import register_backbone, register_classifier
from vision_tx.ops import Linear, na2d

# Architecture of each size and the stochastic depth of its ImageNet recipe, from the official
# SHI-Labs classification/nat.py (the paper's Table 1).
VARIANTS: dict[str, dict] = {
    "nat_mini": dict(embed_dim=64, depths=(3, 4, 6, 5), num_heads=(2, 4, 8, 16), mlp_ratio=3.0, drop_path_rate=0.2),
    "nat_tiny": dict(embed_dim=64, depths=(3, 4, 18, 5), num_heads=(2, 4, 8, 16), mlp_ratio=3.0, drop_path_rate=0.2),
    "nat_small": dict(
        embed_dim=96,
        depths=(3, 4, 18, 5),
        num_heads=(3, 6, 12, 24),
        mlp_ratio=2.0,
        drop_path_rate=0.3,
        layer_scale=1e-5,
    ),
    "nat_base": dict(
        embed_dim=128,
        depths=(3, 4, 18, 5),
        num_heads=(4, 8, 16, 32),
        mlp_ratio=2.0,
        drop_path_rate=0.5,
        layer_scale=1e-5,
    ),
}


class ConvTokenizer(nn.Module):
    """Two 3x3 stride-2 convolutions (no activation between them) and a LayerNorm: ``[N,3,H,W] -> [N,H/4,W/4,C]``."""

    def __init__(self, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(
            nn.Conv2d(in_chans, embed_dim // 2, kernel_size=3, stride=2, padding=1),
            nn.Conv2d(embed_dim // 2, embed_dim, kernel_size=3, stride=2, padding=1),
        )
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(images).permute(0, 2, 3, 1))


class ConvDownsampler(nn.Module):
    """3x3 stride-2 convolution to twice the channels, then LayerNorm: ``[N,H,W,C] -> [N,ceil(H/2),ceil(W/2),2C]``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.reduction = nn.Conv2d(dim, 2 * dim, kernel_size=3, stride=2, padding=1, bias=False)
        self.norm = nn.LayerNorm(2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.reduction(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))


class NeighborhoodAttention(nn.Module):
    """Multi-head neighborhood attention with relative position bias on ``[N, H, W, C]`` maps.

    A map smaller than ``kernel_size * dilation`` along an axis is zero-padded at the bottom/right to
    that size before the ``qkv`` projection and cropped after the attention, as the official code does.
    """

    def __init__(self, dim: int, num_heads: int, kernel_size: int, dilation: int, qkv_bias: bool) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"{__name__}: dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.qkv = Linear(dim, 3 * dim, bias=qkv_bias)
        self.rpb = nn.Parameter(torch.zeros(num_heads, 2 * kernel_size - 1, 2 * kernel_size - 1))
        self.proj = Linear(dim, dim)
        nn.init.trunc_normal_(self.rpb, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, height, width, channels = x.shape
        window = self.kernel_size * self.dilation
        if height < window or width < window:
            x = F.pad(x, (0, 0, 0, max(window - width, 0), 0, max(window - height, 0)))
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, -1)).unbind(3)
        x = na2d(q, k, v, self.kernel_size, self.dilation, rpb=self.rpb).flatten(3)
        return self.proj(x[:, :height, :width])


class NATBlock(nn.Module):
    """Pre-norm neighborhood attention and MLP, each a residual branch with optional layer scale and stochastic
    depth."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        kernel_size: int,
        dilation: int,
        mlp_ratio: float,
        qkv_bias: bool,
        drop_path_rate: float,
        layer_scale: float | None,
    ) -> None:
        super().__init__()
        self.drop_path_rate = drop_path_rate
        self.norm1 = nn.LayerNorm(dim)
        self.attn = NeighborhoodAttention(dim, num_heads, kernel_size, dilation, qkv_bias)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        if layer_scale is None:
            self.gamma1 = self.gamma2 = None
        else:
            self.gamma1 = nn.Parameter(torch.full((dim,), layer_scale))
            self.gamma2 = nn.Parameter(torch.full((dim,), layer_scale))

    def _residual(self, branch: torch.Tensor, gamma: torch.Tensor | None) -> torch.Tensor:
        if gamma is not None:
            branch = gamma * branch
        return stochastic_depth(branch, self.drop_path_rate, "row", self.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, H, W, C] -> [N, H, W, C]``."""
        x = add_chunked(
            x, lambda t: self._residual(self.attn(self.norm1(t)), self.gamma1), self.training, per_sample=True
        )
        return add_chunked(x, lambda t: self._residual(self.mlp(self.norm2(t)), self.gamma2), self.training)


class NATStage(Stage):
    """Downsampler (all but the first stage), then ``depth`` blocks; ``out_norm`` only on returned stages."""

    def __init__(
        self,
        in_dim: int,
        dim: int,
        depth: int,
        num_heads: int,
        kernel_size: int,
        dilations: Sequence[int],
        mlp_ratio: float,
        qkv_bias: bool,
        drop_path_rates: Sequence[float],
        layer_scale: float | None,
        downsample: bool,
        output: bool,
    ) -> None:
        super().__init__(
            ConvDownsampler(in_dim) if downsample else None,
            [
                NATBlock(
                    dim, num_heads, kernel_size, dilations[j], mlp_ratio, qkv_bias, drop_path_rates[j], layer_scale
                )
                for j in range(depth)
            ],
            nn.LayerNorm(dim) if output else None,
        )


@register_backbone(VARIANTS)
class NAT(StagedBackbone):
    """NAT dense-prediction backbone: ``images [N,3,H,W] -> {"res2": [N,C,H/4,W/4], ..., "res5": [N,8C,H/32,W/32]}``.

    Any input size works (strides are ``ceil`` divisions; maps smaller than the neighborhood are
    padded inside the attention). ``dilations[i][j]`` is the dilation of block ``j`` of stage ``i``
    (DiNAT); ``None`` means 1 everywhere. Only stages up to the last of ``out_indices`` are built;
    each returned stage has its own LayerNorm.
    """

    def __init__(
        self,
        embed_dim: int,
        depths: Sequence[int],
        num_heads: Sequence[int],
        mlp_ratio: float,
        drop_path_rate: float,
        kernel_size: int = 7,
        dilations: Sequence[Sequence[int]] | None = None,
        layer_scale: float | None = None,
        qkv_bias: bool = True,
        in_chans: int = 3,
        out_indices: Sequence[int] = (0, 1, 2, 3),
        frozen_stages: int = -1,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"{__name__}: kernel_size must be odd and positive, got {kernel_size}")
        dilations = [[1] * depth for depth in depths] if dilations is None else [list(d) for d in dilations]
        if [len(d) for d in dilations] != list(depths):
            raise ValueError(f"{__name__}: dilations must list one value per block, {tuple(depths)}, got {dilations}")
        num_built = self.stages_to_build(__name__, depths, num_heads, out_indices)
        self.num_stages = len(depths)
        dims = [embed_dim * 2**i for i in range(self.num_stages)]
        total = sum(depths)
        rates = [drop_path_rate * j / max(total - 1, 1) for j in range(total)]  # linear in depth, as officially
        self.stem = ConvTokenizer(in_chans, embed_dim)
        self.stages = nn.ModuleList(
            NATStage(
                dims[max(i - 1, 0)],
                dims[i],
                depths[i],
                num_heads[i],
                kernel_size,
                dilations[i],
                mlp_ratio,
                qkv_bias,
                rates[sum(depths[:i]) : sum(depths[: i + 1])],
                layer_scale,
                downsample=i > 0,
                output=i in out_indices,
            )
            for i in range(num_built)
        )
        self._init_outputs(dims, [4 * 2**i for i in range(self.num_stages)], out_indices, frozen_stages)
        self.set_grad_checkpointing(grad_checkpointing)
        self.apply(init_weights)

    def no_weight_decay(self) -> set[str]:
        """Norms, biases, layer scales and every block's relative position bias (``rpb``)."""
        tables = {f"{name}.rpb" for name, module in self.named_modules() if isinstance(module, NeighborhoodAttention)}
        return norms_and_biases(self) | tables

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Maps official SHI-Labs NAT state dicts (classification, or mmdet/mmseg with ``backbone.``) onto this model.

        ``patch_embed`` becomes ``stem``; ``levels.{i}.downsample`` ends level ``i`` there and becomes
        ``stages.{i+1}.downsample`` here; ``levels.{i}.blocks`` become ``stages.{i}.blocks``; the
        classifier's final ``norm`` and the detection backbone's per-output ``norm{i}`` become
        ``stages.{i}.out_norm``. Of a detection/segmentation checkpoint only the backbone is kept.
        Bias tables of another kernel size are resized bicubically. Native keys pass unchanged.
        """
        if any(key.startswith("backbone.") for key in state_dict):
            state_dict = {
                key[len("backbone.") :]: value for key, value in state_dict.items() if key.startswith("backbone.")
            }
        expected = self.state_dict()
        converted: dict[str, torch.Tensor] = {}
        for key, value in state_dict.items():
            key = _native_key(key, final_stage=self.num_stages - 1)
            if key.endswith(".attn.rpb") and key in expected:
                value = resize_rpb(value, expected[key].shape)
            converted[key] = value
        return converted


def _native_key(key: str, final_stage: int) -> str:
    key = re.sub(r"^patch_embed\.", "stem.", key)
    key = re.sub(r"^norm\.", f"stages.{final_stage}.out_norm.", key)
    key = re.sub(r"^norm(\d+)\.", r"stages.\1.out_norm.", key)
    match = re.match(r"^levels\.(\d+)\.downsample\.", key)
    if match:
        return f"stages.{int(match.group(1)) + 1}.downsample." + key[match.end() :]
    return re.sub(r"^levels\.", "stages.", key)


def resize_rpb(rpb: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Bicubic resize of a ``rpb [heads, 2k-1, 2k-1]`` bias to ``shape`` (another ``k``); other mismatches pass
    unchanged."""
    if rpb.shape == shape or rpb.ndim != 3 or rpb.shape[0] != shape[0]:
        return rpb
    resized = F.interpolate(rpb.float().unsqueeze(0), size=tuple(shape[1:]), mode="bicubic", align_corners=False)
    return resized.squeeze(0).to(rpb.dtype)


@register_classifier(VARIANTS)
class NATClassifier(ClassifierMixin, NAT):
    """The ImageNet form: ``images [N,3,H,W] -> logits [N,num_classes]`` (last stage, its norm, average pool,
    ``head``)."""
