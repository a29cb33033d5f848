"""ViT-B/16 and ConvNeXt-T classifier forward: vision_tx against timm (``vit_base_patch16_224``, ``convnext_tiny``)
with the same weights."""

from __future__ import annotations

import timm
import torch

from benchmarks.timing import Row, compare
from vision_tx.backbones import build_classifier, load_weights

MODELS = (("vit_base", "vit_base_patch16_224"), ("convnext_tiny", "convnext_tiny"))


def run(device: str, quick: bool) -> list[Row]:
    batch = 8
    images = torch.randn(batch, 3, 224, 224, device=device)
    rows = []
    for name, timm_name in MODELS:
        reference = timm.create_model(timm_name, pretrained=False).eval().to(device)
        ours = build_classifier(name).eval().to(device)
        load_weights(ours, reference.state_dict(), strict=True)

        def forward(model: torch.nn.Module) -> None:
            with torch.inference_mode():
                model(images)

        rows.append(
            compare(
                f"{name} classifier forward, {batch}x224x224, fp32",
                lambda: forward(ours),
                lambda: forward(reference),
                "timm",
                device=device,
                unit_items=batch,
                warmup=1 if quick else 2,
                iters=2 if quick else 6,  # per process
            )
        )
    return rows
