"""DINO-Swin-T training step against transformers' DeformableDetrForObjectDetection (two-stage, box refinement).

Both sides train on the same Swin-T maps (strides 8, 16, 32 of 2 images of 512x640, the second padded
on its right quarter), computed once before timing: the detector's work only, the backbone left out.
A step is forward, loss, backward and an AdamW step. Settings of DINO's 4-scale model on both sides:
900 queries, 6 + 6 layers of width 256, 8 heads, 4 levels, 4 points, FFN 2048, no dropout; 91 classes,
7 boxes per image. Rows, in interleaved rounds with the same transformers model:

1. vision_tx in Deformable DETR mode (two-stage queries, no denoising, its position encoding, no
   decoder norm), given transformers' weights: the same computation, checked by comparing the losses
   first (vision_tx also trains the encoder's proposals, which transformers leaves out).
2. vision_tx with DINO's defaults (mixed query selection, 100 denoising queries): the cost of DINO's
   additions.

Also prints the share of vision_tx's step spent in matching + loss (the criterion's forward).
"""

from __future__ import annotations

import time

import torch

from benchmarks.timing import Row, seconds_per_call
from tests.models.test_dino import DEFORMABLE_DETR, MapsBackbone, to_transformers
from vision_tx.backbones import build_backbone
from vision_tx.models import DINO

NUM_CLASSES, BOXES_PER_IMAGE, BATCH, HEIGHT, WIDTH = 91, 7, 2, 512, 640
SETTINGS = dict(num_queries=900, hidden_dim=256, num_heads=8, num_encoder_layers=6, num_decoder_layers=6,
                dim_feedforward=2048, dropout=0.0, num_levels=4, num_points=4)


def _batch() -> tuple[torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]], list[torch.Tensor]]:
    """Images, padding mask (True on padding), normalised targets and the Swin-T maps of the images."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(BATCH, 3, HEIGHT, WIDTH, generator=generator)
    pixel_mask = torch.zeros(BATCH, HEIGHT, WIDTH, dtype=torch.bool)
    pixel_mask[1:, :, WIDTH * 3 // 4 :] = True
    images = images.masked_fill(pixel_mask[:, None], 0.0)
    targets = []
    for _ in range(BATCH):
        centres = 0.2 + 0.6 * torch.rand(BOXES_PER_IMAGE, 2, generator=generator)
        sizes = 0.05 + 0.3 * torch.rand(BOXES_PER_IMAGE, 2, generator=generator)
        labels = torch.randint(1, NUM_CLASSES, (BOXES_PER_IMAGE,), generator=generator)
        targets.append({"labels": labels, "boxes": torch.cat([centres, sizes], 1)})
    torch.manual_seed(0)
    with torch.no_grad():
        maps = list(build_backbone("swin_t", out_indices=(1, 2, 3)).eval()(images).values())
    return images, pixel_mask, targets, maps


def _reference_model(ours: DINO, maps: list[torch.Tensor]) -> torch.nn.Module:
    """transformers' model with ``ours``' weights (Deformable DETR mode), reading ``maps`` as its backbone's."""
    import torch.nn.functional as F
    import transformers

    config = transformers.DeformableDetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False,
        backbone_config=transformers.ResNetConfig(out_features=["stage2", "stage3", "stage4"], embedding_size=8,
                                                  hidden_sizes=[8, *(m.shape[1] for m in maps)], depths=[1, 1, 1, 1]),
        num_labels=NUM_CLASSES, d_model=SETTINGS["hidden_dim"], encoder_layers=SETTINGS["num_encoder_layers"],
        decoder_layers=SETTINGS["num_decoder_layers"], encoder_attention_heads=SETTINGS["num_heads"],
        decoder_attention_heads=SETTINGS["num_heads"], encoder_ffn_dim=SETTINGS["dim_feedforward"],
        decoder_ffn_dim=SETTINGS["dim_feedforward"], num_feature_levels=SETTINGS["num_levels"],
        encoder_n_points=SETTINGS["num_points"], decoder_n_points=SETTINGS["num_points"],
        num_queries=SETTINGS["num_queries"], two_stage_num_proposals=SETTINGS["num_queries"], two_stage=True,
        with_box_refine=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, auxiliary_loss=True, class_cost=2,
    )
    reference = transformers.DeformableDetrForObjectDetection(config)
    reference.load_state_dict(to_transformers(ours.state_dict()), strict=False)
    for parameter in reference.model.backbone.parameters():
        parameter.requires_grad_(False)

    def backbone_maps(pixel_values, pixel_mask):
        return [(m, F.interpolate(pixel_mask[None].float(), size=m.shape[-2:])[0].bool()) for m in maps]

    reference.model.backbone.forward = backbone_maps
    return reference.train()


