"""The contract every backbone keeps: names, output strides at any size, freezing, weight files."""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch.callbacks import BaseFinetuning

from vision_tx.backbones import build_backbone, build_classifier, list_backbones, load_weights, save_weights
from vision_tx.checkpoint import CheckpointError

EXPECTED = {
    "swin_t",
    "swin_s",
    "swin_b",
    "swin_l",
    "nat_mini",
    "nat_tiny",
    "nat_small",
    "nat_base",
    "resnet50",
    "vit_tiny",
    "vit_small",
    "vit_base",
    "vit_large",
    "deit_tiny",
    "deit_small",
    "deit_base",
    "deit_tiny_distilled",
    "deit_small_distilled",
    "deit_base_distilled",
    "convnext_tiny",
    "convnext_small",
    "convnext_base",
    "convnext_large",
    "mixer_s32",
    "mixer_s16",
    "mixer_b32",
    "mixer_b16",
    "mixer_l16",
}
SMALL = ["swin_t", "nat_mini", "resnet50"]


def test_registry_lists_every_variant() -> None:
    assert EXPECTED <= set(list_backbones())


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown backbone 'swin_xl'.*swin_t"):
        build_backbone("swin_xl")


# Each variant narrowed (its depths, heads, windows and kernels kept): the sizes, not the width, are
# what the padding, windowing and striding below depend on; ResNet-50 has no narrower form.
NARROW = {"swin_t": {"embed_dim": 24}, "nat_mini": {"embed_dim": 16}, "resnet50": {}}


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("size", [(800, 1333), (512, 512), (511, 769), (64, 64)])
def test_dense_forward_backward_at_any_size(name: str, size: tuple[int, int]) -> None:
    model = build_backbone(name, **NARROW[name])
    images = torch.randn(1, 3, *size)
    feats = model(images)
    assert list(feats) == ["res2", "res3", "res4", "res5"] == model.out_features
    assert model.strides == [4, 8, 16, 32]
    for feat, channels, stride in zip(feats.values(), model.out_channels, model.strides):
        assert feat.shape == (1, channels, math.ceil(size[0] / stride), math.ceil(size[1] / stride))
    sum(f.float().mean() for f in feats.values()).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", SMALL)
def test_out_indices_select_stages(name: str) -> None:
    full = build_backbone(name)
    model = build_backbone(name, out_indices=(1, 3))
    feats = model(torch.randn(1, 3, 64, 96))
    assert list(feats) == ["res3", "res5"]
    assert model.out_channels == [full.out_channels[1], full.out_channels[3]]
    assert model.strides == [8, 32]


@pytest.mark.parametrize("name", SMALL)
def test_freeze_and_unfreeze_stages(name: str) -> None:
    model = build_backbone(name, frozen_stages=2).train()
    frozen = [model.stem, *model.stages[:2]]
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(not m.training for m in frozen) and model.stages[2].training
    assert all(p.requires_grad for m in model.stages[2:] for p in m.parameters())
    model.freeze_stages(-1)
    assert all(p.requires_grad for p in model.parameters())
    # Lightning's BaseFinetuning freezes and unfreezes stages picked by index.
    BaseFinetuning.freeze(model.stages[:3])
    assert not any(p.requires_grad for p in model.stages[1].parameters())
    BaseFinetuning.make_trainable(model.stages[1])
    assert all(p.requires_grad for p in model.stages[1].parameters())


def test_native_checkpoint_round_trip(tmp_path) -> None:
    source = build_classifier("swin_t", num_classes=10).eval()
    save_weights(source, tmp_path / "swin_t.pth", arch="swin_t")
    target = build_classifier("swin_t", num_classes=10).eval()
    report = load_weights(target, tmp_path / "swin_t.pth", strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    images = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(target(images), source(images), rtol=0, atol=0)


def test_classifier_checkpoint_into_backbone_reports_the_head(tmp_path) -> None:
    save_weights(build_classifier("swin_t", num_classes=10), tmp_path / "cls.pth")
    report = load_weights(build_backbone("swin_t"), tmp_path / "cls.pth")
    assert report.loaded_keys
    assert any("head" in k for k in report.unexpected_keys)
    assert str(tmp_path / "cls.pth") in str(report)


def test_bad_checkpoint_files_are_refused_with_the_file_named(tmp_path) -> None:
    model = build_backbone("swin_t")
    missing = tmp_path / "nope.pth"
    with pytest.raises(CheckpointError, match=rf"{missing}: no such checkpoint file"):
        load_weights(model, missing)

    corrupt = tmp_path / "corrupt.pth"
    corrupt.write_bytes(b"this is not a checkpoint")
    with pytest.raises(CheckpointError, match=rf"{corrupt}: not a readable PyTorch checkpoint"):
        load_weights(model, corrupt)

    good = tmp_path / "good.pth"
    save_weights(model, good)
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"{truncated}: not a readable PyTorch checkpoint"):
        load_weights(model, truncated)

    other = tmp_path / "resnet.pth"
    save_weights(build_backbone("resnet50"), other)
    with pytest.raises(CheckpointError, match=rf"{other}: none of its .* tensors match"):
        load_weights(model, other)

    other_variant = tmp_path / "swin_b.pth"
    save_weights(build_backbone("swin_b"), other_variant)
    with pytest.raises(CheckpointError, match=rf"{other_variant}: shapes differ"):
        load_weights(model, other_variant)


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_untrusted_pickle_is_not_executed(tmp_path, capsys) -> None:
    evil = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.zeros(1)}, "payload": _Payload()}, evil)
    with pytest.raises(CheckpointError, match=rf"{evil}: refused"):
        load_weights(build_backbone("swin_t"), evil)
    assert "this must never run" not in capsys.readouterr().out
