"""vision_tx's ``Conv2d`` against ``nn.Conv2d`` on the 1x1 convolutions of the main job's training step.

The maps are those of ``rtdetr_convnext_toy`` at a 192x256 batch of 8: the hybrid encoder's projections and
fusion blocks at strides 8, 16 and 32 (channels-first, 64 to 256 channels in, 64 out) and the small ConvNeXt's
stage entries (channels-last, 32 to 128 in). Each call runs every shape once with a weight and input of its own;
rows: forward + backward (the gradients of input and weight, from a fixed output gradient) and forward only, float32.
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.timing import Row, compare
from vision_tx.ops.conv import Conv2d

BATCH = 8
# (in channels, out channels, height, width, channels-last)
SHAPES = [
    (64, 64, 32, 24, False),
    (128, 64, 32, 24, False),
    (64, 64, 16, 12, False),
    (128, 64, 16, 12, False),
    (256, 64, 8, 6, False),
    (32, 64, 32, 24, True),
    (64, 128, 16, 12, True),
    (128, 256, 8, 6, True),
]


def layers(cls: type[nn.Conv2d], device: str) -> list[tuple[nn.Conv2d, torch.Tensor, torch.Tensor]]:
    """One 1x1 convolution without bias (a BatchNorm follows each), its input and its output's gradient (in the
    input's memory format, as a network's next layer hands it back) per shape, seeded alike for ``cls``."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for in_channels, out_channels, height, width, channels_last in SHAPES:
        conv = cls(in_channels, out_channels, 1, bias=False)
        with torch.no_grad():
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator))
        x = torch.randn(BATCH, in_channels, height, width, generator=generator)
        grad = torch.randn(BATCH, out_channels, height, width, generator=generator)
        if channels_last:
            x, grad = (t.contiguous(memory_format=torch.channels_last) for t in (x, grad))
        out.append((conv.to(device), x.to(device).requires_grad_(), grad.to(device)))
    return out


def run(device: str, quick: bool) -> list[Row]:
    ours, reference = layers(Conv2d, device), layers(nn.Conv2d, device)

    def forward_backward(pairs):
        def call():
            for conv, x, grad in pairs:
                conv(x).backward(grad)

        return call

    def forward(pairs):
        def call():
            with torch.no_grad():
                for conv, x, _ in pairs:
                    conv(x)

        return call

    return [
        compare(
            f"1x1 convolutions of the main job's step, batch {BATCH}, {len(SHAPES)} shapes, {label}",
            make(ours),
            make(reference),
            "nn.Conv2d",
            device,
            unit_items=BATCH,
            warmup=2,
            iters=5 if quick else 20,
        )
        for label, make in (("forward+backward", forward_backward), ("forward", forward))
    ]
