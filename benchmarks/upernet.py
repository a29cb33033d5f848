"""UperNet Swin-T forward at 512x512 (batch 1, eval) against transformers' UperNetForSemanticSegmentation.

Both build Swin-T (embed 96, depths 2-2-6-2, window 7) with random weights, 150 classes, and return
logits at the input size. transformers also runs its auxiliary FCN head at inference; the second
row times it with ``use_auxiliary_head=False`` to compare the same work.

On a GPU (``device`` ``cuda``...) a third row times the whole model's training step (``train_step``; on the
CPU it is benchmarks.train's): forward, loss with the FCN auxiliary head (weight 0.4), backward and an AdamW
step, batch 2 at 512x512 in fp32, transformers given our weights (its Swin's separate q/k/v are our ``qkv``
split in three), stochastic depth 0.2 on both sides; each row on a GPU also gives both sides' peak memory.
"""

from __future__ import annotations

import re

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
        embed_dim=96,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        window_size=7,
        drop_path_rate=drop_path_rate,
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    config = UperNetConfig(backbone_config=swin, num_labels=NUM_CLASSES, use_auxiliary_head=aux)
    return UperNetForSemanticSegmentation(config).to(device).eval()


def to_transformers_upernet(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A vision_tx ``UperNetSegmentor(swin_t)`` state dict in transformers' ``UperNetForSemanticSegmentation`` keys."""
    converted = {}
    for key, value in state.items():
        key = key.replace(".bn.", ".batch_norm.")
        if key.startswith("backbone."):
            key = re.sub(r"^backbone\.stem\.proj\.", "backbone.swin.embeddings.patch_embeddings.projection.", key)
            key = re.sub(r"^backbone\.stem\.norm\.", "backbone.swin.embeddings.norm.", key)
            key = re.sub(
                r"^backbone\.stages\.(\d+)\.out_norm\.",
                lambda m: f"backbone.hidden_states_norms.stage{int(m[1]) + 1}.",
                key,
            )
            key = re.sub(
                r"^backbone\.stages\.(\d+)\.downsample\.",
                lambda m: f"backbone.swin.encoder.layers.{int(m[1]) - 1}.downsample.",
                key,
            )
            key = key.replace("backbone.stages.", "backbone.swin.encoder.layers.")
            for ours, theirs in (
                ("norm1", "layernorm_before"),
                ("norm2", "layernorm_after"),
                ("attn.proj", "attention.o_proj"),
                ("attn.relative_position_bias_table", "attention.relative_position_bias.relative_position_bias_table"),
            ):
                key = key.replace(f".{ours}", f".{theirs}")
            if ".attn.qkv." in key:
                for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3)):
                    converted[key.replace("attn.qkv", f"attention.{name}")] = part
                continue
        converted[key] = value
    return converted


def train_step(device: str, quick: bool, drop_path_rate: float = 0.2) -> Row:
    """The training step row (module docstring), stochastic depth ``drop_path_rate`` on both sides."""
    torch.manual_seed(0)
    ours = UperNetSegmentor(build_backbone("swin_t", drop_path_rate=drop_path_rate), NUM_CLASSES).train().to(device)
    reference = transformers_upernet(True, device, drop_path_rate=drop_path_rate).train()
    result = reference.load_state_dict(to_transformers_upernet(ours.state_dict()), strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {
        "backbone.swin.layernorm.weight",
        "backbone.swin.layernorm.bias",
    }:
        raise RuntimeError(f"{__name__}: UperNet weights do not map onto transformers': {result}")
    images = torch.randn(2, 3, 512, 512, device=device)
    labels = torch.randint(0, NUM_CLASSES, (2, 512, 512), device=device)
    ours_opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (ours, reference))

    def ours_step() -> None:
        ours_opt.zero_grad(set_to_none=True)
        ours.loss(ours(images), labels)["loss"].backward()
        ours_opt.step()

    def reference_step() -> None:
        ref_opt.zero_grad(set_to_none=True)
        reference(pixel_values=images, labels=labels).loss.backward()
        ref_opt.step()

    return compare(
        "upernet swin_t + aux train step, 2x512x512",
        ours_step,
        reference_step,
        "transformers",
        device=device,
        unit_items=2,
        warmup=1,
        iters=2 if quick else 3,
    )


def _eval_row(ours: UperNetSegmentor, images: torch.Tensor, aux: bool, device: str, warmup: int, iters: int) -> Row:
    """One eval row against transformers' model with or without its aux head; that model is freed on return."""
    reference = transformers_upernet(aux, device)
    label = "transformers" if aux else "transformers, no aux head"
    return compare(
        f"upernet swin_t 512x512 b1 eval ({'vs default' if aux else 'vs no aux'})",
        lambda: ours.inference(images),
        lambda: reference(pixel_values=images).logits,
        label,
        device=device,
        warmup=warmup,
        iters=iters,
    )


def run(device: str = "cpu", quick: bool = False) -> list[Row]:
    torch.manual_seed(0)
    ours = UperNetSegmentor(build_backbone("swin_t"), NUM_CLASSES).to(device).eval()
    images = torch.randn(1, 3, 512, 512, device=device)
    iters, warmup = (2, 1) if quick else (3, 2)  # per process
    rows = []
    with torch.inference_mode():
        for aux in (True, False):
            rows.append(_eval_row(ours, images, aux, device, warmup, iters))
    if device.startswith("cuda"):
        rows.append(train_step(device, quick))
    return rows
