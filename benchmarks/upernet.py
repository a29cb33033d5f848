"""UperNet Swin-T forward at 512x512 (batch 1, eval) against transformers' UperNetForSemanticSegmentation.

Both build Swin-T (embed 96, depths 2-2-6-2, window 7) with random weights, 150 classes, and return
logits at the input size. transformers also runs its auxiliary FCN head at inference; the second
row times it with ``use_auxiliary_head=False`` to compare the same work.
"""

from __future__ import annotations

import torch
from transformers import SwinConfig, UperNetConfig, UperNetForSemanticSegmentation

from benchmarks.timing import Row, compare
from vision_tx.backbones import build_backbone
from vision_tx.models.segmentor import UperNetSegmentor

NUM_CLASSES = 150


def transformers_upernet(aux: bool, device: str, drop_path_rate: float = 0.0) -> UperNetForSemanticSegmentation:
    """transformers' UperNet Swin-T, ``NUM_CLASSES`` classes, with the FCN auxiliary head (loss weight 0.4,
    its default) if ``aux``, in eval mode."""
    swin = SwinConfig(
        embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7, drop_path_rate=drop_path_rate,
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    config = UperNetConfig(backbone_config=swin, num_labels=NUM_CLASSES, use_auxiliary_head=aux)
    return UperNetForSemanticSegmentation(config).to(device).eval()


def run(device: str = "cpu", quick: bool = False) -> list[Row]:
    torch.manual_seed(0)
    ours = UperNetSegmentor(build_backbone("swin_t"), NUM_CLASSES).to(device).eval()
    images = torch.randn(1, 3, 512, 512, device=device)
    iters, warmup = (2, 1) if quick else (3, 2)  # per process
    rows = []
    with torch.inference_mode():
        for aux in (True, False):
            reference = transformers_upernet(aux, device)
            label = "transformers" if aux else "transformers, no aux head"
            rows.append(compare(
                f"upernet swin_t 512x512 b1 eval ({'vs default' if aux else 'vs no aux'})",
                lambda: ours.inference(images),
                lambda: reference(pixel_values=images).logits,
                label, device=device, warmup=warmup, iters=iters,
            ))
            del reference
    return rows
