"""MLP-Mixer (Tolstikhin et al., 2021, https://arxiv.org/abs/2105.01601): no attention, no convolution after the stem.

Each block mixes the tokens (one MLP per channel across the patches, hidden ``C/2``) and then the
channels (one MLP per patch, hidden ``4C``), both pre-norm residual branches. The token-mixing MLP's
weights are sized by the number of patches, so a model runs at one input size only and has no
dense-prediction form: ``build_backbone`` refuses it, ``build_classifier`` builds it.

Layout: timm's (``stem.proj``, ``blocks.{i}.norm1/mlp_tokens/norm2/mlp_channels``, ``norm``, ``head``).
"""

from __future__ import annotations

import torch
from torch import nn

from vision_tx.backbones.base import norms_and_biases
from vision_tx.backbones.layers import Mlp, PatchEmbed, drop_path, init_weights
from vision_tx.backbones.registry import register_classifier
from vision_tx.ops import Linear

# Patch size, width and depth of each size (the paper's Table 1); hidden widths are C/2 (tokens) and 4C (channels).
VARIANTS: dict[str, dict] = {
    "mixer_s32": dict(patch_size=32, embed_dim=512, depth=8),
    "mixer_s16": dict(patch_size=16, embed_dim=512, depth=8),
    "mixer_b32": dict(patch_size=32, embed_dim=768, depth=12),
    "mixer_b16": dict(patch_size=16, embed_dim=768, depth=12),
    "mixer_l16": dict(patch_size=16, embed_dim=1024, depth=24),
}


class MixerBlock(nn.Module):
    """Token mixing, then channel mixing: ``[B, T, C] -> [B, T, C]``."""

    def __init__(self, dim: int, num_tokens: int, mlp_ratio: tuple[float, float], drop_path_rate: float) -> None:
        super().__init__()
        self.drop_path_rate = drop_path_rate
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp_tokens = Mlp(num_tokens, int(dim * mlp_ratio[0]))
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp_channels = Mlp(dim, int(dim * mlp_ratio[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.mlp_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        x = x + drop_path(tokens, self.drop_path_rate, self.training)
        return x + drop_path(self.mlp_channels(self.norm2(x)), self.drop_path_rate, self.training)


@register_classifier(VARIANTS)
class MLPMixer(nn.Module):
    """Classifier: ``images [N, 3, img_size, img_size] -> logits [N, num_classes]`` (blocks, norm, mean over patches,
    head)."""

    no_dense_form = (
        "MLP-Mixer's token-mixing MLPs are tied to one input size (one weight per patch position), so it "
        "cannot give multi-scale feature maps at any size for dense prediction"
    )

    def __init__(
        self,
        patch_size: int,
        embed_dim: int,
        depth: int,
        num_classes: int = 1000,
        img_size: int = 224,
        mlp_ratio: tuple[float, float] = (0.5, 4.0),
        in_chans: int = 3,
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"{__name__}: img_size {img_size} is not a multiple of patch_size {patch_size}")
        self.img_size = img_size
        self.stem = PatchEmbed(patch_size, in_chans, embed_dim, norm_eps=None)
        num_tokens = (img_size // patch_size) ** 2
        rates = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()
        self.blocks = nn.Sequential(*(MixerBlock(embed_dim, num_tokens, mlp_ratio, rate) for rate in rates))
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = Linear(embed_dim, num_classes)
        self.apply(init_weights)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """Normalised patch tokens ``[N, T, C]`` (row-major patches)."""
        if tuple(images.shape[-2:]) != (self.img_size, self.img_size):
            raise ValueError(
                f"{__name__}: MLP-Mixer takes {self.img_size}x{self.img_size} images only (its "
                f"token-mixing MLPs are sized by the patch count), got {tuple(images.shape[-2:])}; resize the "
                f"images or build it with img_size={images.shape[-1]}"
            )
        return self.norm(self.blocks(self.stem(images).flatten(1, 2)))

    def no_weight_decay(self) -> set[str]:
        """Names of the parameters the optimiser does not decay (timm's convention): the norms and biases."""
        return norms_and_biases(self)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(images).mean(1))
