"""A trained model rewritten for inference: the same function in fewer operations (what ``vision_tx.export`` exports).

:func:`fuse_for_deployment` folds every inference-time BatchNorm into the convolution next to it and merges
parallel branches that are one linear map at inference, in place, on a model in ``eval()`` mode:

- a ``Conv2d`` followed by a ``BatchNorm2d`` in a plain ``nn.Sequential`` or RT-DETR's conv-BN(-SiLU) block (and its
  encoder's and decoder's input projections): one convolution with a bias (``torch.nn.utils.fusion.fuse_conv_bn_eval``);
  not in other ``nn.Sequential`` subclasses, whose owners may read their parts (UperNet convolves with its blocks'
  weights itself);
- RT-DETR's RepVGG block, ``silu(bn(conv3x3(x)) + bn(conv1x1(x)))``: one 3x3 convolution and the SiLU (Ding et al.,
  RepVGG, 2021: the 1x1 kernel padded to 3x3 and added);
- ConvNeXt in its BatchNorm form: the stem's and every block's norm after the convolution folded into it, the norm
  that enters a max-pool stage folded into the 1x1 convolution after it, and each block's layer scale into its
  MLP's last linear layer; each block, then only a depthwise convolution and an MLP, runs channels-first
  (:class:`ChannelsFirstConvNeXtBlock`: its MLP as 1x1 convolutions), so that in onnxruntime the backbone keeps one
  convolution layout from the stem to its outputs (the block's permutes cancel between blocks);
- multi-scale deformable attention (DINO's, RT-DETR's decoders, DINO's encoder) sampled by one ``grid_sample`` per
  level (:class:`GridSampleDeformableAttention`): in ONNX a ``GridSample`` per level where the training operator's
  row gather-sum (``vision_tx.ops.ms_deform_attn``) is about 80 small operations, twice its time in onnxruntime.

The result computes the model's function up to float rounding (``tests/test_deploy.py``: float64, every BatchNorm
moved from its initialisation); it is for inference only (the folded BatchNorms no longer learn statistics).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from vision_tx.backbones.convnext import ChannelsLastBatchNorm, ConvNeXtBlock, MaxPoolDownsample
from vision_tx.backbones.layers import PatchEmbed
from vision_tx.heads.dino.deformable_attention import MultiScaleDeformableAttention
from vision_tx.heads.rtdetr.conv import ConvNorm, RepVGGBlock
from vision_tx.ops.ms_deform_attn import level_shapes


def fuse_for_deployment(model: nn.Module) -> nn.Module:
    """``model`` (in ``eval()`` mode) with its BatchNorms folded and its RepVGG blocks merged, in place (see the
    module's docstring); returns it. Raises ``ValueError`` on a model in training mode."""
    if model.training:
        raise ValueError(
            f"{__name__}: fuse_for_deployment needs a model in eval() mode (BatchNorm statistics are folded)"
        )
    with torch.no_grad():
        for module in list(model.modules()):
            if isinstance(module, ConvNeXtBlock) and isinstance(module.norm, ChannelsLastBatchNorm):
                module.conv_dw, module.norm = fuse_conv_bn_eval(module.conv_dw, module.norm.bn), nn.Identity()
                if module.gamma is not None:
                    fc2 = module.mlp.fc2
                    fc2.weight = nn.Parameter(fc2.weight * module.gamma[:, None])
                    fc2.bias = nn.Parameter(fc2.bias * module.gamma)
                    module.gamma = None
            elif isinstance(module, PatchEmbed) and isinstance(module.norm, ChannelsLastBatchNorm):
                module.proj, module.norm = fuse_conv_bn_eval(module.proj, module.norm.bn), nn.Identity()
            elif isinstance(module, MaxPoolDownsample) and isinstance(module.norm, ChannelsLastBatchNorm):
                module.conv, module.norm = norm_into_next_conv(module.norm.bn, module.conv), nn.Identity()
            elif type(module) in (nn.Sequential, ConvNorm):  # not subclasses whose owners read their parts (UperNet's)
                fuse_sequential(module)
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, RepVGGBlock):
                    setattr(parent, name, merged_repvgg(child))
                elif type(child) is MultiScaleDeformableAttention:
                    setattr(parent, name, GridSampleDeformableAttention.from_module(child))
                elif isinstance(child, ConvNeXtBlock) and isinstance(child.norm, nn.Identity) and child.gamma is None:
                    setattr(parent, name, ChannelsFirstConvNeXtBlock(child))
    return model


def fuse_sequential(sequence: nn.Sequential) -> None:
    """Every ``Conv2d`` directly followed by a ``BatchNorm2d`` in ``sequence`` becomes the fused convolution, the norm
    an ``nn.Identity`` (the names and positions of the children stay)."""
    names = list(sequence._modules)
    for first, second in zip(names, names[1:]):
        conv, norm = sequence._modules[first], sequence._modules[second]
        if isinstance(conv, nn.Conv2d) and type(norm) is nn.BatchNorm2d and norm.track_running_stats:
            sequence._modules[first], sequence._modules[second] = fuse_conv_bn_eval(conv, norm), nn.Identity()


def norm_into_next_conv(norm: nn.BatchNorm2d, conv: nn.Conv2d) -> nn.Conv2d:
    """The 1x1 convolution ``conv(norm(x))`` of an inference-time ``norm`` (``x * scale + shift`` per input channel)
    as one convolution: ``W' = W * scale`` over the input channels, ``b' = b + W @ shift``."""
    if conv.kernel_size != (1, 1) or conv.groups != 1 or conv.padding != (0, 0):
        raise ValueError(f"{__name__}: a norm folds into a 1x1 convolution without groups or padding, got {conv}")
    scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
    shift = norm.bias - norm.running_mean * scale
    fused = nn.Conv2d(conv.in_channels, conv.out_channels, 1, conv.stride, bias=True).to(conv.weight)
    fused.weight.copy_(conv.weight * scale[None, :, None, None])
    fused.bias.copy_((conv.bias if conv.bias is not None else 0) + conv.weight.flatten(1) @ shift)
    return fused