def _check_losses(ours: DINO, reference: torch.nn.Module, images, pixel_mask, targets, labels) -> float:
    """The largest difference between the two sides' decoder losses (the same weights and targets)."""
    with torch.no_grad():
        outputs = ours(images, pixel_mask, targets)
        losses = ours.loss({k: v for k, v in outputs.items() if k != "enc_outputs"}, targets)
        expected = reference(images, pixel_mask=(~pixel_mask).long(), labels=labels).loss_dict
    keys = [k for k in expected if k.startswith("loss_")]
    if len(keys) != 3 * SETTINGS["num_decoder_layers"]:
        raise RuntimeError(f"benchmarks/dino.py: transformers returned losses {sorted(expected)}")
    return max(abs(losses[k] - expected[k]).item() for k in keys)


def run(device: str, quick: bool) -> list[Row]:
    if device != "cpu":
        raise ValueError("benchmarks/dino.py: the DINO step benchmark runs on the CPU (--device cpu)")
    images, pixel_mask, targets, maps = _batch()
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    torch.manual_seed(0)
    deformable = DINO(MapsBackbone(maps), NUM_CLASSES, **SETTINGS, **DEFORMABLE_DETR).train()
    reference = _reference_model(deformable, maps)
    print(f"decoder losses, vision_tx (Deformable DETR mode) vs transformers: largest difference "
          f"{_check_losses(deformable, reference, images, pixel_mask, targets, labels):.1e}", flush=True)
    torch.manual_seed(0)
    dino = DINO(MapsBackbone(maps), NUM_CLASSES, **SETTINGS).train()

    loss_seconds: dict[str, list[float]] = {"deformable": [], "dino": []}

    def our_step(model: DINO, optimizer: torch.optim.Optimizer, name: str):
        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            outputs = model(images, pixel_mask, targets)
            start = time.perf_counter()
            loss = model.loss(outputs, targets)["loss"]
            loss_seconds[name].append(time.perf_counter() - start)
            loss.backward()
            optimizer.step()
        return step

    reference_optimizer = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=1e-4)

    def reference_step() -> None:
        reference_optimizer.zero_grad(set_to_none=True)
        reference(images, pixel_mask=(~pixel_mask).long(), labels=labels).loss.backward()
        reference_optimizer.step()

    steps = {
        "deformable": our_step(deformable, torch.optim.AdamW(deformable.parameters(), lr=1e-4), "deformable"),
        "dino": our_step(dino, torch.optim.AdamW(dino.parameters(), lr=1e-4), "dino"),
        "reference": reference_step,
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    iters = 1 if quick else 3  # per process
    for step in steps.values():  # a warm-up round
        step()
    for seconds in loss_seconds.values():
        seconds.clear()
    for round_index in range(iters):
        for name, step in steps.items():
            times[name].append(seconds_per_call(step, device, warmup=0, iters=1))
        print(f"round {round_index + 1}: " + ", ".join(f"{name} {times[name][-1]:.1f} s" for name in steps), flush=True)

    base = f"DINO-Swin-T train step b{BATCH} {HEIGHT}x{WIDTH}, fixed maps"
    rows = [
        Row(f"{base}, Deformable DETR mode", tuple(times["deformable"]), tuple(times["reference"]), "transformers", BATCH),
        Row(f"{base}, DINO (mixed, 100 denoising)", tuple(times["dino"]), tuple(times["reference"]), "transformers", BATCH),
    ]
    for row, name in zip(rows, ("deformable", "dino")):
        share = 100 * sum(loss_seconds[name]) / sum(times[name])
        rounds = ", ".join(f"{1 / speedup:.2f}" for speedup in row.round_speedups)
        print(f"{row.name}: time ratio vision_tx / transformers {1 / row.speedup:.2f} (rounds {rounds}; target <= 0.80); "
              f"matching + loss {1e3 * sum(loss_seconds[name]) / len(loss_seconds[name]):.0f} ms = {share:.1f}% of the step (target < 5%)",
              flush=True)
    return rows
