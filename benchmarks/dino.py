"""DINO-Swin-T training step against transformers' DeformableDetrForObjectDetection (two-stage, box refinement).

Both sides train on the same Swin-T (strides 8, 16, 32) of 2 images of 512x640, the second padded on
its right quarter. On the CPU its maps are computed once before timing: the detector's work only, the
backbone left out. On a GPU (``device`` ``cuda``...) the backbone is in the step: each side trains its own
copy of the same vision_tx Swin-T (stochastic depth 0.2), so the row is the whole model's step, in fp32.
A step is forward, loss, backward and an AdamW step. Settings of DINO's 4-scale model on both sides:
900 queries, 6 + 6 layers of width 256, 8 heads, 4 levels, 4 points, FFN 2048, no dropout; 91 classes,
7 boxes per image. Rows, in interleaved rounds with the same transformers model (on a GPU also each
step's peak memory):

1. vision_tx in Deformable DETR mode (two-stage queries, no denoising, its position encoding, no
   decoder norm), given transformers' weights: the same computation, checked by comparing the losses
   first (vision_tx also trains the encoder's proposals, which transformers leaves out).
2. vision_tx with DINO's defaults (mixed query selection, 100 denoising queries): the cost of DINO's
   additions.

Also prints the share of vision_tx's step spent in matching + loss (the criterion's forward).
"""

from __future__ import annotations

import copy
import time

import torch

from benchmarks.timing import Row, peak_bytes, seconds_per_call, synchronize
from tests.models.test_dino import DEFORMABLE_DETR, MapsBackbone, to_transformers
from vision_tx.backbones import build_backbone
from vision_tx.models import DINO

NUM_CLASSES, BOXES_PER_IMAGE, BATCH, HEIGHT, WIDTH = 91, 7, 2, 512, 640
SETTINGS = dict(
    num_queries=900,
    hidden_dim=256,
    num_heads=8,
    num_encoder_layers=6,
    num_decoder_layers=6,
    dim_feedforward=2048,
    dropout=0.0,
    num_levels=4,
    num_points=4,
)


def _batch(device: str) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]]:
    """Images, padding mask (True on padding) and normalised targets, on ``device``."""
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
        targets.append({"labels": labels.to(device), "boxes": torch.cat([centres, sizes], 1).to(device)})
    return images.to(device), pixel_mask.to(device), targets


def _reference_model(ours: DINO, backbone: torch.nn.Module) -> torch.nn.Module:
    """transformers' model with ``ours``' weights (Deformable DETR mode) but its backbone's, reading the maps of
    ``backbone`` (a vision_tx backbone, registered in the model: moved and trained with it)."""
    import torch.nn.functional as F
    import transformers

    config = transformers.DeformableDetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=transformers.ResNetConfig(
            out_features=["stage2", "stage3", "stage4"],
            embedding_size=8,
            hidden_sizes=[8, *backbone.out_channels],
            depths=[1, 1, 1, 1],
        ),
        num_labels=NUM_CLASSES,
        d_model=SETTINGS["hidden_dim"],
        encoder_layers=SETTINGS["num_encoder_layers"],
        decoder_layers=SETTINGS["num_decoder_layers"],
        encoder_attention_heads=SETTINGS["num_heads"],
        decoder_attention_heads=SETTINGS["num_heads"],
        encoder_ffn_dim=SETTINGS["dim_feedforward"],
        decoder_ffn_dim=SETTINGS["dim_feedforward"],
        num_feature_levels=SETTINGS["num_levels"],
        encoder_n_points=SETTINGS["num_points"],
        decoder_n_points=SETTINGS["num_points"],
        num_queries=SETTINGS["num_queries"],
        two_stage_num_proposals=SETTINGS["num_queries"],
        two_stage=True,
        with_box_refine=True,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        auxiliary_loss=True,
        class_cost=2,
    )
    reference = transformers.DeformableDetrForObjectDetection(config)
    head_state = {k: v for k, v in ours.state_dict().items() if not k.startswith("backbone.")}
    reference.load_state_dict(to_transformers(head_state), strict=False)
    for parameter in reference.model.backbone.parameters():
        parameter.requires_grad_(False)
    reference.vision_tx_backbone = backbone

    def backbone_maps(pixel_values, pixel_mask):
        maps = backbone(pixel_values).values()
        return [(m, F.interpolate(pixel_mask[None].float(), size=m.shape[-2:])[0].bool()) for m in maps]

    reference.model.backbone.forward = backbone_maps
    return reference.train()


