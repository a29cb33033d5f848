"""Mask2Former training step (forward + set loss + backward) of the head against transformers'
Mask2FormerForUniversalSegmentation with the same weights.

On the CPU both read the same Swin-T-shaped backbone maps of a 2x512x512 batch (the backbone is left
out: it is not Mask2Former's); on a GPU (``device`` ``cuda``...) the backbone is in the step: each side
trains its own copy of the same vision_tx Swin-T (stochastic depth 0.2), the whole model's step in fp32,
and the row also gives each side's peak memory. The paper's head (width 256, 6 deformable encoder layers,
9 decoder layers, 100 queries, 150 classes, 12544 points per mask) and 6 target masks per image. Also
prints the share of vision_tx's step spent in matching and loss.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch

from benchmarks.timing import Row, compare, synchronize
from tests.models.test_mask2former import MapsBackbone, to_transformers
from vision_tx.backbones import build_backbone
from vision_tx.models.mask2former import Mask2Former

NUM_CLASSES, CHANNELS, SIZE = 150, (96, 192, 384, 768), 512


def _inputs(device: str, batch: int = 2, masks_per_image: int = 6, size: tuple[int, int] = (SIZE, SIZE)):
    generator = torch.Generator().manual_seed(0)
    height, width = size
    maps = [
        torch.randn(batch, c, height // s, width // s, generator=generator).to(device)
        for c, s in zip(CHANNELS, (4, 8, 16, 32))
    ]
    targets = []
    for _ in range(batch):
        masks = torch.zeros(masks_per_image, height, width, dtype=torch.bool)
        for mask in masks:
            y, x = torch.randint(0, height // 2, (2,), generator=generator).tolist()
            h, w = torch.randint(32, min(height, width) // 2, (2,), generator=generator).tolist()
            mask[y : y + h, x : x + w] = True
        labels = torch.randint(0, NUM_CLASSES, (masks_per_image,), generator=generator)
        targets.append({"labels": labels.to(device), "masks": masks.to(device)})
    return maps, targets


def _reference(backbone: torch.nn.Module, state: dict[str, torch.Tensor], device: str) -> torch.nn.Module:
    """transformers' model with the head weights of ``state`` (vision_tx's), reading the maps of ``backbone``
    (a vision_tx backbone, registered in the model: moved and trained with it)."""
    import transformers

    config = transformers.Mask2FormerConfig(
        backbone_config=transformers.SwinConfig(out_features=["stage1", "stage2", "stage3", "stage4"]),
        num_labels=NUM_CLASSES,
        num_queries=100,
        decoder_layers=10,
        dropout=0.0,
    )
    model = transformers.Mask2FormerForUniversalSegmentation(config)
    model.load_state_dict(
        to_transformers({k: v for k, v in state.items() if not k.startswith("backbone.")}), strict=False
    )
    model.vision_tx_backbone = backbone
    model.model.pixel_level_module.encoder.forward = lambda pixel_values, *args, **kw: SimpleNamespace(
        feature_maps=tuple(backbone(pixel_values).values())
    )
    return model.to(device).train()


def run(device: str, quick: bool) -> list[Row]:
    in_step = device.startswith("cuda")  # the backbone in the timed step (on the CPU: fixed maps)
    torch.manual_seed(0)
    maps, targets = _inputs(device)
    if in_step:
        swin = build_backbone("swin_t").to(device).train()
        backbones = copy.deepcopy(swin), copy.deepcopy(swin)  # each side trains its own, from the same weights
    else:
        backbones = MapsBackbone(maps), MapsBackbone(maps)
    model = Mask2Former(backbones[0], NUM_CLASSES).to(device).train()
    reference = _reference(backbones[1], model.state_dict(), device)
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1)).to(device)
    mask_labels = [t["masks"].float() for t in targets]
    class_labels = [t["labels"] for t in targets]

    def ours() -> None:
        model.zero_grad(set_to_none=True)
        model.loss(model(images), targets)["loss"].backward()

    def theirs() -> None:
        reference.zero_grad(set_to_none=True)
        reference(images, mask_labels=mask_labels, class_labels=class_labels).loss.backward()

    iters = 2 if quick else 3  # per process
    name = "Mask2Former-Swin-T train step (Swin-T in the step)" if in_step else "Mask2Former head train step"
    row = compare(f"{name}, 2x{SIZE}x{SIZE}", ours, theirs, "transformers", device, unit_items=2, warmup=1, iters=iters)
    print(f"time ratio vision_tx / transformers: {1 / row.speedup:.2f} (target <= 1.00)")

    with torch.no_grad():
        outputs = model(images)
    detached = {
        **outputs,
        "pred_logits": outputs["pred_logits"].requires_grad_(),
        "pred_masks": outputs["pred_masks"].requires_grad_(),
        "aux_outputs": [{k: v.requires_grad_() for k, v in layer.items()} for layer in outputs["aux_outputs"]],
    }
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        model.loss(detached, targets)["loss"].backward()
    synchronize(device)
    loss_s = (time.perf_counter() - start) / iters
    print(
        f"matching + point-sampled loss (10 predictions, forward and backward): {loss_s * 1e3:.1f} ms = "
        f"{100 * loss_s / row.ours_s:.1f}% of the step"
    )
    _print_saved_memory(device)
    return [row]


def saved_for_backward_bytes(step: Callable[[], torch.Tensor]) -> tuple[int, int]:
    """The bytes of the distinct tensors that ``step`` (a forward pass returning the loss) keeps for the
    backward pass, and the largest one's: the activation memory of a training step, device-independent."""
    storages: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        step()
    return sum(storages.values()), max(storages.values(), default=0)


def _print_saved_memory(device: str, size: tuple[int, int] = (800, 1216)) -> None:
    """Activation memory of one image of COCO's training size (the paper's 1024 crop is larger still)."""
    torch.manual_seed(0)
    maps, targets = _inputs(device, batch=1, masks_per_image=8, size=size)
    model = Mask2Former(MapsBackbone(maps), NUM_CLASSES).to(device).train()
    reference = _reference(MapsBackbone(maps), model.state_dict(), device)
    images = torch.zeros(1, 3, *size, device=device)
    ours, ours_largest = saved_for_backward_bytes(lambda: model.loss(model(images), targets)["loss"])
    theirs, their_largest = saved_for_backward_bytes(
        lambda: (
            reference(
                images, mask_labels=[t["masks"].float() for t in targets], class_labels=[t["labels"] for t in targets]
            ).loss
        )
    )
    mib = 2**20
    print(
        f"saved for backward, 1x{size[0]}x{size[1]}: vision_tx {ours / mib:.0f} MiB "
        f"(largest tensor {ours_largest / mib:.1f} MiB), "
        f"transformers {theirs / mib:.0f} MiB (largest {their_largest / mib:.1f} MiB): ratio {theirs / ours:.2f}"
    )
