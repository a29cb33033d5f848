"""Training steps (forward, loss, backward, AdamW step), vision_tx against a reference with the same weights.

- Swin-T classifier, batch 8, 224x224, cross-entropy, against timm ``swin_tiny_patch4_window7_224``.
- UperNet Swin-T with the FCN auxiliary head (loss weight 0.4), batch 2, 512x512, 150 classes, against
  transformers' ``UperNetForSemanticSegmentation``; its Swin's separate q/k/v are our ``qkv`` split in three.
- NAT-Tiny classifier, batch 2, 224x224, against the same model with ``na2d`` replaced by dense SDPA
  with the neighbourhood and the relative position bias as an additive mask (natten's CPU path has no backward).

Both sides use stochastic depth 0.2 (the recipes'); dropout and drop-path draw their own random numbers.
"""

from __future__ import annotations

from unittest import mock

import timm
import torch

from benchmarks.na2d import masked_sdpa
from benchmarks.timing import Row, classifier_training_step, compare
from benchmarks.upernet import train_step as upernet_train_step
from vision_tx.backbones import build_classifier, load_weights

DROP_PATH = 0.2


def _swin(device: str, quick: bool) -> Row:
    torch.manual_seed(0)
    reference = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, drop_path_rate=DROP_PATH).train().to(device)
    ours = build_classifier("swin_t", drop_path_rate=DROP_PATH).train().to(device)
    load_weights(ours, reference.state_dict(), strict=True)
    images = torch.randn(8, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (8,), device=device)
    ours_opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (ours, reference))
    return compare("swin_t classifier train step, 8x224x224", lambda: classifier_training_step(ours, ours_opt, images, labels),
                   lambda: classifier_training_step(reference, ref_opt, images, labels), "timm",
                   device=device, unit_items=8, warmup=1, iters=2 if quick else 4)


def _nat(device: str, quick: bool) -> Row:
    torch.manual_seed(0)
    model = build_classifier("nat_tiny").train().to(device)
    images = torch.randn(2, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (2,), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def reference_step() -> None:
        with mock.patch("vision_tx.backbones.nat.na2d", masked_sdpa):
            classifier_training_step(model, optimizer, images, labels)

    return compare("nat_tiny classifier train step, 2x224x224", lambda: classifier_training_step(model, optimizer, images, labels),
                   reference_step, "masked SDPA", device=device, unit_items=2, warmup=1, iters=2 if quick else 4)


def run(device: str, quick: bool) -> list[Row]:
    return [_swin(device, quick), upernet_train_step(device, quick, DROP_PATH), _nat(device, quick)]
