"""NAT against the paper's tables and the official SHI-Labs checkpoint layouts."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vision_tx.backbones.nat as nat_module
from vision_tx.backbones import build_backbone, build_classifier, load_weights
from vision_tx.backbones.nat import NAT, NATClassifier

# NAT paper, Table 1 / official classification/NAT.md: parameters (M) and FLOPs (G) at 224x224.
PAPER = {"nat_mini": (20, 2.7), "nat_tiny": (28, 4.3), "nat_small": (51, 7.8), "nat_base": (90, 13.7)}

# A small NAT (and DiNAT, with dilations) that runs in milliseconds.
SMALL = dict(embed_dim=16, depths=(2, 1, 2, 1), num_heads=(1, 2, 2, 4), mlp_ratio=2.0, drop_path_rate=0.1, layer_scale=1e-2)
SMALL_DILATED = dict(SMALL, dilations=((1, 4), (2,), (1, 2), (1,)))


@pytest.mark.parametrize("name", list(PAPER))
def test_parameter_count_and_flops_match_the_paper(name: str, monkeypatch) -> None:
    params, gflops = PAPER[name]
    with torch.device("meta"):
        model = build_classifier(name)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(params * 1e6, rel=0.01)

    # FlopCounterMode counts the convolutions and linear layers (2 FLOPs per multiply-add, hence / 2).
    # Neighborhood attention is counted as the official classification/cuda/flops.py counts the NATTEN
    # kernels: heads * head_dim * k^2 per query for QK (plus k^2 bias adds) and as many for AV. na2d is
    # replaced by a stand-in that records that count, since its tiled matmuls do more than k^2 keys.
    attention_macs = []

    def counted_na2d(q, k, v, kernel_size, dilation=1, rpb=None, scale=None):
        batch, height, width, heads, dim = q.shape
        attention_macs.append(batch * height * width * heads * kernel_size**2 * (2 * dim + 1))
        return v

    monkeypatch.setattr(nat_module, "na2d", counted_na2d)
    with FlopCounterMode(display=False) as counter:
        model(torch.empty(1, 3, 224, 224, device="meta"))
    total = counter.get_total_flops() / 2 + sum(attention_macs)
    assert total == pytest.approx(gflops * 1e9, rel=0.05)


def _official_names(depths) -> dict[str, str]:
    """SHI-Labs backbone key names (classification/nat.py, detection/nat.py) -> vision_tx key names."""
    names = {f"patch_embed.{p}": f"stem.{p}" for p in ["proj.0.weight", "proj.0.bias", "proj.1.weight", "proj.1.bias",
                                                        "norm.weight", "norm.bias"]}
    block_params = ["norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.rpb", "attn.proj.weight",
                    "attn.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight",
                    "mlp.fc2.bias", "gamma1", "gamma2"]
    for level, depth in enumerate(depths):
        for block in range(depth):
            for param in block_params:
                names[f"levels.{level}.blocks.{block}.{param}"] = f"stages.{level}.blocks.{block}.{param}"
        if level < len(depths) - 1:  # the official downsampler ends a level; here it starts the next stage
            for param in ["reduction.weight", "norm.weight", "norm.bias"]:
                names[f"levels.{level}.downsample.{param}"] = f"stages.{level + 1}.downsample.{param}"
    return names


def test_official_classification_checkpoint_loads_exactly() -> None:
    source = NATClassifier(num_classes=7, **SMALL).eval()
    native = source.state_dict()
    names = {**_official_names(SMALL["depths"]), "norm.weight": "stages.3.out_norm.weight",
             "norm.bias": "stages.3.out_norm.bias", "head.weight": "head.weight", "head.bias": "head.bias"}
    assert len(names) == len(native)
    target = NATClassifier(num_classes=7, **SMALL).eval()
    report = load_weights(target, {official: native[ours] for official, ours in names.items()}, strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    images = torch.randn(2, 3, 64, 80)
    torch.testing.assert_close(target(images), source(images), rtol=0, atol=0)


def test_official_detection_checkpoint_loads_exactly() -> None:
    source = NAT(**SMALL_DILATED).eval()
    native = source.state_dict()
    names = _official_names(SMALL["depths"])
    for level in range(4):  # detection/nat.py: one LayerNorm per output, norm{i}
        names.update({f"norm{level}.{p}": f"stages.{level}.out_norm.{p}" for p in ["weight", "bias"]})
    assert len(names) == len(native)
    official = {f"backbone.{key}": native[ours] for key, ours in names.items()}
    official["neck.lateral_convs.0.conv.weight"] = torch.zeros(1)  # mmdet's other modules are dropped
    target = NAT(**SMALL_DILATED).eval()
    report = load_weights(target, {"state_dict": official}, strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    images = torch.randn(1, 3, 96, 72)
    for got, want in zip(target(images).values(), source(images).values()):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_bias_of_another_kernel_size_is_resized() -> None:
    model = NAT(**{**SMALL, "kernel_size": 5})
    state = NAT(**SMALL).state_dict()  # kernel 7: [heads, 13, 13] tables
    converted = model.convert_state_dict(state)
    assert converted["stages.0.blocks.0.attn.rpb"].shape == (1, 9, 9)
    load_weights(model, state, strict=True)


@pytest.mark.parametrize("size", [(511, 769), (64, 64), (20, 33)])
def test_dilated_variant_gives_ceil_divided_shapes(size: tuple[int, int]) -> None:
    # Dilation 4 at stride 4 needs 28 positions: 64x64 and 20x33 maps are padded inside the attention.
    model = NAT(**SMALL_DILATED).eval()
    feats = model(torch.randn(1, 3, *size))
    for feat, channels, stride in zip(feats.values(), model.out_channels, model.strides):
        assert feat.shape == (1, channels, math.ceil(size[0] / stride), math.ceil(size[1] / stride))
        assert torch.isfinite(feat).all()


def test_small_maps_are_padded_like_the_official_attention() -> None:
    # Official NAT zero-pads the normed map at the bottom/right to kernel * dilation before qkv.
    attn = nat_module.NeighborhoodAttention(dim=8, num_heads=2, kernel_size=5, dilation=1, qkv_bias=True)
    x = torch.randn(1, 3, 4, 8)
    padded = torch.nn.functional.pad(x, (0, 0, 0, 1, 0, 2))
    q, k, v = attn.qkv(padded).unflatten(-1, (3, 2, 4)).unbind(3)
    expected = attn.proj(nat_module.na2d(q, k, v, 5, rpb=attn.rpb).flatten(3)[:, :3, :4])
    torch.testing.assert_close(attn(x), expected, rtol=0, atol=0)


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    images = torch.randn(1, 3, 64, 64)
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = NAT(**SMALL, grad_checkpointing=checkpointing).eval()
        sum(f.sum() for f in model(images).values()).backward()
        grads.append([p.grad for p in model.parameters()])
    for plain, checkpointed in zip(*grads):
        torch.testing.assert_close(checkpointed, plain)


def test_classifier_features_and_registry() -> None:
    model = build_classifier("nat_mini", num_classes=5).eval()
    images = torch.randn(1, 3, 64, 64)
    features = model.forward_features(images)
    assert features.shape == (1, 512, 2, 2)
    torch.testing.assert_close(model(images), model.head(features.mean((2, 3))))
    with torch.device("meta"):
        dilated = build_backbone("nat_mini", out_indices=(2,), dilations=((1, 8, 1), (1, 4, 1, 4), (1, 2) * 3, (1,) * 5))
    assert dilated.stages[0].blocks[1].attn.dilation == 8 and len(dilated.stages) == 3


def test_bad_configuration_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="nat.py: dilations must list one value per block"):
        NAT(**{**SMALL, "dilations": ((1,), (1,), (1,), (1,))})
    with pytest.raises(ValueError, match="nat.py: kernel_size must be odd"):
        NAT(**{**SMALL, "kernel_size": 6})
