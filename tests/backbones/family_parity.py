"""Helpers of the ViT/DeiT, ConvNeXt and Mixer tests: timm models with every weight moved off its initialisation."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.conftest import require_reference
from tests.parity import perturb_
from vision_tx.backbones import build_classifier, load_weights

timm = require_reference("timm")


def timm_and_ours(name: str, timm_name: str, **timm_kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    """timm's ``timm_name`` with moved weights and our ``name`` classifier loaded (strictly) from its state dict, in
    eval mode."""
    reference = perturb_(timm.create_model(timm_name, pretrained=False, **timm_kwargs)).eval()
    with torch.device("meta"):  # no initialisation: every tensor comes from the state dict (strict)
        ours = build_classifier(name).eval()
    ours.to_empty(device="cpu")
    report = load_weights(ours, reference.state_dict(), strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    return reference, ours


def max_difference(reference: torch.nn.Module, ours: torch.nn.Module, images: torch.Tensor) -> float:
    with torch.no_grad():
        return float((ours(images) - reference(images)).abs().max())


def params_and_gflops(name: str, size: int = 224, **kwargs) -> tuple[float, float, torch.nn.Module]:
    """Parameters (millions) and multiply-add GFLOPs of the ``name`` classifier on one ``size x size`` image, on the
    meta device."""
    with torch.device("meta"):
        model = build_classifier(name, **kwargs).eval()
        images = torch.empty(1, 3, size, size)
    with FlopCounterMode(display=False) as counter:
        model(images)
    return sum(p.numel() for p in model.parameters()) / 1e6, counter.get_total_flops() / 2 / 1e9, model


def within_published(measured: float, published: float, last_digit: float) -> bool:
    """Within 1% of a published figure, or within the rounding of its last digit (``last_digit``: 1 for "22M")."""
    return abs(measured - published) <= max(0.01 * published, last_digit / 2)
