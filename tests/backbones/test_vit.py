"""ViT and DeiT against timm: logits, resized position embeddings, the official DeiT layout, dense form, paper
tables."""

from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn.functional as F

from tests.backbones.family_parity import max_difference, params_and_gflops, perturb_, timm_and_ours, within_published
from vision_tx.backbones import build_backbone, build_classifier, load_weights
from vision_tx.backbones.vit import Attention, resize_pos_embed

# Measured largest differences against timm's logits (of about 1-2), over two seeds: vit_small 1-3e-6,
# vit_base 2-3e-6, deit_small_distilled 1-2e-6, vit_small at 384 (resized position embeddings) 1-3e-6.
TOLERANCE = 1e-5


@pytest.mark.parametrize(
    "name, timm_name",
    [
        ("vit_small", "vit_small_patch16_224"),
        ("vit_base", "vit_base_patch16_224"),
        ("deit_small_distilled", "deit_small_distilled_patch16_224"),
    ],
)
def test_timm_weights_give_timm_logits(name: str, timm_name: str) -> None:
    reference, ours = timm_and_ours(name, timm_name)
    assert max_difference(reference, ours, torch.randn(1, 3, 224, 224)) < TOLERANCE


def test_224_weights_at_384_give_timm_dynamic_size_logits() -> None:
    reference, ours = timm_and_ours("vit_small", "vit_small_patch16_224", dynamic_img_size=True)
    assert max_difference(reference, ours, torch.randn(1, 3, 384, 384)) < TOLERANCE


def test_non_square_inputs_give_timm_dynamic_size_logits() -> None:
    """A transposed grid keeps the token count; only a non-square input shows it."""
    reference, ours = timm_and_ours("deit_tiny_distilled", "deit_tiny_distilled_patch16_224", dynamic_img_size=True)
    assert max_difference(reference, ours, torch.randn(1, 3, 160, 320)) < TOLERANCE


def test_224_weights_loaded_into_a_384_model_give_the_same_logits() -> None:
    """A model built for 384 resizes the position embeddings once, at loading, as every forward of a 224 model at 384
    does."""
    reference = perturb_(timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False)).eval()
    ours = build_classifier("deit_tiny_distilled", img_size=384).eval()
    load_weights(ours, reference.state_dict(), strict=True)
    assert ours.stem.pos_embed.shape == (1, 2 + 24 * 24, 192)
    native = build_classifier("deit_tiny_distilled").eval()
    load_weights(native, reference.state_dict(), strict=True)
    images = torch.randn(1, 3, 384, 384)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), native(images), rtol=0, atol=1e-5)


def test_official_deit_checkpoint_gives_timm_logits(tmp_path) -> None:
    """facebookresearch/deit releases ``{"model": state_dict}`` with timm's key names (``head_dist`` for distilled)."""
    reference = perturb_(timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False)).eval()
    path = tmp_path / "deit_tiny_distilled_patch16_224-b40b3cf7.pth"
    torch.save({"model": reference.state_dict(), "epoch": 299}, path)
    ours = build_classifier("deit_tiny_distilled").eval()
    report = load_weights(ours, path, strict=True)
    assert "head_dist.weight" in report.loaded_keys and "stem.dist_token" in report.loaded_keys
    assert max_difference(reference, ours, torch.randn(1, 3, 224, 224)) < TOLERANCE


def test_resize_pos_embed_is_timms_bicubic_resampling() -> None:
    pos_embed = torch.randn(1, 2 + 14 * 14, 8)
    resized = resize_pos_embed(pos_embed, (14, 14), (20, 31), num_prefix_tokens=2)
    expected = timm.layers.resample_abs_pos_embed(pos_embed, [20, 31], [14, 14], num_prefix_tokens=2)
    torch.testing.assert_close(resized, expected, rtol=0, atol=0)


