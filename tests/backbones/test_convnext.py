"""ConvNeXt against timm and the official layouts: logits, key mapping, dense form, paper tables."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
import torch.nn.functional as F

from tests.backbones.family_parity import max_difference, params_and_gflops, perturb_, timm_and_ours, within_published
from vision_tx.backbones import build_backbone, build_classifier, load_weights
from vision_tx.backbones.layers import drop_path

# Measured largest difference against timm's logits (of about 2), over two seeds: 0.6-2e-6.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def tiny_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    return timm_and_ours("convnext_tiny", "convnext_tiny")


def test_timm_weights_give_timm_logits(tiny_pair) -> None:
    reference, ours = tiny_pair
    assert max_difference(reference, ours, torch.randn(1, 3, 224, 224)) < TOLERANCE


def _official_layout(timm_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """facebookresearch/ConvNeXt's classification keys: ``downsample_layers.{i}`` (0: the stem), blocks
    ``stages.{i}.{j}`` with ``dwconv``, ``pwconv1``, ``pwconv2``, ``gamma``, then ``norm`` and ``head``."""
    state = {}
    for key, value in timm_state.items():
        key = re.sub(r"^stem\.", "downsample_layers.0.", key)
        key = re.sub(r"^stages\.(\d+)\.downsample\.", r"downsample_layers.\1.", key)
        key = re.sub(r"^stages\.(\d+)\.blocks\.(\d+)\.", r"stages.\1.\2.", key)
        key = key.replace(".conv_dw.", ".dwconv.").replace(".mlp.fc1.", ".pwconv1.").replace(".mlp.fc2.", ".pwconv2.")
        key = key.replace("head.norm.", "norm.").replace("head.fc.", "head.")
        state[key] = value
    return state


def test_official_checkpoint_gives_timm_logits(tiny_pair, tmp_path) -> None:
    reference, _ = tiny_pair
    path = tmp_path / "convnext_tiny_1k_224_ema.pth"
    state = _official_layout(reference.state_dict())
    assert {"downsample_layers.0.0.weight", "stages.2.8.pwconv2.weight", "norm.weight", "head.weight"} <= set(state)
    torch.save({"model": state}, path)
    official = build_classifier("convnext_tiny").eval()
    report = load_weights(official, path, strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    assert max_difference(reference, official, torch.randn(1, 3, 224, 224)) < TOLERANCE


def test_official_segmentation_checkpoint_fills_the_output_norms(tiny_pair) -> None:
    """The official UperNet checkpoints hold ``backbone.`` (classification keys without the final norm and
    head, plus ``norm{i}`` for each output) and ``decode_head.``/``auxiliary_head.`` weights."""
    reference, _ = tiny_pair
    state = {
        f"backbone.{k}": v
        for k, v in _official_layout(reference.state_dict()).items()
        if not k.startswith(("norm.", "head."))
    }
    for i, dim in enumerate((96, 192, 384, 768)):
        state[f"backbone.norm{i}.weight"] = torch.full((dim,), 1.0 + i)
        state[f"backbone.norm{i}.bias"] = torch.zeros(dim)
    state["decode_head.conv_seg.weight"] = torch.zeros(150, 512, 1, 1)
    backbone = build_backbone("convnext_tiny")
    report = load_weights(backbone, state, strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    assert torch.equal(backbone.stages[3].out_norm.weight, torch.full((768,), 4.0))
    torch.testing.assert_close(
        backbone.stages[2].blocks[8].mlp.fc2.weight, reference.stages[2].blocks[8].mlp.fc2.weight
    )


@pytest.mark.parametrize("size", [(512, 683), (64, 64)])
def test_dense_forward_backward_at_strides_4_to_32(size: tuple[int, int]) -> None:
    model = build_backbone("convnext_tiny", depths=(1, 1, 1, 1))  # full widths; one block per stage keeps it cheap
    feats = model(torch.randn(1, 3, *size))
    assert list(feats) == ["res2", "res3", "res4", "res5"] and model.strides == [4, 8, 16, 32]
    for feat, channels, stride in zip(feats.values(), (96, 192, 384, 768), model.strides):
        assert feat.shape == (1, channels, math.ceil(size[0] / stride), math.ceil(size[1] / stride))
    sum(f.mean() for f in feats.values()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_stochastic_depth_and_layer_scale_defaults() -> None:
    model = build_classifier("convnext_tiny")
    blocks = [block for stage in model.stages for block in stage.blocks]
    assert blocks[0].drop_path_rate == 0.0 and blocks[-1].drop_path_rate == pytest.approx(0.1)
    assert torch.all(blocks[5].gamma == 1e-6)
    assert build_classifier("convnext_tiny", layer_scale=None).stages[0].blocks[0].gamma is None


# The ConvNeXt paper's Table 1 (ImageNet-1K, 224x224): parameters in whole millions, GFLOPs (multiply-adds).
PAPER = {
    "convnext_tiny": (29, 4.5),
    "convnext_small": (50, 8.7),
    "convnext_base": (89, 15.4),
    "convnext_large": (198, 34.4),
}


@pytest.mark.parametrize("name", list(PAPER))
def test_parameters_and_flops_match_the_paper(name: str) -> None:
    params, gflops = PAPER[name]
    measured_params, measured_gflops, _ = params_and_gflops(name)
    assert within_published(measured_params, params, 1)
    assert abs(measured_gflops - gflops) <= 0.05 * gflops


def test_training_applies_layer_scale_before_stochastic_depth() -> None:
    block = build_classifier("convnext_tiny", depths=(1, 1, 1, 1), drop_path_rate=0.9).stages[3].blocks[0]
    torch.nn.init.uniform_(block.gamma, 0.5, 1.5)
    x = torch.randn(4, 5, 5, 768)
    with torch.no_grad():
        scaled_branch = block.eval()(x) - x
        torch.manual_seed(3)
        actual = block.train()(x)
        torch.manual_seed(3)
        expected = x + drop_path(scaled_branch, block.drop_path_rate, True)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_dense_outputs_are_timms_stage_outputs_through_the_output_norms(tiny_pair) -> None:
    """The dense form: timm's stage outputs (``forward_intermediates``) of the same weights, each through
    its channel LayerNorm (``norm{i}`` of the official detection/segmentation backbones), moved off 1 and 0."""
    reference, _ = tiny_pair
    backbone = build_backbone("convnext_tiny").eval()
    report = load_weights(backbone, reference.state_dict())
    assert sorted(report.unexpected_keys) == ["head.fc.bias", "head.fc.weight", "head.norm.bias", "head.norm.weight"]
    for stage in backbone.stages:
        perturb_(stage.out_norm, seed=len(stage.blocks))
    images = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        outputs = backbone(images)
        stages = reference.forward_intermediates(images, intermediates_only=True)
    assert len(stages) == 4
    for stage, feature, (name, output) in zip(backbone.stages, stages, outputs.items()):
        norm = stage.out_norm
        expected = F.layer_norm(
            feature.permute(0, 2, 3, 1), norm.normalized_shape, norm.weight, norm.bias, 1e-6
        ).permute(0, 3, 1, 2)
        torch.testing.assert_close(
            output, expected, rtol=0, atol=1e-5, msg=name
        )  # measured 2-4e-6 (outputs of about 5)


def _batch_norm(x: torch.Tensor, norm: torch.nn.Module, training: bool, statistics: dict | None = None) -> torch.Tensor:
    """BatchNorm of ``x [N, C, ...]`` over its channels by ``torch.nn.functional`` (batch statistics when training);
    ``statistics`` (when given and training) receives ``norm -> (mean [C], unbiased variance [C])`` of the batch."""
    if training:
        if statistics is not None:
            values = x.transpose(0, 1).flatten(1)
            statistics[norm] = (values.mean(1), values.var(1, correction=1))
        return F.batch_norm(x, None, None, norm.weight, norm.bias, True, 0.0, norm.eps)
    return F.batch_norm(x, norm.running_mean, norm.running_var, norm.weight, norm.bias, False, 0.0, norm.eps)


def _small_data_stage_maps(
    model: torch.nn.Module, images: torch.Tensor, training: bool, statistics: dict | None = None
) -> list[torch.Tensor]:
    """Each stage's output of the small-data variant written out from its description, NCHW: 4x4 stem
    (image zero-padded to a multiple of 4 at the bottom and right) and BatchNorm; each later stage
    entered by a 2x2 max-pool (odd maps rounded up), BatchNorm and a 1x1 convolution; blocks of 7x7
    depthwise convolution, BatchNorm, ``C -> 4C -> C`` GELU MLP and layer scale (``statistics``: see
    :func:`_batch_norm`)."""
    images = F.pad(images, (0, -images.shape[-1] % 4, 0, -images.shape[-2] % 4))
    x = F.conv2d(images, model.stem.proj.weight, model.stem.proj.bias, stride=4)
    x = _batch_norm(x, model.stem.norm.bn, training, statistics)
    maps = []
    for stage in model.stages:
        if stage.downsample is not None:
            x = F.max_pool2d(x, 2, ceil_mode=True)
            x = F.conv2d(
                _batch_norm(x, stage.downsample.norm.bn, training, statistics),
                stage.downsample.conv.weight,
                stage.downsample.conv.bias,
            )
        for block in stage.blocks:
            y = F.conv2d(x, block.conv_dw.weight, block.conv_dw.bias, padding=3, groups=x.shape[1])
            y = _batch_norm(y, block.norm.bn, training, statistics).permute(0, 2, 3, 1)
            y = F.linear(
                F.gelu(F.linear(y, block.mlp.fc1.weight, block.mlp.fc1.bias)), block.mlp.fc2.weight, block.mlp.fc2.bias
            )
            x = x + (y * block.gamma).permute(0, 3, 1, 2)
        maps.append(x)
    return maps


def _small_data_logits(
    model: torch.nn.Module, images: torch.Tensor, training: bool, statistics: dict | None = None
) -> torch.Tensor:
    """The classifier: the last stage's map, mean pool, BatchNorm, linear."""
    pooled = _batch_norm(
        _small_data_stage_maps(model, images, training, statistics)[-1].mean((2, 3)),
        model.head.norm,
        training,
        statistics,
    )
    return F.linear(pooled, model.head.fc.weight, model.head.fc.bias)


