"""The main job's training step against YOLOv8n's, the same images per call: what a user comparing the two at equal
wall-clock sees.

- vision_tx: ``rtdetr_convnext_toy`` as its config builds it (the task module's detector, its optimiser's parameter
  groups, the config's gradient clipping), eight batches of 8 taken in turn from its own training loader (the
  built-in toy set, its augmentations and multi-scale sizes, shorter side 144-192): forward with the denoising queries,
  the loss with its matching, backward, clipping, AdamW.
- YOLOv8n (Ultralytics, ``DetectionModel("yolov8n.yaml")`` with 4 classes, random weights): four batches of 16 (its
  trainer's default batch) at 192x192 (the comparison's ``imgsz``; docs/LEARNING.md), holding the same boxes: its
  ``v8DetectionLoss``, backward, clipping at its trainer's 10.0, the same fused AdamW.

A call of each side trains 64 images. On a GPU (``--device cuda``) both sides run under bf16 autocast. Ultralytics is
AGPL-3.0 and no dependency of vision_tx: it is imported here only; without it the benchmark prints a line and no row.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from benchmarks.export import CONFIG, ultralytics_version
from benchmarks.timing import Row, compare
from vision_tx.heads.detr.criterion import normalize_targets
from vision_tx.lightning.cli import configured, resolve_config

BATCHES = 8  # of the main job's 8 images (each at its own drawn scale): one timed call trains 64 images on each side
YOLO_BATCH, YOLO_SIZE = 16, 192


def main_job(device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer, float | None, list[dict]]:
    """The main job's detector on ``device``, its optimiser, gradient clipping value and ``BATCHES`` training batches
    (the config's data module, seeded)."""
    cli = configured(["--config", str(resolve_config(CONFIG)), "--trainer.logger", "false"])
    module, datamodule = cli.model, cli.datamodule
    datamodule.setup("fit")
    module.hparams.num_classes = datamodule.num_classes
    module.configure_model()
    torch.manual_seed(0)
    batches = list(itertools.islice(datamodule.train_dataloader(), BATCHES))
    model = module.model.to(device).train()
    optimizer = module.configure_optimizers()["optimizer"]
    return model, optimizer, cli.trainer.gradient_clip_val, batches


def yolo_batches(batches: list[dict], device: str) -> list[dict[str, torch.Tensor]]:
    """Ultralytics' batches (``img``, ``cls``, ``bboxes`` normalised cxcywh, ``batch_idx``) of ``YOLO_BATCH`` images
    at ``YOLO_SIZE``, holding the boxes of the main job's ``batches`` in the same order."""
    targets = [t for batch in batches for t in normalize_targets(batch["targets"])]
    generator = torch.Generator().manual_seed(0)
    out = []
    for start in range(0, len(targets), YOLO_BATCH):
        chunk = targets[start : start + YOLO_BATCH]
        out.append(
            {
                "img": torch.rand(len(chunk), 3, YOLO_SIZE, YOLO_SIZE, generator=generator).to(device),
                "cls": torch.cat([t["labels"] for t in chunk]).float()[:, None].to(device),
                "bboxes": torch.cat([t["boxes"] for t in chunk]).to(device),
                "batch_idx": torch.cat(
                    [torch.full((len(t["labels"]),), i, dtype=torch.float) for i, t in enumerate(chunk)]
                ).to(device),
            }
        )
    return out


def training_steps(
    loss_of: Callable[[object], torch.Tensor],
    parameters: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    clip: float | None,
    batches: list,
    device: str,
) -> Callable[[], None]:
    """A call that trains one step on each of ``batches``: ``loss_of(batch)``, backward, clipping at ``clip``, the
    optimiser's step (bf16 autocast on a GPU)."""

    def run() -> None:
        for batch in batches:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.split(":")[0], torch.bfloat16, enabled=device.startswith("cuda")):
                loss = loss_of(batch)
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(parameters, clip)
            optimizer.step()

    return run


def run(device: str, quick: bool) -> list[Row]:
    with tempfile.TemporaryDirectory() as folder:
        version = ultralytics_version(Path(folder))
        if version is None:
            return []
        from ultralytics.cfg import get_cfg
        from ultralytics.nn.tasks import DetectionModel

        model, optimizer, clip, batches = main_job(device)
        on_device = move_data_to_device(batches, device)

        def main_job_loss(batch: dict) -> torch.Tensor:
            outputs = model(batch["images"], batch["pixel_mask"], batch["targets"])
            return model.loss(outputs, batch["targets"])["loss"]

        torch.manual_seed(0)
        yolo = DetectionModel("yolov8n.yaml", nc=4, verbose=False).to(device).train()
        yolo.args = get_cfg()  # the loss reads its box, class and DFL gains from the trainer's defaults
        yolo_optimizer = torch.optim.AdamW(yolo.parameters(), lr=1e-3, fused=True)
        sizes = sorted({tuple(b["images"].shape[-2:]) for b in batches})
        print(f"ultralytics {version}; the main job's batches at {sizes} (h, w), YOLOv8n's at {YOLO_SIZE}x{YOLO_SIZE}")
        ours = training_steps(main_job_loss, list(model.parameters()), optimizer, clip, on_device, device)
        reference = training_steps(
            lambda batch: yolo.loss(batch)[0].sum(),
            list(yolo.parameters()),
            yolo_optimizer,
            10.0,
            yolo_batches(batches, device),
            device,
        )
        return [
            compare(
                f"{CONFIG} training step, {BATCHES}x8 toy-set images vs YOLOv8n {BATCHES // 2}x16 at {YOLO_SIZE}",
                ours,
                reference,
                "YOLOv8n",
                device=device,
                unit_items=BATCHES * 8,
                warmup=1,
                iters=3 if quick else 8,
            )
        ]
