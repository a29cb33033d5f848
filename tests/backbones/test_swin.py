"""Swin against timm and the official layout: logits, key mapping, window resizing, paper tables."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from tests.conftest import require_reference
from tests.parity import perturb_
from vision_tx.backbones import build_backbone, build_classifier, load_weights
from vision_tx.backbones.swin import SwinBlock, SwinTransformer, explicit_attention

timm = require_reference("timm")

TIMM_NAMES = {
    "swin_t": "swin_tiny_patch4_window7_224",
    "swin_s": "swin_small_patch4_window7_224",
    "swin_b": "swin_base_patch4_window7_224",
}


def _timm_and_ours(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    reference = perturb_(timm.create_model(TIMM_NAMES[name], pretrained=False).eval())
    ours = build_classifier(name).eval()
    report = load_weights(ours, reference.state_dict(), strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    return reference, ours


@pytest.mark.parametrize("name", ["swin_t", "swin_s", "swin_b"])
def test_timm_weights_give_timm_logits(name: str) -> None:
    reference, ours = _timm_and_ours(name)
    # > 1 image: inference runs images and windows in chunks; the deeper and wider variants, whose
    # layers swin_t already checks, with one image to keep the suite fast.
    images = torch.randn(3 if name == "swin_t" else 1, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        expected, actual = reference.double()(images), ours.double()(images)
    assert expected.std() > 0.1  # the comparison is not between near-constant outputs
    # float64, so that rounding does not hide a bug: measured agreement ~2e-15.
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)


def _microsoft_layout(timm_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The official repository's keys: patch merging ends stage i (``layers.{i}.downsample``), head ``head``,
    with its persistent ``relative_position_index`` and ``attn_mask`` buffers."""
    state = {}
    for key, value in timm_state.items():
        match = re.match(r"layers\.(\d+)\.downsample\.(.*)", key)
        if match:
            key = f"layers.{int(match.group(1)) - 1}.downsample.{match.group(2)}"
        state[key.replace("head.fc.", "head.")] = value
        if key.endswith("relative_position_bias_table"):
            state[key.replace("bias_table", "index")] = torch.zeros(49, 49, dtype=torch.long)
    for stage, depth in enumerate((2, 2, 6, 2)[:3]):  # the 7x7 last stage has no shift, hence no mask
        for block in range(1, depth, 2):
            state[f"layers.{stage}.blocks.{block}.attn_mask"] = torch.zeros(64 // 4**stage, 49, 49)
    return state


def test_microsoft_checkpoint_gives_timm_logits(tmp_path) -> None:
    reference = perturb_(timm.create_model(TIMM_NAMES["swin_t"], pretrained=False).eval()).double()
    path = tmp_path / "swin_tiny_patch4_window7_224.pth"
    torch.save({"model": _microsoft_layout(reference.state_dict())}, path)
    official = build_classifier("swin_t").eval().double()
    report = load_weights(official, path, strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    images = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(official(images), reference(images), rtol=0, atol=1e-12)


def test_window_7_checkpoint_into_window_12_model() -> None:
    source = build_classifier("swin_t")
    target = build_classifier("swin_t", window_size=12)
    load_weights(target, source.state_dict(), strict=True)
    old = source.stages[2].blocks[1].attn.relative_position_bias_table.detach()
    new = target.stages[2].blocks[1].attn.relative_position_bias_table.detach()
    assert old.shape == (13 * 13, 12) and new.shape == (23 * 23, 12)
    grid = F.interpolate(old.T.reshape(1, 12, 13, 13), size=(23, 23), mode="bicubic", align_corners=False)
    torch.testing.assert_close(new, grid.reshape(12, -1).T)
    assert torch.isfinite(target(torch.randn(1, 3, 96, 96))).all()


# The paper's Table 1: parameters in millions (rounded to whole millions, hence the 0.5M tolerance)
# and GFLOPs (multiply-adds) at the given input size; Swin-L (window 12) is listed at 384x384.
PAPER = {"swin_t": (224, 28, 4.5), "swin_s": (224, 50, 8.7), "swin_b": (224, 88, 15.4), "swin_l": (384, 197, 103.9)}


@pytest.mark.parametrize("name", list(PAPER))
def test_parameters_and_flops_match_the_paper(name: str) -> None:
    size, params, gflops = PAPER[name]
    with torch.device("meta"):
        model = build_classifier(name).eval()
        images = torch.empty(1, 3, size, size)
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - params) <= 0.5
    with FlopCounterMode(display=False) as counter:
        model(images)
    assert abs(counter.get_total_flops() / 2 / 1e9 - gflops) <= 0.05 * gflops


def test_grad_checkpointing_gives_the_same_outputs_and_gradients() -> None:
    config = dict(embed_dim=32, depths=(2, 2, 2), num_heads=(1, 2, 4), window_size=4, drop_path_rate=0.3)
    plain = SwinTransformer(**config, out_indices=(1, 2)).train()
    checkpointed = SwinTransformer(**config, out_indices=(1, 2), grad_checkpointing=True).train()
    checkpointed.load_state_dict(plain.state_dict())
    images = torch.randn(2, 3, 72, 100)
    results = []
    for model in (plain, checkpointed):
        torch.manual_seed(1)  # the same stochastic-depth draws; checkpointing must replay them
        feats = model(images)
        sum((f * torch.linspace(-1, 1, f.shape[1])[:, None, None]).sum() for f in feats.values()).backward()
        results.append((feats, {n: p.grad for n, p in model.named_parameters()}))
    (feats_a, grads_a), (feats_b, grads_b) = results
    for key in feats_a:
        torch.testing.assert_close(feats_b[key], feats_a[key])
    assert grads_a.keys() == grads_b.keys()
    for key in grads_a:
        torch.testing.assert_close(grads_b[key], grads_a[key], rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def swin_t_backbone() -> torch.nn.Module:
    return build_backbone("swin_t").eval()


@pytest.mark.parametrize("size", [(511, 769), (64, 64), (33, 250)])
def test_odd_sizes_give_ceil_divided_maps(swin_t_backbone: torch.nn.Module, size: tuple[int, int]) -> None:
    with torch.no_grad():
        feats = swin_t_backbone(torch.randn(1, 3, *size))
    assert list(feats) == ["res2", "res3", "res4", "res5"]
    for feat, stride in zip(feats.values(), (4, 8, 16, 32)):
        assert feat.shape[-2:] == (math.ceil(size[0] / stride), math.ceil(size[1] / stride))
        assert torch.isfinite(feat).all()


def _block_by_rolling(block: SwinBlock, x: torch.Tensor) -> torch.Tensor:
    """The official detection backbone's steps, one by one: pad, roll, partition, attend, reverse, roll back."""
    _, height, width, channels = x.shape
    m, s = block.window_size, block.shift_size
    shortcut = x
    x = F.pad(block.norm1(x), (0, 0, 0, -width % m, 0, -height % m))
    _, hp, wp, _ = x.shape
    x = torch.roll(x, (-s, -s), (1, 2))
    windows = x.view(1, hp // m, m, wp // m, m, channels).transpose(2, 3).reshape(-1, m * m, channels)
    region = torch.zeros(hp, wp)
    for i, rows in enumerate((slice(0, -m), slice(-m, -s), slice(-s, None))):
        for j, cols in enumerate((slice(0, -m), slice(-m, -s), slice(-s, None))):
            region[rows, cols] = 3 * i + j
    region = region.view(hp // m, m, wp // m, m).transpose(1, 2).reshape(-1, m * m)
    mask = (region[:, :, None] != region[:, None, :]).float() * -100.0
    heads = block.attn.num_heads
    q, k, v = block.attn.qkv(windows).view(-1, m * m, 3, heads, channels // heads).permute(2, 0, 3, 1, 4)
    coords = torch.stack(torch.meshgrid(torch.arange(m), torch.arange(m), indexing="ij")).flatten(1)
    relative = coords[:, :, None] - coords[:, None, :] + m - 1
    bias = block.attn.relative_position_bias_table[relative[0] * (2 * m - 1) + relative[1]].permute(2, 0, 1)
    logits = q @ k.transpose(-1, -2) / math.sqrt(channels // heads) + bias + mask[:, None]
    out = block.attn.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(-1, m * m, channels))
    out = out.view(1, hp // m, wp // m, m, m, channels).transpose(2, 3).reshape(1, hp, wp, channels)
    x = shortcut + torch.roll(out, (s, s), (1, 2))[:, :height, :width]
    return x + block.mlp(block.norm2(x))


def test_shifted_block_on_a_padded_map_matches_the_step_by_step_computation() -> None:
    block = SwinBlock(
        dim=32, num_heads=2, window_size=7, shifted=True, mlp_ratio=4.0, qkv_bias=True, drop_path_rate=0.0
    )
    x = torch.randn(1, 19, 23, 32)
    with torch.no_grad():
        torch.testing.assert_close(block(x), _block_by_rolling(block, x), rtol=1e-5, atol=1e-5)


def test_explicit_attention_equals_the_fused_kernel() -> None:
    """The bf16 CPU path computes what SDPA computes (checked in fp32, where both are exact to rounding)."""
    q, k, v = (torch.randn(6, 3, 49, 32) for _ in range(3))
    bias = torch.randn(6, 3, 49, 49)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(explicit_attention(q, k, v, bias), expected, rtol=1e-5, atol=1e-5)


def test_bf16_autocast_stays_close_to_fp32() -> None:
    torch.manual_seed(0)
    _, ours = _timm_and_ours("swin_t")
    images = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        expected = ours(images)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            actual = ours(images)
    assert actual.dtype == torch.bfloat16
    # Measured 0.46% of the largest logit (perturbed weights); an attention without its 1/sqrt(d) scale is 1.2% off.
    assert (actual.float() - expected).abs().max() < 0.009 * expected.abs().max()