@pytest.mark.parametrize("training", [True, False], ids=["batch statistics", "running statistics"])
def test_small_data_variant_is_its_description(training: bool) -> None:
    """``norm="batchnorm", downsample="maxpool"`` (classification_toy's backbone) against a by-hand forward
    pass, float64, every weight and running statistic moved off its initialisation, odd image sizes."""
    model = build_classifier(
        "convnext_tiny",
        num_classes=5,
        dims=(8, 16, 24, 32),
        depths=(1, 2, 1, 1),
        drop_path_rate=0.0,
        norm="batchnorm",
        downsample="maxpool",
    )
    perturb_(model, seed=4).double().train(training)
    images = torch.randn(3, 3, 45, 38, dtype=torch.float64)
    with torch.no_grad():
        expected = _small_data_logits(model, images, training)
        actual = model(images)
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)


def test_small_data_running_statistics_after_training_steps_are_the_by_hand_update() -> None:
    """Three AdamW steps of the small-data classifier in training mode: every BatchNorm's running mean and
    variance against the update by hand (``(1 - 0.1) * running + 0.1 * batch``, the batch variance unbiased)
    from the batch statistics of the by-hand forward pass at each step's weights; then evaluation reads
    them. Float64, weights and statistics moved off their initialisation, odd image sizes."""
    model = build_classifier(
        "convnext_tiny",
        num_classes=5,
        dims=(8, 16, 24, 32),
        depths=(1, 2, 1, 1),
        drop_path_rate=0.0,
        norm="batchnorm",
        downsample="maxpool",
    )
    perturb_(model, seed=7).double().train()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    running = {norm: (norm.running_mean.clone(), norm.running_var.clone()) for norm in norms}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(8)
    for _ in range(3):
        images = torch.randn(3, 3, 45, 38, generator=generator, dtype=torch.float64)
        statistics: dict = {}
        with torch.no_grad():
            _small_data_logits(model, images, training=True, statistics=statistics)
        assert set(statistics) == set(norms)
        for norm, (mean, variance) in statistics.items():
            running[norm] = (0.9 * running[norm][0] + 0.1 * mean, 0.9 * running[norm][1] + 0.1 * variance)
        optimizer.zero_grad()
        F.cross_entropy(model(images), torch.tensor([0, 3, 4])).backward()
        optimizer.step()
    for norm in norms:
        torch.testing.assert_close(norm.running_mean, running[norm][0], rtol=0, atol=1e-12)
        torch.testing.assert_close(norm.running_var, running[norm][1], rtol=0, atol=1e-12)
        assert norm.num_batches_tracked == 3
    images = torch.randn(2, 3, 45, 38, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(
            model.eval()(images), _small_data_logits(model, images, training=False), rtol=1e-10, atol=1e-10
        )


def test_small_data_dense_outputs_are_its_stage_maps_through_batchnorm() -> None:
    """The dense form (``rtdetr_convnext_toy``'s backbone): stages 1-3, each through its own output
    BatchNorm, against the by-hand stage maps; float64, running statistics, odd image sizes."""
    backbone = build_backbone(
        "convnext_tiny",
        dims=(8, 16, 24, 32),
        depths=(1, 2, 1, 1),
        drop_path_rate=0.0,
        norm="batchnorm",
        downsample="maxpool",
        out_indices=(1, 2, 3),
    )
    perturb_(backbone, seed=6).double().eval()
    images = torch.randn(2, 3, 45, 38, dtype=torch.float64)
    with torch.no_grad():
        outputs = backbone(images)
        maps = _small_data_stage_maps(backbone, images, training=False)
    assert list(outputs) == ["res3", "res4", "res5"]
    for index, name in enumerate(outputs, start=1):
        expected = _batch_norm(maps[index], backbone.stages[index].out_norm.bn, training=False)
        torch.testing.assert_close(outputs[name], expected, rtol=1e-10, atol=1e-10, msg=name)


def test_small_data_variant_survives_sync_batchnorm_conversion() -> None:
    """Lightning's ``sync_batchnorm`` runs ``SyncBatchNorm.convert_sync_batchnorm``: every BatchNorm of the
    small-data variant must become a SyncBatchNorm that still normalises over the channels (outside a
    process group it computes what BatchNorm does, so the outputs must not change)."""
    model = build_classifier(
        "convnext_tiny",
        num_classes=5,
        dims=(8, 16, 24, 32),
        depths=(1, 2, 1, 1),
        drop_path_rate=0.0,
        norm="batchnorm",
        downsample="maxpool",
    )
    perturb_(model, seed=5)
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    synced = [m for m in converted.modules() if isinstance(m, torch.nn.SyncBatchNorm)]
    assert len(synced) == len(norms) == 1 + 3 + 5 + 1  # stem, stage entries, blocks, head
    images = torch.randn(2, 3, 45, 38)
    for training in (True, False):
        model.train(training)
        converted.train(training)
        with torch.no_grad():
            torch.testing.assert_close(converted(images), model(images), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("option", [{"norm": "groupnorm"}, {"downsample": "avgpool"}])
def test_unknown_norm_or_downsample_is_an_error_naming_the_file(option: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"backbones\.convnext: .*" + next(iter(option.values()))):
        build_backbone("convnext_tiny", dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), **option)