def test_distilled_model_returns_both_heads_in_training_and_their_mean_in_eval() -> None:
    model = build_classifier("deit_tiny_distilled", num_classes=7, depth=1)
    images = torch.randn(2, 3, 32, 48)
    torch.manual_seed(0)
    cls_logits, dist_logits = model.train()(images)
    assert cls_logits.shape == dist_logits.shape == (2, 7)
    assert (cls_logits - dist_logits).abs().max() > 1e-3  # two heads on two tokens
    model.blocks[0].drop_path_rate = 0.0
    with torch.no_grad():
        cls_logits, dist_logits = model.train()(images)
        torch.testing.assert_close(model.eval()(images), (cls_logits + dist_logits) / 2)


def test_attention_weights_are_the_ones_the_forward_uses() -> None:
    attention = perturb_(Attention(dim=24, num_heads=3, qkv_bias=True))
    x = torch.randn(2, 10, 24)
    weights = attention.attention_weights(x)
    assert weights.shape == (2, 3, 10, 10)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 10))
    values = attention.qkv(x)[..., 48:].view(2, 10, 3, 8).transpose(1, 2)
    expected = attention.proj((weights @ values).transpose(1, 2).flatten(2))
    torch.testing.assert_close(attention(x), expected, rtol=1e-5, atol=1e-6)


def test_other_patch_sizes_classify_and_refuse_the_dense_form() -> None:
    model = build_classifier("vit_tiny", patch_size=32, depth=1, num_classes=5).eval()
    assert model.stem.pos_embed.shape == (1, 1 + 7 * 7, 192)
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 5)
    with pytest.raises(ValueError, match="needs patch_size 16"):
        build_backbone("vit_tiny", patch_size=14)


@pytest.mark.parametrize("name", ["deit_small", "vit_base"])
@pytest.mark.parametrize("size", [(512, 683), (64, 64)])
def test_dense_forward_backward_at_strides_4_to_32(name: str, size: tuple[int, int]) -> None:
    # Full width and stem; one block and a narrower pyramid (256 channels by default) keep it cheap.
    model = build_backbone(name, depth=1, pyramid_channels=32)
    feats = model(torch.randn(1, 3, *size))
    assert list(feats) == ["res2", "res3", "res4", "res5"] == model.out_features
    assert model.strides == [4, 8, 16, 32] and model.out_channels == [32] * 4
    for feat, stride in zip(feats.values(), model.strides):
        assert feat.shape == (1, 32, math.ceil(size[0] / stride), math.ceil(size[1] / stride))
    sum((f * torch.linspace(-1, 1, f.shape[-1])).mean() for f in feats.values()).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert grads["stem.pos_embed"].abs().sum() > 0 and grads["blocks.0.attn.qkv.weight"].abs().sum() > 0


def test_dense_form_loads_classifier_weights_and_returns_only_requested_levels() -> None:
    classifier = build_classifier("deit_tiny", depth=2)
    model = build_backbone("deit_tiny", depth=2, out_indices=(1, 3))
    report = load_weights(model, classifier.state_dict())
    assert report.unexpected_keys == ["head.bias", "head.weight"]
    assert all(key.startswith("stages.") for key in report.missing_keys)
    assert not any(key.startswith(("stages.0.", "stages.2.")) for key in model.state_dict())  # no unused levels
    feats = model(torch.randn(1, 3, 96, 80))
    assert [tuple(f.shape[-2:]) for f in feats.values()] == [(12, 10), (3, 3)]


def test_frozen_stages_freeze_the_stem_and_the_first_blocks() -> None:
    model = build_backbone("deit_tiny", depth=4, frozen_stages=2).train()
    frozen = [model.stem, *model.blocks[:2]]
    assert all(not p.requires_grad for m in frozen for p in m.parameters()) and not any(m.training for m in frozen)
    assert all(p.requires_grad for m in [*model.blocks[2:], model.norm, *model.stages] for p in m.parameters())
    with pytest.raises(ValueError, match=r"frozen_stages must be in -1..4"):
        model.freeze_stages(5)


def test_grad_checkpointing_gives_the_same_gradients() -> None:
    plain = build_backbone("deit_tiny", depth=2, out_indices=(2,)).train()
    checkpointed = build_backbone("deit_tiny", depth=2, out_indices=(2,), grad_checkpointing=True).train()
    checkpointed.load_state_dict(plain.state_dict())
    images = torch.randn(2, 3, 48, 64)
    grads = []
    for model in (plain, checkpointed):
        torch.manual_seed(1)
        model(images)["res4"].square().mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], rtol=1e-4, atol=1e-7)


