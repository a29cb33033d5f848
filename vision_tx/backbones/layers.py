"""Building blocks shared by the backbones (Swin, NAT, ConvNeXt, ViT, Mixer).

Swin, NAT and ConvNeXt are a ``stem`` and ``stages`` of pre-norm blocks with MLPs, stochastic depth and the official
truncated-normal initialisation, returning each requested stage through its own ``out_norm``; the
classes here hold that common part and keep the modules' attribute (state-dict key) names.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from vision_tx.backbones.base import Backbone
from vision_tx.ops import Linear


def drop_path(x: torch.Tensor, rate: float, training: bool) -> torch.Tensor:
    """Stochastic depth: zeroes whole samples of a residual branch ``x [B,...]`` with probability ``rate``, rescales the
    rest by ``1 / (1 - rate)``; ``x`` unchanged when not ``training`` -> ``[B,...]``."""
    if rate == 0.0 or not training:
        return x
    keep = 1.0 - rate
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask / keep


def init_weights(module: nn.Module) -> None:
    """The official initialisation of one ``module``: truncated normal linears, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


# Tokens per chunk in add_chunked: a chunk's intermediate activations (the MLP's 2048 x 4C hidden
# floats, 3 MiB at C = 96; one 56x56 image's windows and their q, k, v) stay in cache, and the
# whole map's (38 MiB for Swin-T's first-stage MLP at batch 8) are never allocated: glibc hands
# such blocks back to the system after each forward, so that every call page-faults them in again.
INFERENCE_CHUNK_TOKENS = 2048


def add_chunked(
    x: torch.Tensor, branch: Callable[[torch.Tensor], torch.Tensor], training: bool, per_sample: bool = False
) -> torch.Tensor:
    """``x + branch(x)`` for a residual ``branch`` that maps each token (``per_sample=False``, e.g. norm +
    MLP) or each sample (``per_sample=True``, e.g. attention) on its own; ``x`` is ``[N, ..., C]``.

    In CPU inference outside autocast (no gradient, not ``training``) the sum is computed about
    ``INFERENCE_CHUNK_TOKENS`` tokens (at least one sample) at a time into one output; otherwise in one
    piece, so that per-sample stochastic depth and autograd see the whole batch. (Under CPU bf16
    autocast, chunks measured slower: Swin-T 8x224x224 320 ms against 297 ms in one piece.)
    """
    tokens = x.numel() // max(x.shape[-1], 1)
    if (
        training
        or torch.is_grad_enabled()
        or x.device.type != "cpu"
        or torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
        or tokens <= INFERENCE_CHUNK_TOKENS
        or torch.is_autocast_enabled("cpu")
    ):  # traced: no guard on the batch's size
        return x + branch(x)
    if per_sample:
        pieces, size = x, max(1, INFERENCE_CHUNK_TOKENS * x.shape[0] // tokens)
    else:
        pieces, size = x.reshape(tokens, x.shape[-1]), INFERENCE_CHUNK_TOKENS
    out = torch.empty_like(pieces)
    for chunk, out_chunk in zip(pieces.split(size), out.split(size)):
        torch.add(chunk, branch(chunk), out=out_chunk)
    return out.view(x.shape)


class PatchEmbed(nn.Module):
    """Non-overlapping ``patch x patch`` convolution, then LayerNorm if ``norm_eps`` is given:
    ``[N,3,H,W] -> [N, ceil(H/p), ceil(W/p), C]`` (the image zero-padded at the bottom/right)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, norm_eps: float | None = 1e-5) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps) if norm_eps is not None else nn.Identity()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        height, width = images.shape[-2:]
        images = F.pad(images, (0, -width % self.patch_size, 0, -height % self.patch_size))
        # A channels-last input makes the convolution write [N, H, W, C] directly, with no transposing copy.
        return self.norm(self.proj(images.contiguous(memory_format=torch.channels_last)).permute(0, 2, 3, 1))


class Mlp(nn.Module):
    """``fc1 -> GELU -> fc2``: ``[..., dim] -> [..., dim]`` through ``hidden`` channels (GELU fused into ``fc1``)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = Linear(dim, hidden, activation="gelu")
        self.fc2 = Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))


class Stage(nn.Module):
    """An optional ``downsample`` entering the stage, then ``blocks`` on ``[B, H, W, C]`` maps.

    ``out_norm`` (present on stages whose features are returned) is applied by the backbone to the
    copy it outputs, not to what flows on to the next stage.
    """

    def __init__(self, downsample: nn.Module | None, blocks: Iterable[nn.Module], out_norm: nn.Module | None) -> None:
        super().__init__()
        self.grad_checkpointing = False
        self.downsample = downsample
        self.blocks = nn.ModuleList(blocks)
        self.out_norm = out_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, H, W, C_in] -> [B, H', W', C]`` (``H' = ceil(H/2)`` after downsampling)."""
        if self.downsample is not None:
            x = self.downsample(x)
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x


class StagedBackbone(Backbone):
    """A ``stem`` to ``[N, H, W, C]`` tokens and :class:`Stage` s:
    ``images [N,3,H,W] -> {"res{i+2}": [N,C_i,H_i,W_i]}``."""

    stages: nn.ModuleList

    @staticmethod
    def stages_to_build(
        source: str, depths: Sequence[int], num_heads: Sequence[int], out_indices: Sequence[int]
    ) -> int:
        """Checks that ``depths`` and ``num_heads`` agree; returns how many stages to build: those up to
        the last of ``out_indices`` (later ones would hold parameters without gradients, which DDP rejects)."""
        if len(depths) != len(num_heads):
            raise ValueError(f"{source}: depths {tuple(depths)} and num_heads {tuple(num_heads)} differ in length")
        if out_indices and all(0 <= i < len(depths) for i in out_indices):
            return max(out_indices) + 1
        return len(depths)  # out-of-range indices are reported by _init_outputs

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recomputes each block's activations in the backward pass instead of storing them (less memory)."""
        for stage in self.stages:
            stage.grad_checkpointing = enable

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.stem(images)
        outputs: dict[str, torch.Tensor] = OrderedDict()
        for index, stage in enumerate(self.stages):
            x = stage(x)
            if stage.out_norm is not None:
                outputs[f"res{index + 2}"] = stage.out_norm(x).permute(0, 3, 1, 2).contiguous()
        return outputs


class ClassifierMixin:
    """The ImageNet form of a :class:`StagedBackbone` (listed first among the bases):
    ``images [N,3,H,W] -> logits [N,num_classes]`` (last stage, its norm, average pool, ``head``)."""

    def __init__(self, num_classes: int = 1000, **kwargs) -> None:
        super().__init__(out_indices=(len(kwargs["depths"]) - 1,), **kwargs)
        self.head = nn.Linear(self.out_channels[-1], num_classes)
        init_weights(self.head)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """Normalised last-stage features ``[N, C, H/32, W/32]``."""
        return next(iter(super().forward(images).values()))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(images).mean((2, 3)))
