"""Classifier inference on a GPU: Swin-T, ConvNeXt-T and ViT-B/16 against timm (``swin_tiny_patch4_window7_224``,
``convnext_tiny``, ``vit_base_patch16_224``) with the same weights, batch 64 at 224x224, in fp32 and bf16 autocast,
channels-last memory format, eager and ``torch.compile`` (default mode): images per second. The issue's goal
is Swin-T in bf16 at 4x the Swin paper's 755 images/s (V100) on an H100-class GPU. CUDA only."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from benchmarks.timing import Row, compare

MODELS = (
    ("swin_t", "swin_tiny_patch4_window7_224"),
    ("convnext_tiny", "convnext_tiny"),
    ("vit_base", "vit_base_patch16_224"),
)
BATCH = 64


class Case(NamedTuple):
    """One row: a model, a precision and whether both sides are compiled (both run channels-last)."""

    model: str
    timm_name: str
    dtype: str  # "fp32" or "bf16" (autocast)
    compiled: bool

    @property
    def name(self) -> str:
        compiled = ", compiled" if self.compiled else ""
        return f"{self.model} classifier, batch {BATCH}, 224x224, {self.dtype}, channels-last{compiled}"


def cases(quick: bool) -> list[Case]:
    """Every row ``run`` times. ``quick`` (the one-call GPU run) compiles Swin-T only: each compilation of both
    sides costs about a minute, and twelve would not fit in the run's 8 minutes."""
    return [
        Case(model, timm_name, dtype, compiled)
        for (model, timm_name), dtype, compiled in itertools.product(MODELS, ("fp32", "bf16"), (False, True))
        if not (quick and compiled and model != "swin_t")
    ]


def run(device: str, quick: bool) -> list[Row]:
    if not device.startswith("cuda"):
        print(f"gpu_classifiers: CUDA only (asked for {device}): skipped")
        return []
    import timm

    from vision_tx.backbones import build_classifier, load_weights

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32 on both sides
    images = torch.randn(BATCH, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
    rows = []
    for case in cases(quick):
        reference = (
            timm.create_model(case.timm_name, pretrained=False).eval().to(device, memory_format=torch.channels_last)
        )
        ours = build_classifier(case.model).eval().to(device, memory_format=torch.channels_last)
        load_weights(ours, reference.state_dict(), strict=True)
        ours_call, reference_call = (
            (torch.compile(ours), torch.compile(reference)) if case.compiled else (ours, reference)
        )

        def forward(model: torch.nn.Module, dtype: str = case.dtype) -> None:
            with torch.inference_mode(), torch.autocast("cuda", torch.bfloat16, enabled=dtype == "bf16"):
                model(images)

        rows.append(
            compare(
                case.name,
                lambda: forward(ours_call),
                lambda: forward(reference_call),
                "timm",
                device=device,
                unit_items=BATCH,
                warmup=3 if case.compiled else 2,
                iters=5 if quick else 20,
            )
        )
    return rows