# (params in millions, the precision it is published with, GFLOPs (multiply-adds) at 224 or None):
# ViT-B/16 and DeiT-S as in the DeiT and Swin papers' tables, DeiT-Ti 5.7M / 1.3G (T2T-ViT's table of
# DeiT), ViT-L/16 307M (ViT Table 1) and 61.6G; the distilled models' parameters from DeiT Table 1.
# DeiT-Ti/S/B are ViT-Ti/S/B (the same blocks; DeiT changes the training): both names are checked.
PAPER = {
    "vit_tiny": (5.7, 0.1, 1.3),
    "vit_small": (22, 1, 4.6),
    "vit_base": (86, 1, 17.6),
    "vit_large": (307, 1, 61.6),
    "deit_tiny": (5.7, 0.1, 1.3),
    "deit_small": (22, 1, 4.6),
    "deit_base": (86, 1, 17.6),
    "deit_tiny_distilled": (6, 1, None),
    "deit_small_distilled": (22, 1, None),
    "deit_base_distilled": (87, 1, None),
}


@pytest.mark.parametrize("name", list(PAPER))
def test_parameters_and_flops_match_the_papers(name: str) -> None:
    params, precision, gflops = PAPER[name]
    measured_params, measured_gflops, _ = params_and_gflops(name)
    assert within_published(measured_params, params, precision)
    if gflops is not None:
        assert abs(measured_gflops - gflops) <= 0.05 * gflops


def test_pyramid_is_the_vitdet_simple_feature_pyramid() -> None:
    """The levels, written from the ViTDet paper with functional ops on the stride-16 map of the last
    block's patch tokens: stride 4 = 2x2 deconvolution, channel LayerNorm, GELU, 2x2 deconvolution;
    8 = one deconvolution; 16 = the map; 32 = 2x2 max pooling; each then a 1x1 and a 3x3 convolution
    (no bias), each followed by a channel LayerNorm; cropped to ceil(H / stride). Weights moved off
    their initialisation; an input that is no multiple of 32 makes the crop and the ceil pooling count."""
    model = perturb_(build_backbone("deit_tiny", depth=1, pyramid_channels=16)).eval()
    images = torch.randn(1, 3, 72, 100)
    state = model.state_dict()

    def channel_norm(x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.layer_norm(
            x.permute(0, 2, 3, 1), x.shape[1:2], state[f"{prefix}.weight"], state[f"{prefix}.bias"], 1e-6
        ).permute(0, 3, 1, 2)

    def deconv(x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.conv_transpose2d(x, state[f"{prefix}.weight"], state[f"{prefix}.bias"], stride=2)

    with torch.no_grad():
        tokens, (height, width) = model.forward_tokens(images)
        grid = tokens[:, 1:].transpose(1, 2).reshape(1, -1, height, width)
        resampled = [
            deconv(
                F.gelu(channel_norm(deconv(grid, "stages.0.resample.0"), "stages.0.resample.1")), "stages.0.resample.3"
            ),
            deconv(grid, "stages.1.resample.0"),
            grid,
            F.max_pool2d(grid, 2, ceil_mode=True),
        ]
        outputs = model(images)
    for level, (x, stride) in enumerate(zip(resampled, (4, 8, 16, 32))):
        prefix = f"stages.{level}.project"
        x = x[..., : math.ceil(72 / stride), : math.ceil(100 / stride)]
        x = channel_norm(F.conv2d(x, state[f"{prefix}.0.weight"]), f"{prefix}.1")
        x = channel_norm(F.conv2d(x, state[f"{prefix}.2.weight"], padding=1), f"{prefix}.3")
        # Measured: equal (the same operations); a small allowance for other kernels.
        torch.testing.assert_close(outputs[f"res{level + 2}"], x, rtol=0, atol=1e-6, msg=f"stride {stride}")
