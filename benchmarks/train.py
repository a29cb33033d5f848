"""Training steps (forward, loss, backward, AdamW step), vision_tx against a reference with the same weights.

- Swin-T classifier, batch 8, 224x224, cross-entropy, against timm ``swin_tiny_patch4_window7_224``.
- UperNet Swin-T with the FCN auxiliary head (loss weight 0.4), batch 2, 512x512, 150 classes, against
  transformers' ``UperNetForSemanticSegmentation``; its Swin's separate q/k/v are our ``qkv`` split in three.
- NAT-Tiny classifier, batch 2, 224x224, against the same model with ``na2d`` replaced by dense SDPA
  with the neighbourhood and the relative position bias as an additive mask (natten's CPU path has no backward).
- CPU only: the README's main job, ``rtdetr_convnext_toy`` (its backbone included, 100 queries), batches of 8 at four of
  its training sizes (144x192 to 192x256) in turn, 4 classes, 8 boxes an image: the training step with its linear
  layers' products on oneDNN (:mod:`vision_tx.ops.linear_autograd`) against the same model on torch's own operators
  (MKL's ``sgemm``), which :func:`vision_tx.ops.onednn.set_onednn_training` chooses between (by default
  by the CPU's vendor).

Both sides use stochastic depth 0.2 (the recipes'); dropout and drop-path draw their own random numbers.
"""

from __future__ import annotations

from unittest import mock

import timm
import torch

from benchmarks.na2d import masked_sdpa
from benchmarks.timing import Row, classifier_training_step, compare
from benchmarks.upernet import train_step as upernet_train_step
from vision_tx.backbones import build_backbone, build_classifier, load_weights
from vision_tx.models import RTDETR
from vision_tx.ops.onednn import onednn_training_enabled, set_onednn_training

DROP_PATH = 0.2
TOY_BATCH_SIZES = (
    (144, 192),
    (160, 224),
    (176, 240),
    (192, 256),
)  # (height, width): the recipe's shorter sides 144-192


def _swin(device: str, quick: bool) -> Row:
    torch.manual_seed(0)
    reference = (
        timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, drop_path_rate=DROP_PATH).train().to(device)
    )
    ours = build_classifier("swin_t", drop_path_rate=DROP_PATH).train().to(device)
    load_weights(ours, reference.state_dict(), strict=True)
    images = torch.randn(8, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (8,), device=device)
    ours_opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (ours, reference))
    return compare(
        "swin_t classifier train step, 8x224x224",
        lambda: classifier_training_step(ours, ours_opt, images, labels),
        lambda: classifier_training_step(reference, ref_opt, images, labels),
        "timm",
        device=device,
        unit_items=8,
        warmup=1,
        iters=2 if quick else 4,
    )


def _nat(device: str, quick: bool) -> Row:
    torch.manual_seed(0)
    model = build_classifier("nat_tiny").train().to(device)
    images = torch.randn(2, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (2,), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def reference_step() -> None:
        with mock.patch("vision_tx.backbones.nat.na2d", masked_sdpa):
            classifier_training_step(model, optimizer, images, labels)

    return compare(
        "nat_tiny classifier train step, 2x224x224",
        lambda: classifier_training_step(model, optimizer, images, labels),
        reference_step,
        "masked SDPA",
        device=device,
        unit_items=2,
        warmup=1,
        iters=2 if quick else 4,
    )


def _rtdetr_toy_products(quick: bool) -> Row:
    torch.manual_seed(0)
    model = RTDETR.build(
        build_backbone("convnext_toy", out_indices=(1, 2, 3)),
        4,
        **{**RTDETR.variants["rtdetr_toy"], "num_queries": 100},
    ).train()
    generator = torch.Generator().manual_seed(0)
    batches = []
    for (
        height,
        width,
    ) in TOY_BATCH_SIZES:  # multi-scale training: each timed call a step at each size, as the recipe varies them
        targets = [
            {
                "labels": torch.randint(0, 4, (8,), generator=generator),
                "boxes": torch.cat(
                    [
                        0.2 + 0.6 * torch.rand(8, 2, generator=generator),
                        0.05 + 0.2 * torch.rand(8, 2, generator=generator),
                    ],
                    1,
                ),
            }
            for _ in range(8)
        ]
        batches.append(
            (
                torch.randn(8, 3, height, width, generator=generator),
                torch.zeros(8, height, width, dtype=torch.bool),
                targets,
            )
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    default = onednn_training_enabled()

    def step(on_onednn: bool) -> None:
        set_onednn_training(on_onednn)
        for images, pixel_mask, targets in batches:
            optimizer.zero_grad(set_to_none=True)
            model.loss(model(images, pixel_mask, targets), targets)["loss"].backward()
            optimizer.step()

    try:
        return compare(
            f"rtdetr_convnext_toy train steps b8 at {len(batches)} sizes, products on oneDNN",
            lambda: step(True),
            lambda: step(False),
            "torch's operators",
            unit_items=8 * len(batches),
            warmup=1,
            iters=2 if quick else 5,
        )
    finally:
        set_onednn_training(default)


def run(device: str, quick: bool) -> list[Row]:
    rows = [_swin(device, quick), upernet_train_step(device, quick, DROP_PATH), _nat(device, quick)]
    return rows + ([_rtdetr_toy_products(quick)] if device == "cpu" else [])
