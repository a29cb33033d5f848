"""DETR-R50 training step (forward + loss + backward) against transformers' DetrForObjectDetection.

Both models are randomly initialised, see the same batch (2 images of 512x640, 4 random boxes each)
and do the same work: ResNet-50 with frozen BatchNorm, stem and layer1 frozen, layer2-4 trained,
dropout 0.1 on attention weights and in the FFN, auxiliary losses on all 6 decoder layers. Also
prints the share of vision_tx's step spent in matching and loss.
"""

from __future__ import annotations

import time

import torch

from benchmarks.timing import Row, compare
from vision_tx.backbones.resnet import ResNet
from vision_tx.models import DETR

NUM_CLASSES = 91


def _batch(device: str, height: int = 512, width: int = 640, batch: int = 2, boxes_per_image: int = 4):
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, height, width, generator=generator).to(device)
    pixel_mask = torch.zeros(batch, height, width, dtype=torch.bool, device=device)
    pixel_mask[1:, :, width * 3 // 4 :] = True
    targets = []
    for _ in range(batch):
        centers = 0.2 + 0.6 * torch.rand(boxes_per_image, 2, generator=generator)
        sizes = 0.05 + 0.3 * torch.rand(boxes_per_image, 2, generator=generator)
        labels = torch.randint(1, NUM_CLASSES, (boxes_per_image,), generator=generator)
        targets.append({"labels": labels.to(device), "boxes": torch.cat([centers, sizes], 1).to(device)})
    return images, pixel_mask, targets


def _reference_model(device: str) -> torch.nn.Module:
    import transformers

    config = transformers.DetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=transformers.ResNetConfig(out_features=["stage4"]),
        num_labels=NUM_CLASSES,
        auxiliary_loss=True,
        attention_dropout=0.1,  # DETR's dropout also acts on attention weights and inside the FFN
        activation_dropout=0.1,
    )
    model = transformers.DetrForObjectDetection(config).to(device).train()
    # DETR trains layer2-4 of the ResNet. transformers means to as well, but its name filter looks for
    # "stage.1" in parameter names that read "stages.1", so with use_timm_backbone=False it freezes the
    # whole backbone; train the same stages here so that both sides do the same work.
    for name, parameter in model.model.backbone.model.named_parameters():
        parameter.requires_grad_(any(f"stages.{i}." in name for i in (1, 2, 3)))
    return model


def run(device: str, quick: bool) -> list[Row]:
    torch.manual_seed(0)
    images, pixel_mask, targets = _batch(device)
    model = DETR(ResNet(), NUM_CLASSES).to(device).train()
    reference = _reference_model(device)
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]

    def ours() -> None:
        model.zero_grad(set_to_none=True)
        model.loss(model(images, pixel_mask), targets)["loss"].backward()

    def theirs() -> None:
        reference.zero_grad(set_to_none=True)
        reference(images, pixel_mask=(~pixel_mask).long(), labels=labels).loss.backward()

    iters = 2 if quick else 4  # per process
    row = compare(
        "DETR-R50 train step, 2x512x640", ours, theirs, "transformers", device, unit_items=2, warmup=1, iters=iters
    )
    print(f"time ratio vision_tx / transformers: {1 / row.speedup:.2f} (target <= 0.80)")

    with torch.no_grad():
        outputs = model(images, pixel_mask)
    detached = {
        "pred_logits": outputs["pred_logits"].requires_grad_(),
        "pred_boxes": outputs["pred_boxes"].requires_grad_(),
        "aux_outputs": [{k: v.requires_grad_() for k, v in layer.items()} for layer in outputs["aux_outputs"]],
    }
    start = time.perf_counter()
    for _ in range(iters):
        model.loss(detached, targets)["loss"].backward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    loss_s = (time.perf_counter() - start) / iters
    print(
        f"matching + loss (all 6 layers, forward and backward): {loss_s * 1e3:.1f} ms = "
        f"{100 * loss_s / row.ours_s:.1f}% of the step (target < 5%)"
    )
    return [row]
