"""Every backbone family compiles to one graph (no graph break), in training and in inference."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.compiling import graph_breaks, summed
from vision_tx.backbones import build_backbone, build_classifier

# Tiny members of each family; inputs of 3x64x64 images give Swin's and NAT's first stage 768 tokens.
FAMILIES: dict[str, Callable[[], nn.Module]] = {
    "swin": lambda: build_backbone(
        "swin_t", embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), window_size=4, drop_path_rate=0.1
    ),
    "nat": lambda: build_backbone(
        "nat_mini", embed_dim=16, depths=(1, 1, 2, 1), num_heads=(1, 2, 2, 4), drop_path_rate=0.1
    ),
    "vit": lambda: build_backbone("vit_tiny", img_size=64, depth=2, drop_path_rate=0.1),
    "deit_distilled": lambda: build_classifier("deit_tiny_distilled", 10, img_size=64, depth=2),
    "convnext": lambda: build_backbone("convnext_tiny", depths=(1, 1, 1, 1), dims=(8, 16, 32, 64), drop_path_rate=0.1),
    "resnet": lambda: build_backbone("resnet50"),
    "mixer": lambda: build_classifier("mixer_s32", 10, img_size=64, depth=2),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_training_forward_and_backward_compile_without_graph_break(family: str) -> None:
    model = FAMILIES[family]().train()
    images = torch.randn(3, 3, 64, 64)
    assert graph_breaks(lambda x: summed(model(x)), images) == []


@pytest.mark.parametrize("family", ["swin", "nat", "vit"])
def test_inference_compiles_without_graph_break(family: str) -> None:
    """The CPU inference fast paths (oneDNN linear layers, residual branches in chunks) give way to
    plain ops while compiling: 3x128x128 images give the first stage more tokens than a chunk."""
    model = FAMILIES[family]().eval()
    with torch.no_grad():
        assert graph_breaks(lambda x: summed(model(x)), torch.randn(3, 3, 128, 128)) == []