def merged_repvgg(block: RepVGGBlock) -> nn.Sequential:
    """``block`` as ``nn.Sequential(conv3x3, SiLU)``: each branch's conv-BN fused, the 1x1 kernel padded to 3x3 and
    added to the 3x3 one, the biases summed."""
    (conv3, norm3), (conv1, norm1) = [(branch.conv, branch.norm) for branch in (block.conv1, block.conv2)]
    if isinstance(norm3, nn.BatchNorm2d):
        conv3 = fuse_conv_bn_eval(conv3, norm3)
    if isinstance(norm1, nn.BatchNorm2d):
        conv1 = fuse_conv_bn_eval(conv1, norm1)
    merged = nn.Conv2d(conv3.in_channels, conv3.out_channels, 3, 1, 1, bias=True).to(conv3.weight)
    merged.weight.copy_(conv3.weight + nn.functional.pad(conv1.weight, (1, 1, 1, 1)))
    merged.bias.copy_(conv3.bias + conv1.bias)
    return nn.Sequential(merged, block.act)


def grid_sample_deform_attn(
    value: torch.Tensor,
    spatial_shapes: list[tuple[int, int]],
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> torch.Tensor:
    """:func:`vision_tx.ops.ms_deform_attn` through one bilinear, zero-padded ``grid_sample`` per level (inference only:
    a NaN location is ``grid_sample``'s to read). Same arguments: ``value [B, S, heads, head_dim]`` (the levels'
    tokens, row-major, ``S = sum h*w``), ``spatial_shapes`` (h, w) per level,
    ``sampling_locations [B, Q, heads, L, P, 2]`` (x, y) in [0, 1] and ``attention_weights [B, Q, heads, L, P]``;
    same result, ``[B, Q, heads * head_dim]``."""
    batch, _, heads, head_dim = value.shape
    queries, levels, points = sampling_locations.shape[1], sampling_locations.shape[3], sampling_locations.shape[4]
    shapes = level_shapes(spatial_shapes)
    grids = (2 * sampling_locations - 1).transpose(1, 2).flatten(0, 1)  # [B*heads, Q, L, P, 2]
    sampled = [
        F.grid_sample(
            level.permute(0, 2, 3, 1).reshape(batch * heads, head_dim, height, width),
            grids[:, :, index],
            mode="bilinear",
            padding_mode="zeros",
            align_corners=False,
        )  # [B*heads, head_dim, Q, P]
        for index, (level, (height, width)) in enumerate(zip(value.split([h * w for h, w in shapes], 1), shapes))
    ]
    weights = attention_weights.transpose(1, 2).reshape(batch * heads, 1, queries, levels * points)
    output = (torch.cat(sampled, -1) * weights).sum(-1)  # [B*heads, head_dim, Q]
    return output.view(batch, heads * head_dim, queries).transpose(1, 2)


class GridSampleDeformableAttention(MultiScaleDeformableAttention):
    """:class:`~vision_tx.heads.dino.deformable_attention.MultiScaleDeformableAttention` (same parameters, same
    function) sampling through :func:`grid_sample_deform_attn`, for inference."""

    @classmethod
    def from_module(cls, module: MultiScaleDeformableAttention) -> GridSampleDeformableAttention:
        """A copy of ``module``'s settings and weights."""
        copy = cls(module.value_proj.in_features, module.num_heads, module.num_levels, module.num_points)
        copy.load_state_dict(module.state_dict())
        return copy.to(module.value_proj.weight).train(module.training)

    def forward(
        self,
        query: torch.Tensor,
        reference: torch.Tensor,
        value: torch.Tensor,
        shapes: list[tuple[int, int]],
        padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As the parent's: ``query [B,Q,D]``, ``reference``, ``value [B,S,D]``, ``padding_mask [B,S]`` ->
        ``[B,Q,D]``."""
        value = self.value_proj(value)
        if padding_mask is not None:
            value = value.masked_fill(padding_mask[..., None], 0.0)
        locations, weights = self.sampling(query, reference, shapes)
        return self.output_proj(
            grid_sample_deform_attn(value.unflatten(-1, (self.num_heads, -1)), shapes, locations, weights)
        )


class ChannelsFirstConvNeXtBlock(nn.Module):
    """A ConvNeXt block without norm and layer scale (folded by :func:`fuse_for_deployment`), for inference:
    ``[N,H,W,C] -> [N,H,W,C]`` as the block, computed on the ``[N,C,H,W]`` map: depthwise convolution, its MLP as 1x1
    convolutions (exact GELU between), the residual added. No stochastic depth (eval only)."""

    def __init__(self, block: ConvNeXtBlock) -> None:
        super().__init__()
        fc1, fc2 = block.mlp.fc1, block.mlp.fc2
        if fc1.activation != "gelu":
            raise ValueError(f"{__name__}: a ConvNeXt MLP with GELU is expected, got activation {fc1.activation!r}")
        self.conv_dw = block.conv_dw
        self.fc1, self.fc2 = (nn.Conv2d(fc.in_features, fc.out_features, 1).to(fc.weight) for fc in (fc1, fc2))
        with torch.no_grad():
            for conv, fc in ((self.fc1, fc1), (self.fc2, fc2)):
                conv.weight.copy_(fc.weight[..., None, None])
                conv.bias.copy_(fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 3, 1, 2)
        return (x + self.fc2(F.gelu(self.fc1(self.conv_dw(x))))).permute(0, 2, 3, 1)
