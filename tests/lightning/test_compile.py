"""``compile``: every task's model, compiled (``aot_eager``: dynamo and AOTAutograd, the graphs run by
eager kernels), gives the eager model's loss and gradients in training and its outputs in validation.
In float64, so that the comparison sees the computation and not float32 rounding (the compiled graph
sums some terms in another order, e.g. ``ms_deform_attn``'s backward: 1e-4 of a DINO gradient in float32)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.compiling import tensors
from tests.models.detr_helpers import padded_batch
from tests.parity import perturb_
from vision_tx.lightning.classification import ClassificationModule
from vision_tx.lightning.detection import DetectionModule
from vision_tx.lightning.panoptic import PanopticModule
from vision_tx.lightning.segmentation import SegmentationModule
from vision_tx.lightning.task import TaskModule

NUM_CLASSES = 5
SWIN = {"embed_dim": 16, "depths": (2, 1, 1, 1), "num_heads": (1, 2, 2, 4), "window_size": 4, "drop_path_rate": 0.0}
DETR = {
    "num_queries": 6,
    "hidden_dim": 32,
    "num_heads": 2,
    "num_encoder_layers": 1,
    "num_decoder_layers": 2,
    "dim_feedforward": 64,
    "dropout": 0.0,
}
COMPILE = {"backend": "aot_eager"}


def detection_batch(with_masks: bool = False) -> dict[str, Any]:
    images, pixel_mask, targets = padded_batch((64, 96), (48, 80), (3, 2), NUM_CLASSES, with_masks=with_masks)
    return {"inputs": (images, pixel_mask), "train_inputs": (images, pixel_mask, targets), "targets": targets}


def image_batch(targets: torch.Tensor) -> dict[str, Any]:
    images = torch.randn(2, 3, 64, 64)
    return {"inputs": (images,), "train_inputs": (images,), "targets": targets}


TASKS: dict[str, Callable[[], tuple[TaskModule, dict[str, Any]]]] = {
    "classification": lambda: (
        ClassificationModule("swin_t", NUM_CLASSES, backbone_kwargs=SWIN, compile=COMPILE),
        image_batch(torch.tensor([1, 3])),
    ),
    "detr": lambda: (
        DetectionModule("swin_t", "detr", NUM_CLASSES, backbone_kwargs=SWIN, detector_kwargs=DETR, compile=COMPILE),
        detection_batch(),
    ),
    "dino": lambda: (
        DetectionModule(
            "swin_t",
            "dino",
            NUM_CLASSES,
            backbone_kwargs={**SWIN, "out_indices": (1, 2, 3)},
            compile=COMPILE,
            detector_kwargs={**DETR, "num_levels": 4, "num_points": 2, "num_denoising": 6},
        ),
        detection_batch(),
    ),
    "panoptic": lambda: (  # the mask head needs a width of 128 (GroupNorm(8) on width / 16 channels)
        PanopticModule(
            backbone="swin_t",
            num_classes=NUM_CLASSES,
            backbone_kwargs=SWIN,
            detector_kwargs={**DETR, "hidden_dim": 128, "num_heads": 4},
            compile=COMPILE,
        ),
        detection_batch(with_masks=True),
    ),
    "segmentation": lambda: (
        SegmentationModule(
            "swin_t",
            NUM_CLASSES,
            backbone_kwargs=SWIN,
            head_kwargs={"channels": 16, "aux_channels": 8, "dropout": 0.0},
            compile=COMPILE,
        ),
        image_batch(torch.randint(0, NUM_CLASSES, (2, 64, 64))),
    ),
}


def double(value: Any) -> Any:
    """``value``'s floating-point tensors (nested in tuples, lists and dicts) in float64."""
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: double(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(double(v) for v in value)
    return value


def loss(module: TaskModule, outputs: Any, targets: Any) -> torch.Tensor:
    if isinstance(module, ClassificationModule):
        return F.cross_entropy(outputs, targets)
    return module.model.loss(outputs, targets)["loss"]


@pytest.mark.parametrize("task", TASKS)
def test_compiled_model_gives_the_eager_loss_gradients_and_validation_outputs(task: str) -> None:
    module, batch = TASKS[task]()
    module.configure_model()
    model = module.model
    assert model._compiled_call_impl is not None  # compiled in place: calling the model runs the compiled forward
    model.double()
    perturb_(model)  # every parameter off its initialisation (zero-initialised box heads and biases included)
    batch = {key: double(value) for key, value in batch.items()}

    def training_step(compiled: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(1)  # DINO's denoising queries are drawn at random: the same on both sides
        model.zero_grad(set_to_none=True)
        forward = model if compiled else model.forward  # forward(): the eager, uncompiled function
        value = loss(module, forward(*batch["train_inputs"]), batch["targets"])
        value.backward()
        return value.detach(), [p.grad for p in model.parameters()]

    model.train()
    eager_loss, eager_grads = training_step(compiled=False)
    compiled_loss, compiled_grads = training_step(compiled=True)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-10, atol=1e-12)
    assert [g is None for g in compiled_grads] == [g is None for g in eager_grads]
    largest = max(g.abs().max().item() for g in eager_grads if g is not None)
    for compiled_grad, eager_grad in zip(compiled_grads, eager_grads):
        if eager_grad is not None:
            # Of each parameter's largest gradient (at least 1e-3 of the model's: a bias before a
            # BatchNorm has a gradient of zero plus rounding).
            scale = max(eager_grad.abs().max().item(), 1e-3 * largest)
            torch.testing.assert_close(compiled_grad, eager_grad, rtol=0, atol=1e-9 * scale)

    model.eval()
    with torch.no_grad():
        eager, compiled = tensors(model.forward(*batch["inputs"])), tensors(model(*batch["inputs"]))
    assert len(compiled) == len(eager)
    for compiled_output, eager_output in zip(compiled, eager):
        torch.testing.assert_close(compiled_output, eager_output, rtol=1e-10, atol=1e-10)


def test_compile_option_must_be_a_flag_or_torch_compile_arguments() -> None:
    with pytest.raises(ValueError, match="lightning.task: compile must be"):
        ClassificationModule("swin_t", NUM_CLASSES, compile="inductor")
