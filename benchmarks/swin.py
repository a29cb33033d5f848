"""Swin-T classifier forward: vision_tx against timm ``swin_tiny_patch4_window7_224`` with the same weights."""

from __future__ import annotations

import contextlib

import timm
import torch

from benchmarks.timing import Row, compare
from vision_tx.backbones import build_classifier, load_weights


def run(device: str, quick: bool) -> list[Row]:
    reference = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval().to(device)
    ours = build_classifier("swin_t").eval().to(device)
    load_weights(ours, reference.state_dict(), strict=True)
    batch = 8
    images = torch.randn(batch, 3, 224, 224, device=device)
    rows = []
    for precision, autocast in (
        ("fp32", contextlib.nullcontext),
        ("bf16 autocast", lambda: torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)),
    ):

        def forward(model: torch.nn.Module) -> None:
            with torch.inference_mode(), autocast():
                model(images)

        rows.append(
            compare(
                f"swin_t classifier forward, {batch}x224x224, {precision}",
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
