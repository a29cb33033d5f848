"""vision_tx ``ms_deform_attn`` against transformers' pure-PyTorch ``MultiScaleDeformableAttention``
on a deformable encoder layer's work: batch 2, the four levels of a 512x640 image at strides 8-64
(64x80, 32x40, 16x20, 8x10) as both queries and values, 8 heads of 32, 4 points per level.

Locations are laid out as an encoder's: each query's reference point (its own pixel centre, the same
on every level) plus Deformable DETR's initial offsets (point ``p`` of head ``h`` ``p + 1`` pixels
along direction ``h``) and unit Gaussian noise, in pixels of each level. Rows: forward + backward
(gradients of value, locations and weights) and forward only, fp32.
"""

from __future__ import annotations

import math

import torch

from benchmarks.timing import Row, compare
from vision_tx.ops import ms_deform_attn

SHAPES = [(64, 80), (32, 40), (16, 20), (8, 10)]
BATCH, HEADS, HEAD_DIM, POINTS = 2, 8, 32, 4


def encoder_inputs(device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """value ``[B, S, heads, head_dim]``, sampling_locations ``[B, S, heads, L, P, 2]``,
    attention_weights ``[B, S, heads, L, P]``."""
    generator = torch.Generator().manual_seed(seed)
    levels = len(SHAPES)
    centres = []
    for h, w in SHAPES:
        ys, xs = torch.meshgrid((torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w, indexing="ij")
        centres.append(torch.stack([xs, ys], -1).reshape(-1, 2))
    reference_points = torch.cat(centres)  # [S, 2]
    tokens = reference_points.shape[0]
    angle = torch.arange(HEADS) * (2 * math.pi / HEADS)
    offsets = torch.stack([angle.cos(), angle.sin()], -1)[:, None, None] * torch.arange(1, POINTS + 1).view(1, 1, -1, 1)
    offsets = offsets + torch.randn(BATCH, tokens, HEADS, levels, POINTS, 2, generator=generator)  # pixels
    level_sizes = torch.tensor([[w, h] for h, w in SHAPES], dtype=torch.float32)[:, None]  # [L, 1, 2]
    locations = reference_points[None, :, None, None, None] + offsets / level_sizes
    value = torch.randn(BATCH, tokens, HEADS, HEAD_DIM, generator=generator)
    weights = torch.randn(BATCH, tokens, HEADS, levels * POINTS, generator=generator).softmax(-1)
    return value.to(device), locations.to(device), weights.view(BATCH, tokens, HEADS, levels, POINTS).to(device)


def run(device: str, quick: bool) -> list[Row]:
    from transformers.models.deformable_detr.modeling_deformable_detr import MultiScaleDeformableAttention

    iters = 2 if quick else 4  # per process
    inputs = encoder_inputs(device)
    grad_inputs = [x.clone().requires_grad_() for x in inputs]
    shapes_tensor = torch.tensor(SHAPES, device=device)
    level_starts = torch.cat([shapes_tensor.new_zeros(1), shapes_tensor.prod(1).cumsum(0)[:-1]])
    transformers_op = MultiScaleDeformableAttention()

    def reference(value, locations, weights):
        return transformers_op(value, shapes_tensor, SHAPES, level_starts, locations, weights, im2col_step=64)

    def ours(value, locations, weights):
        return ms_deform_attn(value, SHAPES, locations, weights)

    def forward(fn):
        def call():
            with torch.no_grad():
                fn(*inputs)

        return call

    def forward_backward(fn):
        def call():
            fn(*grad_inputs).sum().backward()

        return call

    name = f"ms_deform_attn encoder b{BATCH} 512x640 s8-64 {HEADS}x{HEAD_DIM} p{POINTS}"
    return [
        compare(
            f"{name} {label}",
            make(ours),
            make(reference),
            "transformers",
            device,
            unit_items=BATCH,
            warmup=1,
            iters=iters,
        )
        for label, make in (("forward+backward", forward_backward), ("forward", forward))
    ]
