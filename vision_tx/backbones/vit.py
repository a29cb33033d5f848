"""Vision Transformer (Dosovitskiy et al., 2021, https://arxiv.org/abs/2010.11929) and DeiT (Touvron et
al., 2021, https://arxiv.org/abs/2012.12877): an image as a sequence of ``16 x 16`` patches.

A class token (and, in distilled DeiT, a distillation token) is put before the patch tokens, learned
position embeddings are added, and pre-norm attention/MLP blocks follow. The position embeddings are
learned for one grid (``img_size / patch_size``) and resized bicubically, as timm does, to the grid of
each input, so weights trained at 224 run at any size.

Native layout: ``stem`` (``patch_embed.proj``, ``cls_token``, ``dist_token``, ``pos_embed``), ``blocks``,
``norm``; the classifier adds ``head`` (and ``head_dist``), the dense backbone the ViTDet pyramid levels
``stages.{i}``. timm's and the official DeiT checkpoints differ only in the ``stem.`` prefix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from vision_tx.backbones.base import Backbone, norms_and_biases
from vision_tx.backbones.layers import Mlp, PatchEmbed, add_chunked, drop_path, init_weights
from vision_tx.backbones.pyramid import PYRAMID_STRIDES, PyramidLevel
from vision_tx.backbones.registry import register_backbone, register_classifier
from vision_tx.ops import Linear

# Width, depth and heads of ViT-Ti/S/B/L (DeiT Table 1, ViT Table 1); DeiT's recipe adds stochastic depth 0.1.
_SIZES = {
    "tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
}
VARIANTS: dict[str, dict] = {
    **{f"vit_{size}": dict(config) for size, config in _SIZES.items()},
    **{f"deit_{size}": dict(config, drop_path_rate=0.1) for size, config in _SIZES.items() if size != "large"},
    **{
        f"deit_{size}_distilled": dict(config, drop_path_rate=0.1, distilled=True)
        for size, config in _SIZES.items()
        if size != "large"
    },
}


def resize_pos_embed(
    pos_embed: torch.Tensor, grid: tuple[int, int], new_grid: tuple[int, int], num_prefix_tokens: int
) -> torch.Tensor:
    """``pos_embed [1, P + h*w, C] -> [1, P + h'*w', C]``: the patch part resized bicubically from its ``grid`` (h, w)
    to ``new_grid`` (h', w') (with antialiasing, timm's choice), the ``num_prefix_tokens`` (``P``) prefix tokens'
    embeddings unchanged."""
    if grid == new_grid:
        return pos_embed
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    patches = patches.float().reshape(1, *grid, -1).permute(0, 3, 1, 2)
    patches = F.interpolate(patches, size=new_grid, mode="bicubic", antialias=True, align_corners=False)
    return torch.cat([prefix, patches.permute(0, 2, 3, 1).flatten(1, 2).to(pos_embed.dtype)], dim=1)


class TokenEmbedding(nn.Module):
    """Patches, the class (and distillation) token and position embeddings:
    ``images [N,3,H,W] -> tokens [N, P + h*w, C]`` with ``h, w = ceil(H/p), ceil(W/p)`` and ``P`` prefix tokens."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, img_size: int, distilled: bool) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim, norm_eps=None)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if distilled else None
        self.num_prefix_tokens = 2 if distilled else 1
        self.grid = (img_size // patch_size, img_size // patch_size)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + self.grid[0] * self.grid[1], embed_dim))
        for token in (self.cls_token, self.dist_token, self.pos_embed):
            if token is not None:
                nn.init.trunc_normal_(token, std=0.02)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Returns the tokens and the patch grid ``(h, w)``."""
        patches = self.patch_embed(images)  # [N, h, w, C]
        batch, height, width, channels = patches.shape
        prefix = [self.cls_token] + ([self.dist_token] if self.dist_token is not None else [])
        tokens = torch.cat([t.expand(batch, -1, -1) for t in prefix] + [patches.reshape(batch, -1, channels)], dim=1)
        return tokens + resize_pos_embed(self.pos_embed, self.grid, (height, width), self.num_prefix_tokens), (
            height,
            width,
        )


class Attention(nn.Module):
    """Multi-head self-attention over all tokens: ``[B, T, C] -> [B, T, C]``."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = Linear(dim, dim)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch, tokens, channels = x.shape
        qkv = self.qkv(x).view(batch, tokens, 3, self.num_heads, channels // self.num_heads)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, T, d]

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """``softmax(q k^T / sqrt(d))`` of the input ``x [B, T, C]``: ``[B, heads, T, T]`` (for attention maps)."""
        q, k, _ = self._qkv(x)
        return (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(x)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


class Block(nn.Module):
    """Pre-norm attention and MLP, each a residual branch with stochastic depth: ``[B, T, C] -> [B, T, C]``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, qkv_bias: bool, drop_path_rate: float) -> None:
        super().__init__()
        self.drop_path_rate = drop_path_rate
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = add_chunked(
            x,
            lambda t: drop_path(self.attn(self.norm1(t)), self.drop_path_rate, self.training),
            self.training,
            per_sample=True,
        )
        return add_chunked(
            x, lambda t: drop_path(self.mlp(self.norm2(t)), self.drop_path_rate, self.training), self.training
        )


class ViTEncoder(nn.Module):
    """The part every form shares: ``stem``, ``blocks`` and the final ``norm``.

    ``img_size`` is the size the position embeddings are learned for (other sizes resize them);
    ``distilled`` adds DeiT's distillation token.
    """

    def __init__(
        self,
        embed_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        patch_size: int = 16,
        img_size: int = 224,
        in_chans: int = 3,
        distilled: bool = False,
        drop_path_rate: float = 0.0,
        grad_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"{__name__}: embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim = embed_dim
        self.grad_checkpointing = grad_checkpointing
        self.stem = TokenEmbedding(patch_size, in_chans, embed_dim, img_size, distilled)
        rates = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()
        self.blocks = nn.ModuleList(Block(embed_dim, num_heads, mlp_ratio, qkv_bias, rate) for rate in rates)
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recomputes each block's activations in the backward pass instead of storing them (less memory)."""
        self.grad_checkpointing = enable

    def forward_tokens(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """``images [N,3,H,W]`` -> normalised tokens ``[N, P + h*w, C]`` (prefix tokens first) and the grid
        ``(h, w)``."""
        x, grid = self.stem(images)
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.norm(x), grid

    def no_weight_decay(self) -> set[str]:
        """Norms, biases, the class (and distillation) token and the position embeddings."""
        return norms_and_biases(self) | {f"stem.{name}" for name, _ in self.stem.named_parameters(recurse=False)}

    def convert_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Maps timm's and the official DeiT layout (``patch_embed``, ``cls_token``, ``dist_token`` and
        ``pos_embed`` at the top level) onto ``stem.``; position embeddings of another grid are resized
        to this model's. Native keys pass unchanged."""
        converted: dict[str, torch.Tensor] = {}
        for key, value in state_dict.items():
            if key.startswith(("patch_embed.", "cls_token", "dist_token", "pos_embed")):
                key = "stem." + key
            if key == "stem.pos_embed":
                value = self._fit_pos_embed(value)
            converted[key] = value
        return converted

    def _fit_pos_embed(self, pos_embed: torch.Tensor) -> torch.Tensor:
        expected = self.stem.pos_embed
        prefix = self.stem.num_prefix_tokens
        side = math.isqrt(pos_embed.shape[1] - prefix)
        if pos_embed.shape == expected.shape or pos_embed.ndim != 3 or side * side != pos_embed.shape[1] - prefix:
            return pos_embed  # other mismatches are reported by load_weights
        return resize_pos_embed(pos_embed, (side, side), self.stem.grid, prefix)


@register_classifier(VARIANTS)
class ViTClassifier(ViTEncoder):
    """The ImageNet form: ``images [N,3,H,W] -> logits [N, num_classes]`` from the class token.

    Distilled (DeiT): the distillation token has its own ``head_dist``; in training the forward
    returns both logits ``(class head, distillation head)``, in eval their average.
    """

    def __init__(self, num_classes: int = 1000, **kwargs) -> None:
        super().__init__(**kwargs)
        self.head = Linear(self.embed_dim, num_classes)
        self.head_dist = Linear(self.embed_dim, num_classes) if self.stem.dist_token is not None else None
        self.apply(init_weights)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """Normalised tokens ``[N, P + h*w, C]``: class token, distillation token (if any), patches in row-major
        order."""
        return self.forward_tokens(images)[0]

    def forward(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        tokens = self.forward_features(images)
        logits = self.head(tokens[:, 0])
        if self.head_dist is None:
            return logits
        distilled = self.head_dist(tokens[:, 1])
        return (logits, distilled) if self.training else (logits + distilled) / 2


@register_backbone(VARIANTS)
class ViTBackbone(ViTEncoder, Backbone):
    """Dense-prediction form: ``images [N,3,H,W] -> {"res2": [N,C,H/4,W/4], ..., "res5": [N,C,H/32,W/32]}``
    (``C = pyramid_channels``, sizes rounded up), the ViTDet pyramid on the last block's normalised patch tokens.

    ``frozen_stages = n`` freezes the stem and the first ``n`` blocks (``0``: the stem only).
    """

    def __init__(
        self, pyramid_channels: int = 256, out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        patch_size = self.stem.patch_embed.patch_size
        if patch_size != 16:
            raise ValueError(
                f"{__name__}: the dense form builds strides 4..32 from the stride-16 map, "
                f"so it needs patch_size 16 (got {patch_size}); other patch sizes are classifier-only"
            )
        # Levels that are not returned are placeholders without parameters (DDP rejects unused ones).
        self.stages = nn.ModuleList(
            PyramidLevel(self.embed_dim, stride, pyramid_channels) if index in out_indices else nn.Identity()
            for index, stride in enumerate(PYRAMID_STRIDES)
        )
        self.apply(init_weights)
        self._init_outputs([pyramid_channels] * 4, PYRAMID_STRIDES, out_indices, frozen_stages)

    def freezable_parts(self) -> list[nn.Module]:
        return [self.stem, *self.blocks]

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        tokens, (height, width) = self.forward_tokens(images)
        patches = tokens[:, self.stem.num_prefix_tokens :]
        grid = patches.transpose(1, 2).reshape(patches.shape[0], -1, height, width)
        return {f"res{i + 2}": self.stages[i](grid, tuple(images.shape[-2:])) for i in self.out_indices}
