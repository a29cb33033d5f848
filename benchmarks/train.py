"""Training steps (forward, loss, backward, AdamW step), vision_tx against a reference with the same weights.

- Swin-T classifier, batch 8, 224x224, cross-entropy, against timm ``swin_tiny_patch4_window7_224``.
- UperNet Swin-T with the FCN auxiliary head (loss weight 0.4), batch 2, 512x512, 150 classes, against
  transformers' ``UperNetForSemanticSegmentation``; its Swin's separate q/k/v are our ``qkv`` split in three.
- NAT-Tiny classifier, batch 2, 224x224, against the same model with ``na2d`` replaced by dense SDPA
  with the neighbourhood and the relative position bias as an additive mask (natten's CPU path has no backward).

Both sides use stochastic depth 0.2 (the recipes'); dropout and drop-path draw their own random numbers.
"""

from __future__ import annotations

import re
from unittest import mock

import timm
import torch

from benchmarks.na2d import masked_sdpa
from benchmarks.timing import Row, classifier_training_step, compare
from benchmarks.upernet import NUM_CLASSES as SEG_CLASSES, transformers_upernet
from vision_tx.backbones import build_backbone, build_classifier, load_weights
from vision_tx.models.segmentor import UperNetSegmentor

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


def to_transformers_upernet(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A vision_tx ``UperNetSegmentor(swin_t)`` state dict in transformers' ``UperNetForSemanticSegmentation`` keys."""
    converted = {}
    for key, value in state.items():
        key = key.replace(".bn.", ".batch_norm.")
        if key.startswith("backbone."):
            key = re.sub(r"^backbone\.stem\.proj\.", "backbone.swin.embeddings.patch_embeddings.projection.", key)
            key = re.sub(r"^backbone\.stem\.norm\.", "backbone.swin.embeddings.norm.", key)
            key = re.sub(r"^backbone\.stages\.(\d+)\.out_norm\.", lambda m: f"backbone.hidden_states_norms.stage{int(m[1]) + 1}.", key)
            key = re.sub(r"^backbone\.stages\.(\d+)\.downsample\.", lambda m: f"backbone.swin.encoder.layers.{int(m[1]) - 1}.downsample.", key)
            key = key.replace("backbone.stages.", "backbone.swin.encoder.layers.")
            for ours, theirs in (("norm1", "layernorm_before"), ("norm2", "layernorm_after"), ("attn.proj", "attention.o_proj"),
                                 ("attn.relative_position_bias_table", "attention.relative_position_bias.relative_position_bias_table")):
                key = key.replace(f".{ours}", f".{theirs}")
            if ".attn.qkv." in key:
                for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3)):
                    converted[key.replace("attn.qkv", f"attention.{name}")] = part
                continue
        converted[key] = value
    return converted


def _upernet(device: str, quick: bool) -> Row:
    torch.manual_seed(0)
    ours = UperNetSegmentor(build_backbone("swin_t", drop_path_rate=DROP_PATH), SEG_CLASSES).train().to(device)
    reference = transformers_upernet(True, device, drop_path_rate=DROP_PATH).train()
    result = reference.load_state_dict(to_transformers_upernet(ours.state_dict()), strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"backbone.swin.layernorm.weight", "backbone.swin.layernorm.bias"}:
        raise RuntimeError(f"UperNet weights do not map onto transformers': {result}")
    images = torch.randn(2, 3, 512, 512, device=device)
    labels = torch.randint(0, SEG_CLASSES, (2, 512, 512), device=device)
    ours_opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (ours, reference))

    def ours_step() -> None:
        ours_opt.zero_grad(set_to_none=True)
        ours.loss(ours(images), labels)["loss"].backward()
        ours_opt.step()

    def reference_step() -> None:
        ref_opt.zero_grad(set_to_none=True)
        reference(pixel_values=images, labels=labels).loss.backward()
        ref_opt.step()

    return compare("upernet swin_t + aux train step, 2x512x512", ours_step, reference_step, "transformers",
                   device=device, unit_items=2, warmup=1, iters=2 if quick else 3)


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
    return [_swin(device, quick), _upernet(device, quick), _nat(device, quick)]
