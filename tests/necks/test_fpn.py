"""A vision_tx backbone plugs into torchvision's detectors through the FPN neck."""

from __future__ import annotations

import torch
from torchvision.models.detection import FasterRCNN
from torchvision.ops import MultiScaleRoIAlign

from vision_tx.backbones import build_backbone
from vision_tx.necks import BackboneWithFPN


def test_fpn_levels_follow_the_backbone() -> None:
    neck = BackboneWithFPN(build_backbone("swin_t"), out_channels=64)
    feats = neck(torch.randn(1, 3, 96, 128))
    assert list(feats) == ["res2", "res3", "res4", "res5", "pool"]
    assert [f.shape[-2:] for f in feats.values()] == [(24, 32), (12, 16), (6, 8), (3, 4), (2, 2)]
    assert all(f.shape[1] == 64 for f in feats.values())


def test_torchvision_faster_rcnn_trains_one_step_on_swin_t() -> None:
    roi_pool = MultiScaleRoIAlign(["res2", "res3", "res4", "res5"], output_size=7, sampling_ratio=2)
    model = FasterRCNN(
        BackboneWithFPN(build_backbone("swin_t")), num_classes=3, min_size=224, max_size=320, box_roi_pool=roi_pool
    )
    model.train()
    images = [torch.rand(3, 200, 260), torch.rand(3, 240, 220)]
    targets = [
        {"boxes": torch.tensor([[10.0, 20.0, 120.0, 150.0]]), "labels": torch.tensor([1])},
        {
            "boxes": torch.tensor([[30.0, 30.0, 90.0, 200.0], [100.0, 50.0, 200.0, 120.0]]),
            "labels": torch.tensor([2, 1]),
        },
    ]
    losses = model(images, targets)
    total = sum(losses.values())
    assert torch.isfinite(total)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    total.backward()
    optimizer.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
