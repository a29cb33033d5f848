"""fuse_for_deployment (vision_tx/deploy.py): the fused model computes the eager model's function.

Float64, every parameter and BatchNorm statistic moved from its initialisation (tests/parity.py), so that a fold
that drops a term (a bias, a shift, the 1x1 branch, the layer scale) shows far above float rounding."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.test_export import CASES, build_task
from vision_tx.backbones.convnext import ConvNeXtBlock
from vision_tx.deploy import (
    GridSampleDeformableAttention,
    fuse_for_deployment,
    grid_sample_deform_attn,
    norm_into_next_conv,
)
from vision_tx.export import deployable
from vision_tx.heads.rtdetr.conv import RepVGGBlock
from vision_tx.ops import ms_deform_attn

TOLERANCE = 1e-10  # float64; measured differences are ~1e-14


def counts(model: nn.Module) -> dict[str, int]:
    """How many BatchNorms, convolutions, RepVGG blocks, GridSample attentions and ConvNeXt blocks ``model`` runs."""
    modules = list(model.modules())
    return {
        "batchnorm": sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in modules),
        "conv": sum(isinstance(m, nn.Conv2d) for m in modules),
        "repvgg": sum(isinstance(m, RepVGGBlock) for m in modules),
        "grid_sample_attention": sum(isinstance(m, GridSampleDeformableAttention) for m in modules),
        "convnext_blocks": sum(isinstance(m, ConvNeXtBlock) for m in modules),
    }


def test_the_main_job_fused_gives_the_eager_outputs() -> None:
    """RT-DETR over the BatchNorm ConvNeXt (rtdetr_convnext_toy): every BatchNorm folded, each RepVGG block one 3x3
    convolution, the same logits and boxes on two images of different content."""
    module = build_task("rtdetr_convnext_toy", class_scale=1.0).double()
    network = module.model
    fused = fuse_for_deployment(copy.deepcopy(network))
    before, after = counts(network), counts(fused)
    assert (
        before["batchnorm"] > 30
        and before["repvgg"] == 12
        and before["grid_sample_attention"] == 0
        and before["convnext_blocks"] == 5
    )
    # ConvNeXt's stage outputs keep their BatchNorm (out_norm): nothing before them to fold into. Each ConvNeXt block's
    # MLP becomes two 1x1 convolutions.
    assert after == {
        "batchnorm": 3,
        "conv": before["conv"] - before["repvgg"] + 2 * 5,
        "repvgg": 0,
        "grid_sample_attention": 3,
        "convnext_blocks": 0,
    }
    images = torch.rand(2, 3, 96, 128, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        expected, got = network(images), fused(images)
    for key in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=TOLERANCE, msg=lambda m: f"{key}: {m}")


# Other families: ConvNeXt's classifier (a layer scale per block), UperNet (whose conv-BN-ReLU blocks it convolves with
# itself: left unfused), DINO (deformable attention in its encoder too, around points), D-FINE (its own encoder blocks).
OTHERS = ["classification_toy", "upernet_deit_s_ade20k", "dino_swin_toy", "dfine_convnext_toy"]


@pytest.mark.parametrize("config", OTHERS)
def test_other_models_fused_give_the_eager_outputs(config: str) -> None:
    """Each model's deployable form (network and post-processing) fused against unfused, float64: every output equal
    to ``TOLERANCE`` (detections in the same order: no near-ties at float64 rounding)."""
    init_args, size, _ = CASES[config]
    model = deployable(build_task(config, **{"class_scale": 1.0, **init_args}), config).double()
    fused = fuse_for_deployment(copy.deepcopy(model))
    images = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        for name, got, expected in zip(model.output_names, fused(images), model(images)):
            torch.testing.assert_close(got, expected, rtol=0, atol=TOLERANCE, msg=lambda m: f"{config} {name}: {m}")


def test_fusing_refuses_a_model_in_training_mode() -> None:
    with pytest.raises(ValueError, match="eval"):
        fuse_for_deployment(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))


def test_a_norm_folds_only_into_a_plain_1x1_convolution() -> None:
    with pytest.raises(ValueError, match="1x1"):
        norm_into_next_conv(nn.BatchNorm2d(4).eval(), nn.Conv2d(4, 4, 3, padding=1))


@pytest.mark.parametrize("shapes", [[(12, 16), (6, 8), (3, 4)], [(9, 7), (5, 4)]])
def test_grid_sample_deformable_attention_is_the_operator(shapes: list[tuple[int, int]]) -> None:
    """Sampling points inside, on the border and outside every level (as tests/ops/test_ms_deform_attn.py), batch 2."""
    generator = torch.Generator().manual_seed(len(shapes))
    heads, head_dim, points, queries, tokens = 2, 8, 3, 5, sum(h * w for h, w in shapes)
    value = torch.randn(2, tokens, heads, head_dim, generator=generator, dtype=torch.float64)
    locations = (
        torch.rand(2, queries, heads, len(shapes), points, 2, generator=generator, dtype=torch.float64) * 1.4 - 0.2
    )
    weights = torch.rand(2, queries, heads, len(shapes), points, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(
        grid_sample_deform_attn(value, shapes, locations, weights),
        ms_deform_attn(value, shapes, locations, weights),
        rtol=0,
        atol=TOLERANCE,
    )
