"""vision_tx's ``Conv2d`` against ``nn.Conv2d`` on the 1x1 and the 7x7 depthwise convolutions of the main job's
training step.

The maps are those of ``rtdetr_convnext_toy`` at a 192x256 batch of 8: for the 1x1 convolutions the hybrid encoder's
projections and fusion blocks at strides 8, 16 and 32 (channels-first, 64 to 256 channels in, 64 out) and the small
ConvNeXt's stage entries (channels-last, 32 to 128 in); for the depthwise ones the ConvNeXt blocks' 7x7 convolutions
(with bias, channels-last, strides 4 to 32). Each call runs every shape once with a weight and input of its own;
rows: forward + backward (the gradients of input, weight and bias, from a fixed output gradient) and forward only
(the 1x1 form; the depthwise form's forward is ``nn.Conv2d``'s), float32.
"""

from __future__ import annotations

from collections.abc import Callable

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


# (channels, height, width) of the ConvNeXt blocks' 7x7 depthwise convolutions, channels-last
DEPTHWISE_SHAPES = [(32, 64, 48), (64, 32, 24), (128, 16, 12), (256, 8, 6)]


def layers(
    cls: type[nn.Conv2d], device: str, depthwise: bool = False
) -> list[tuple[nn.Conv2d, torch.Tensor, torch.Tensor]]:
    """Per shape one convolution, its input and its output's gradient (in the input's memory format, as a network's
    next layer hands it back), seeded alike for ``cls``: the 1x1 ones without bias (a BatchNorm follows each), or
    (``depthwise``) the 7x7 depthwise ones with bias."""
    generator = torch.Generator().manual_seed(0)
    out = []
    shapes = [(c, c, h, w, True) for c, h, w in DEPTHWISE_SHAPES] if depthwise else SHAPES
    for in_channels, out_channels, height, width, channels_last in shapes:
        if depthwise:
            conv = cls(in_channels, out_channels, 7, padding=3, groups=in_channels)
        else:
            conv = cls(in_channels, out_channels, 1, bias=False)
        with torch.no_grad():
            for parameter in conv.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
        x = torch.randn(BATCH, in_channels, height, width, generator=generator)
        grad = torch.randn(BATCH, out_channels, height, width, generator=generator)
        if channels_last:
            x, grad = (t.contiguous(memory_format=torch.channels_last) for t in (x, grad))
        out.append((conv.to(device), x.to(device).requires_grad_(), grad.to(device)))
    return out


def run(device: str, quick: bool) -> list[Row]:
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

    def row(label: str, ours: Callable[[], None], reference: Callable[[], None]) -> Row:
        iters = 5 if quick else 20
        return compare(label, ours, reference, "nn.Conv2d", device, unit_items=BATCH, warmup=2, iters=iters)

    pointwise = f"1x1 convolutions of the main job's step, batch {BATCH}, {len(SHAPES)} shapes"
    depthwise = f"7x7 depthwise convolutions of the main job's step, batch {BATCH}, {len(DEPTHWISE_SHAPES)} shapes"
    ours, reference = layers(Conv2d, device), layers(nn.Conv2d, device)
    return [
        row(f"{pointwise}, forward+backward", forward_backward(ours), forward_backward(reference)),
        row(f"{pointwise}, forward", forward(ours), forward(reference)),
        row(
            f"{depthwise}, forward+backward",
            forward_backward(layers(Conv2d, device, depthwise=True)),
            forward_backward(layers(nn.Conv2d, device, depthwise=True)),
        ),
    ]