def _check_losses(ours: DINO, reference: torch.nn.Module, images, pixel_mask, targets, labels) -> float:
    """The largest difference between the two sides' decoder losses (the same weights and targets; the
    backbones in eval mode, so that stochastic depth draws nothing)."""
    backbones = (ours.backbone, reference.vision_tx_backbone)
    for backbone in backbones:
        backbone.eval()
    with torch.no_grad():
        outputs = ours(images, pixel_mask, targets)
        losses = ours.loss({k: v for k, v in outputs.items() if k != "enc_outputs"}, targets)
        expected = reference(images, pixel_mask=(~pixel_mask).long(), labels=labels).loss_dict
    for backbone in backbones:
        backbone.train()
    keys = [k for k in expected if k.startswith("loss_")]
    if len(keys) != 3 * SETTINGS["num_decoder_layers"]:
        raise RuntimeError(f"{__name__}: transformers returned losses {sorted(expected)}")
    return max(abs(losses[k] - expected[k]).item() for k in keys)


def run(device: str, quick: bool) -> list[Row]:
    in_step = device.startswith("cuda")  # the backbone in the timed step (on the CPU: fixed maps)
    images, pixel_mask, targets = _batch(device)
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    torch.manual_seed(0)
    swin = build_backbone("swin_t", out_indices=(1, 2, 3)).to(device)
    if not in_step:
        with torch.no_grad():
            maps = list(swin.eval()(images).values())

    def backbone() -> torch.nn.Module:
        """Each model's own backbone: a copy of ``swin`` (the same initial weights), or the fixed maps."""
        return copy.deepcopy(swin).train() if in_step else MapsBackbone(maps)

    torch.manual_seed(0)
    deformable = DINO.build(backbone(), NUM_CLASSES, **SETTINGS, **DEFORMABLE_DETR).to(device).train()
    reference = _reference_model(deformable, backbone()).to(device)
    print(
        f"decoder losses, vision_tx (Deformable DETR mode) vs transformers: largest difference "
        f"{_check_losses(deformable, reference, images, pixel_mask, targets, labels):.1e}",
        flush=True,
    )
    torch.manual_seed(0)
    dino = DINO.build(backbone(), NUM_CLASSES, **SETTINGS).to(device).train()

    loss_seconds: dict[str, list[float]] = {"deformable": [], "dino": []}

    def our_step(model: DINO, optimizer: torch.optim.Optimizer, name: str):
        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            outputs = model(images, pixel_mask, targets)
            synchronize(device)
            start = time.perf_counter()
            loss = model.loss(outputs, targets)["loss"]
            synchronize(device)
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
    peaks = {name: peak_bytes(step, device) for name, step in steps.items()}  # None off the GPU
    for seconds in loss_seconds.values():
        seconds.clear()
    for round_index in range(iters):
        for name, step in steps.items():
            times[name].append(seconds_per_call(step, device, warmup=0, iters=1))
        print(
            f"round {round_index + 1}: " + ", ".join(f"{name} {times[name][-1] * 1e3:.0f} ms" for name in steps),
            flush=True,
        )

    base = f"DINO-Swin-T train step b{BATCH} {HEIGHT}x{WIDTH}, {'Swin-T in the step' if in_step else 'fixed maps'}"
    rows = [
        Row(
            f"{base}, {label}",
            tuple(times[name]),
            tuple(times["reference"]),
            "transformers",
            BATCH,
            ours_peak_bytes=peaks[name],
            reference_peak_bytes=peaks["reference"],
        )
        for name, label in (("deformable", "Deformable DETR mode"), ("dino", "DINO (mixed, 100 denoising)"))
    ]
    for row, name in zip(rows, ("deformable", "dino")):
        share = 100 * sum(loss_seconds[name]) / sum(times[name])
        rounds = ", ".join(f"{1 / speedup:.2f}" for speedup in row.round_speedups)
        print(
            f"{row.name}: time ratio vision_tx / transformers {1 / row.speedup:.2f} (rounds {rounds}; target <= 0.80); "
            f"matching + loss {1e3 * sum(loss_seconds[name]) / len(loss_seconds[name]):.0f} ms = "
            f"{share:.1f}% of the step (target < 5%)",
            flush=True,
        )
    return rows
